package main

import (
	"fmt"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/codegen/trainergen"
)

func newGenCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	var outDir, pkg string
	var withCUDA bool
	cmd := &cobra.Command{
		Use:   "gen FILE -o DIR -pkg NAME",
		Short: "write a Go package that trains the model, for go generate",
		Long: `gen compiles FILE and writes a Go package into DIR: the kernels, the memory
plan and a typed API —

    m, err := NAME.New(NAME.Options{Seed: 1})
    loss, correct, err := m.TrainStep(NAME.Batch{Pixels: px, Labels: labels, Valid: n})
    loss, correct, err = m.Evaluate(batch)
    err = m.Save("model.safetensors")   // PyTorch's state_dict names
    err = m.Load("model.safetensors")

Put "//go:generate cnnc gen model.cnn -o NAME -pkg NAME" in your project. The
package imports github.com/cnnc/cnnc/runtime/..., so your go.mod requires
github.com/cnnc/cnnc. It runs on the CPU emulator and never links
gorgonia.org/cu; go build compiles its kernels into the program (cgo:
a C++ compiler when building, none when running).

--cuda also compiles the kernels with nvcc (sm_80 and sm_90, with PTX) into
kernels.fatbin and writes cuda.go, which only builds with -tags cuda: a
program built so trains on the GPU (NAME.Options{Device: "auto"} or
"cuda"), its steps replayed as a CUDA graph, and exits at start on a
machine without an NVIDIA GPU (gorgonia.org/cu's initialisation); built
without the tag, the same package runs on the CPU.`,
		Example: "  cnnc gen examples/mnist.cnn -o mnistnet -pkg mnistnet --batch 32\n  cnnc gen examples/simplecnn.cnn -o simplecnn --cuda",
		Args:    exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			if outDir == "" {
				fmt.Fprintf(stderr, "cnnc gen: -o DIR is required\nusage: %s\n", cmd.UseLine())
				return exitError{exitUsage}
			}
			if pkg == "" {
				pkg = filepath.Base(outDir)
			}
			if !token.IsIdentifier(pkg) || token.IsKeyword(pkg) {
				fmt.Fprintf(stderr, "cnnc gen: -pkg %q is not a Go package name\n", pkg)
				return exitError{exitUsage}
			}
			res, err := loadModel(args[0], &f, stdout, stderr)
			if err != nil {
				return err
			}
			c, err := trainergen.Compile(res, res.Train.MemoryBudget, "")
			if err != nil {
				fmt.Fprintf(stderr, "cnnc: %s: %v\n", args[0], err)
				return exitError{exitModel}
			}
			var fatbin []byte
			if withCUDA {
				if fatbin, err = trainergen.CompileFatbinFor(c.Spec, c.Kernels); err != nil {
					fmt.Fprintf(stderr, "cnnc gen --cuda: %v\n", err)
					return exitError{exitModel}
				}
			}
			files, err := trainergen.PackageFiles(pkg, c.Spec, c.Kernels, fatbin)
			if err != nil {
				fmt.Fprintf(stderr, "cnnc: %v\n", err)
				return exitError{exitModel}
			}
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				fmt.Fprintf(stderr, "cnnc: %v\n", err)
				return exitError{exitModel}
			}
			var names []string
			for name := range files {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				if err := os.WriteFile(filepath.Join(outDir, name), files[name], 0o644); err != nil {
					fmt.Fprintf(stderr, "cnnc: %v\n", err)
					return exitError{exitModel}
				}
			}
			fmt.Fprintf(stdout, "wrote package %s in %s (%v): model %s, batch %d, arena %d bytes\n", pkg, outDir, names, res.Graph.Name, c.Spec.Batch, c.Spec.ArenaBytes)
			return nil
		},
	}
	cmd.Flags().StringVarP(&outDir, "output", "o", "", "the package directory to write (created)")
	cmd.Flags().StringVar(&pkg, "pkg", "", "the package name (default: the directory's name)")
	cmd.Flags().Int64Var(&f.batch, "batch", 0, "batch size (default: the train block's, else 32)")
	cmd.Flags().BoolVar(&withCUDA, "cuda", false, "also compile the kernels for NVIDIA GPUs (needs nvcc): the package trains on the GPU when built with -tags cuda")
	return cmd
}
