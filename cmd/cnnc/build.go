package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/units"
)

func newBuildCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	var emitCUDA, output, target, workDir, budget string
	cmd := &cobra.Command{
		Use:   "build FILE -o BINARY",
		Short: "build a standalone trainer binary (or write the CUDA kernels with --emit-cuda)",
		Long: `build compiles FILE — shapes, backward pass, fusion, the memory plan,
kernels — and builds a standalone trainer binary with go build. The trainer
allocates exactly the planned arena once, takes its defaults from the
model's train and data blocks, and explains its flags with -h.

--target cpu builds kernels generated for the CPU (vectorised, AVX2+FMA
where the CPU has it, on every core) into the binary; --target emu runs the
generated CUDA C on cnnc's CUDA emulator instead (slow: for checking the
CUDA kernels in a whole trainer); --target cuda embeds a fatbin built by
nvcc for sm_80 and sm_90 (with PTX) and links gorgonia.org/cu — such a
binary exits at start on a machine without a GPU; --target auto picks cuda
when nvcc is present. The CPU target has no kernels yet for some ops
(grouped or dilated convolutions, label smoothing): --target cpu refuses
such a model at the layer, and the default (cpu, or auto without nvcc)
then warns and builds for the emulator.

The build works in any directory: the trainer module carries a copy of
cnnc's runtime and needs only the Go module proxy (or the module cache).

--emit-cuda DIR also writes the generated kernels to DIR/NAME.cu, which
nvcc compiles as it is; without -o, build only writes them.`,
		Example: "  cnnc build examples/mnist.cnn -o mnist-trainer\n  cnnc build examples/simplecnn.cnn -o simplecnn --batch 16 --memory-budget 40MB\n  cnnc build --emit-cuda out examples/simplecnn.cnn",
		Args:    exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output == "" && emitCUDA == "" {
				fmt.Fprintf(stderr, "cnnc build: say what to build: -o BINARY (a trainer) and/or --emit-cuda DIR (the kernels)\nusage: %s\n", cmd.UseLine())
				return exitError{exitUsage}
			}
			chosen := cmd.Flags().Changed("target") && target == "cpu" // not the default
			switch target {
			case "cpu", "cuda", "emu":
			case "auto":
				target = "cpu"
				if _, err := nvcc.Path(); err == nil {
					target = "cuda"
				}
			default:
				fmt.Fprintf(stderr, "cnnc build: --target %s: want cpu, cuda, emu or auto\n", target)
				return exitError{exitUsage}
			}
			start := time.Now()
			step := func(format string, a ...any) {
				fmt.Fprintf(stdout, "[%6.2fs] %s\n", time.Since(start).Seconds(), dsl.Printable(fmt.Sprintf(format, a...)))
			}
			res, err := loadModel(args[0], &f, stdout, stderr)
			if err != nil {
				return err
			}
			step("checked %s: %s, batch %d, %s parameters", args[0], res.Graph.Name, res.Train.Batch, compiler.Commas(res.Graph.ParamCount()))
			budgetBytes, source := res.Train.MemoryBudget, ""
			if budget != "" {
				if budget == "none" {
					budgetBytes = 0
				} else if budgetBytes, err = dsl.ParseSize(budget); err != nil || budgetBytes <= 0 {
					fmt.Fprintf(stderr, "cnnc build: --memory-budget %q: want a size such as 40MB or 64MiB, or none\n", budget)
					return exitError{exitUsage}
				}
				source = "--memory-budget"
			}
			if target == "cpu" && output == "" {
				target = "cuda" // only --emit-cuda: the CUDA C is all it writes
			}
			if target == "cpu" {
				// a model with a layer the CPU target cannot generate: an
				// error when --target cpu was asked for, else the emulator
				if d := cpuRefusal(res, !chosen); d != nil {
					src, _ := dsl.ReadFile(args[0])
					d.Span(identLen(src, d.Pos.Offset))
					if chosen {
						d.Hint("build with --target emu (cnnc's CUDA kernels on its CPU emulator, slower) or --target cuda")
						printDiagnostics(stderr, dsl.Diagnostics{d}, map[string][]byte{args[0]: src})
						return exitError{exitModel}
					}
					d.Hint("building for the CUDA emulator instead (--target emu: slower than the CPU target)")
					printDiagnostics(stderr, dsl.Diagnostics{d}, map[string][]byte{args[0]: src})
					target = "emu"
				}
			}
			compile := trainergen.Compile
			if target == "cpu" {
				compile = trainergen.CompileCPU
			}
			c, err := compile(res, budgetBytes, source)
			if err != nil {
				return backendError(args[0], res, err, stderr)
			}
			step("planned memory: arena %s B (%s, %s)", compiler.Commas(c.Spec.ArenaBytes), units.FormatBytes(c.Spec.ArenaBytes), c.Plan.Choices.Strategy)
			step("generated %d kernels, %d launches per training step", len(c.Train.Kernels), len(c.Train.Launches))
			cudaC := c.Kernels
			if emitCUDA != "" && target == "cpu" {
				// the CUDA C is another target's kernels, on the same plan
				cu, err := trainergen.Compile(res, budgetBytes, source)
				if err != nil {
					return backendError(args[0], res, err, stderr)
				}
				cudaC = cu.Kernels
			}
			if emitCUDA != "" {
				name := strings.TrimSuffix(filepath.Base(args[0]), filepath.Ext(args[0])) + ".cu"
				path := filepath.Join(emitCUDA, name)
				if err := os.MkdirAll(emitCUDA, 0o755); err != nil {
					fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
					return exitError{exitModel}
				}
				if err := os.WriteFile(path, cudaC, 0o644); err != nil {
					fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
					return exitError{exitModel}
				}
				step("wrote %s", path)
			}
			if output == "" {
				return nil
			}
			dir := workDir
			if dir == "" {
				if dir, err = os.MkdirTemp("", "cnnc-build-*"); err != nil {
					fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
					return exitError{exitModel}
				}
				defer os.RemoveAll(dir)
			}
			var tags []string
			if target == "cuda" {
				fatbin, err := trainergen.CompileFatbinFor(c.Spec, c.Kernels)
				if err != nil {
					fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
					return exitError{exitModel}
				}
				step("nvcc: %s fatbin for sm_80 and sm_90 (with PTX); ptxas: all %d launches fit an A100's and an H100's blocks (registers, shared memory)",
					units.FormatBytes(int64(len(fatbin))), len(c.Spec.Train.Launches)+len(c.Spec.Eval.Launches))
				if err := trainergen.WriteModuleCUDA(dir, c.Spec, c.Kernels, fatbin); err != nil {
					fmt.Fprintf(stderr, "cnnc: writing the trainer module: %v\n", err)
					return exitError{exitModel}
				}
				tags = trainergen.CUDATags
			} else {
				write := trainergen.WriteModule
				if target == "cpu" {
					write = trainergen.WriteModuleCPU
				}
				if err := write(dir, c.Spec, c.Kernels); err != nil {
					fmt.Fprintf(stderr, "cnnc: writing the trainer module: %v\n", err)
					return exitError{exitModel}
				}
			}
			step("wrote the trainer module in %s", dir)
			if _, err := exec.LookPath("go"); err != nil {
				fmt.Fprintf(stderr, "cnnc build: building a trainer needs the Go toolchain on PATH\n")
				return exitError{exitModel}
			}
			if err := trainergen.GoBuild(dir, output, tags, func(s string) { step("%s", s) }); err != nil {
				fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
				return exitError{exitModel}
			}
			step("built %s (target %s); run it with -h for its flags", output, target)
			if target == "cuda" {
				fmt.Fprintf(stdout, "note: a cuda trainer links gorgonia.org/cu and exits at start on a machine without a GPU\n")
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "the trainer `BINARY` to build")
	cmd.Flags().StringVar(&target, "target", "cpu", "the `TARGET` the trainer runs on: cpu, cuda, emu, or auto (cuda when nvcc is present)")
	cmd.Flags().StringVar(&emitCUDA, "emit-cuda", "", "also write the generated CUDA C to `DIR`/NAME.cu (DIR is created)")
	cmd.Flags().StringVar(&workDir, "work", "", "build the trainer module in this `DIR` and keep it (default: a temporary one)")
	cmd.Flags().StringVar(&budget, "memory-budget", "", "memory budget, a `SIZE` such as 40MB or 64MiB (or none), overriding the train block's")
	f.registerBatch(cmd, "the batch size the kernels and memory plan are specialised for (default: the train block's, else 32)")
	return cmd
}
