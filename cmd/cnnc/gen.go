package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/token"
	"io"
	"io/fs"
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
	var outDir, pkg, target string
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
package imports github.com/cnnc/cnnc/runtime/trainer, runtime/data and a
CPU backend (no command line, progress bar or plotting), so your go.mod
requires github.com/cnnc/cnnc. It never links gorgonia.org/cu without
-tags cuda; go build compiles its kernels into the program (cgo: a C++
compiler when building, none when running).

--target picks the kernels, as cnnc build's: cpu (the default) generates
them for the CPU (vectorised, AVX2+FMA where the CPU has it, on every
core; runtime/native); emu writes the CUDA C and runs it on cnnc's CUDA
emulator (slow); cuda writes the CUDA C for the emulator too and also
compiles it with nvcc (sm_80 and sm_90, with PTX) into kernels.fatbin with
cuda.go, which only builds with -tags cuda: a program built so trains on
the GPU (NAME.Options{Device: "auto"} or "cuda"), its steps replayed as a
CUDA graph, and exits at start on a machine without an NVIDIA GPU
(gorgonia.org/cu's initialisation); built without the tag, the same
package runs on the emulator. auto is cuda where nvcc is installed, else
cpu. As with cnnc build, --target cpu refuses a model with a layer the
CPU target has no kernels for yet, and the default then warns and writes
the emulator's package. --cuda is --target cuda.`,
		Example: "  cnnc gen examples/mnist.cnn -o mnistnet -pkg mnistnet --batch 32\n  cnnc gen examples/simplecnn.cnn -o simplecnn --target cuda",
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
			chosen := cmd.Flags().Changed("target") && target == "cpu" // not the default
			if withCUDA {
				if cmd.Flags().Changed("target") && target != "cuda" {
					fmt.Fprintf(stderr, "cnnc gen: --cuda is --target cuda, not --target %s\n", target)
					return exitError{exitUsage}
				}
				target = "cuda"
			}
			target, err := buildTarget("gen", target, stderr)
			if err != nil {
				return err
			}
			res, err := loadModel(args[0], &f, stdout, stderr)
			if err != nil {
				return err
			}
			if target == "cpu" {
				b := &builder{path: args[0], stdout: stdout, stderr: stderr}
				if target, err = b.cpuOrEmulator(res, chosen); err != nil {
					return err
				}
			}
			c, err := driver.Compile(res, driver.Budget(res, res.Train.MemoryBudget, ""), driver.Target(target))
			if err != nil {
				return backendError(args[0], res, err, stderr)
			}
			files, err := driver.PackageFiles(c, driver.Target(target), pkg)
			if err != nil {
				fmt.Fprintf(stderr, "cnnc gen --target %s: %s\n", target, dsl.Printable(err.Error()))
				return exitError{exitModel}
			}
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
				return exitError{exitModel}
			}
			if err := removeStale(outDir, files); err != nil {
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
			fmt.Fprint(stdout, dsl.Printable(fmt.Sprintf("wrote package %s in %s (%v): model %s, batch %d, arena %s B (%s), target %s", pkg, outDir, names, res.Graph.Name, c.Spec.Batch,
				compiler.Commas(c.Spec.ArenaBytes), units.FormatBytes(c.Spec.ArenaBytes), target))+"\n")
			return nil
		},
	}
	cmd.Flags().StringVarP(&outDir, "output", "o", "", "the package `DIR` to write (created)")
	cmd.Flags().StringVar(&pkg, "pkg", "", "the package `NAME` (default: the directory's name)")
	f.registerBatch(cmd, "the batch size (default: the train block's, else 32)")
	cmd.Flags().StringVar(&target, "target", "cpu", "the `TARGET` the package's kernels are for: cpu, cuda (the emulator, and the GPU with -tags cuda; needs nvcc), emu, or auto (cuda when nvcc is present)")
	cmd.Flags().BoolVar(&withCUDA, "cuda", false, "the same as --target cuda")
	return cmd
}

// removeStale removes from dir the files an earlier cnnc gen for another
// target wrote there (trainergen.PackageFileNames) that files does not
// have: go build would compile both targets' kernels. A file is removed
// only when it says cnnc generated it (the fatbin: when cuda.go does).
func removeStale(dir string, files map[string][]byte) error {
	generated := func(name string) bool {
		b := make([]byte, 256)
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return false
		}
		defer f.Close()
		n, _ := io.ReadFull(f, b)
		return bytes.HasPrefix(b[:n], []byte("// Code generated by cnnc"))
	}
	var stale []string // decided before removing any: the fatbin's by cuda.go
	for _, name := range trainergen.PackageFileNames() {
		ours := generated(name)
		if name == "kernels.fatbin" {
			ours = generated("cuda.go")
		}
		if _, keep := files[name]; !keep && ours {
			stale = append(stale, name)
		}
	}
	for _, name := range stale {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
