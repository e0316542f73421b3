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
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/units"
)

func newGenCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	var outDir, pkg string
	var withCUDA bool
	cmd := &cobra.Command{
		Use:   "gen FILE -o DIR -pkg NAME",
		Short: "write a Go package that trains the model, for go generate",
		Long: `gen compiles FILE and writes a Go package into DIR: the kernels, the memory
plan and New, which returns a runtime/trainer Model —

    m, err := NAME.New(NAME.Options{Seed: 1, OnStep: func(s NAME.StepMetrics) { ... }})
    err = m.Train(ctx, dataset)          // epochs of a data.Dataset; ctx cancels
    loss, correct, err := m.Step(NAME.Batch{Pixels: px, Labels: labels, Valid: n})
    ev, err := m.Evaluate(ctx, testset)  // mean loss and accuracy
    top, err := m.Predict(pixels, 3)     // the 3 most probable classes per image
    err = m.Save(w); err = m.Load(r)     // safetensors, PyTorch's state_dict names

Put "//go:generate cnnc gen model.cnn -o NAME -pkg NAME" in your project. The
package imports github.com/cnnc/cnnc/runtime/trainer, runtime/data and the
CPU backend (no command line, progress bar or plotting), so your go.mod
requires github.com/cnnc/cnnc. It runs on the CPU emulator and never links
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
			c, err := driver.Compile(res, driver.Budget(res, res.Train.MemoryBudget, ""), driver.CUDA)
			if err != nil {
				return backendError(args[0], res, err, stderr)
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
				fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
				return exitError{exitModel}
			}
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
				return exitError{exitModel}
			}
			var names []string
			for name := range files {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				if err := os.WriteFile(filepath.Join(outDir, name), files[name], 0o644); err != nil {
					fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
					return exitError{exitModel}
				}
			}
			fmt.Fprint(stdout, dsl.Printable(fmt.Sprintf("wrote package %s in %s (%v): model %s, batch %d, arena %s B (%s)", pkg, outDir, names, res.Graph.Name, c.Spec.Batch,
				compiler.Commas(c.Spec.ArenaBytes), units.FormatBytes(c.Spec.ArenaBytes)))+"\n")
			return nil
		},
	}
	cmd.Flags().StringVarP(&outDir, "output", "o", "", "the package `DIR` to write (created)")
	cmd.Flags().StringVar(&pkg, "pkg", "", "the package `NAME` (default: the directory's name)")
	f.registerBatch(cmd, "the batch size (default: the train block's, else 32)")
	cmd.Flags().BoolVar(&withCUDA, "cuda", false, "also compile the kernels for NVIDIA GPUs (needs nvcc): the package trains on the GPU when built with -tags cuda")
	return cmd
}
