package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/units"
)

func newBuildCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	var bf buildFlags
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
when nvcc is present. The CPU target generates every op; should it lack
kernels for a layer (an op added before its CPU kernels), --target cpu
refuses the model at the layer, and the default (cpu, or auto without
nvcc) warns and builds for the emulator.

The build works in any directory: the trainer module carries a copy of
cnnc's runtime and needs only the Go module proxy (or the module cache).

--emit-cuda DIR also writes the generated kernels to DIR/NAME.cu, which
nvcc compiles as it is; without -o, build only writes them.

--infer builds an inference-only binary instead of a trainer: the forward
kernels alone (each batch norm after a conv folded into the conv's weight
and bias when a checkpoint is loaded, conv+bias+activation+pool fused, no
argmax, gradients or optimizer state) on their own memory plan (cnnc plan
--infer shows it), for --batch images at a time. Its one command is the
trainer's predict: BINARY predict --checkpoint CK [--top K] [--json]
IMAGE_OR_DIR..., with the trainer's checkpoints.`,
		Example: "  cnnc build examples/mnist.cnn -o mnist-trainer\n  cnnc build examples/simplecnn.cnn -o simplecnn --batch 16 --memory-budget 40MB\n  cnnc build --emit-cuda out examples/simplecnn.cnn\n  cnnc build --infer --batch 8 examples/vgg_small.cnn -o vgg-infer",
		Args:    exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBuild(cmd, args[0], &f, &bf, stdout, stderr)
		},
	}
	cmd.Flags().StringVarP(&bf.output, "output", "o", "", "the trainer `BINARY` to build")
	cmd.Flags().StringVar(&bf.target, "target", "cpu", "the `TARGET` the trainer runs on: cpu, cuda, emu, or auto (cuda when nvcc is present)")
	cmd.Flags().StringVar(&bf.emitCUDA, "emit-cuda", "", "also write the generated CUDA C to `DIR`/NAME.cu (DIR is created)")
	cmd.Flags().StringVar(&bf.workDir, "work", "", "build the trainer module in this `DIR` and keep it (default: a temporary one)")
	cmd.Flags().StringVar(&bf.budget, "memory-budget", "", "memory budget, a `SIZE` such as 40MB or 64MiB (or none), overriding the train block's")
	cmd.Flags().StringVar(&bf.gpu, "gpu", "", "CUDA target: size the kernels' launches for this `GPU` ("+strings.Join(perf.GPUNames(), ", ")+") and, under a memory budget, build the plan the performance model predicts fastest of those that meet it (what cnnc plan --gpu reports; needs nvcc and g++)")
	cmd.Flags().IntVar(&bf.gpus, "gpus", 1, "build a data-parallel trainer of `N` ranks (the plan of one rank: its share batch/N of every batch; the trainer launches them, one per GPU, summing gradients with NCCL)")
	cmd.Flags().BoolVar(&bf.dataParallel, "data-parallel", false, "with --gpus 1: build the data-parallel trainer of one rank all the same (gradient buckets summed by NCCL, split updates), to measure what the NCCL path costs on one GPU")
	cmd.Flags().StringVar(&bf.interconnect, "interconnect", "", "with --gpu and --gpus N: the `LINK` between a machine's GPUs (nvlink, pcie or ib) that the choice of plan and the predicted step assume: a rank's plans are judged by their step with the all-reduces (default: NVLink where the GPU has it, else PCIe)")
	cmd.Flags().IntVar(&bf.nnodes, "nnodes", 1, "with --gpu and --gpus N: the `M` machines the ranks span (InfiniBand between them), for the choice of plan and the predicted step")
	cmd.Flags().BoolVar(&bf.shardOpt, "shard-optimizer", false, "with --gpus: each rank keeps the optimizer state of its share of the parameters only (ZeRO stage 1), updates them and broadcasts them to the others")
	cmd.Flags().BoolVar(&bf.minMemory, "min-memory", false, "with --gpu: build the planner's minimal-memory plan (updates split out of their weight-gradient kernels wherever that saves bytes), not a fused-update plan the performance model predicts faster within the budget (without --gpu the plan is always the minimal-memory one)")
	f.registerBatch(cmd, "the batch size the kernels and memory plan are specialised for (default: the train block's, else 32)")
	f.registerInfer(cmd, "build an inference-only binary: forward kernels only (batch norm folded into the conv before it, conv+bias+activation+pool fused, no argmax, gradients or optimizer state) on its own memory plan (cnnc plan --infer), with the trainer's predict command, loading the trainer's checkpoints")
	return cmd
}

// buildFlags are cnnc build's own flags.
type buildFlags struct {
	emitCUDA, output, target, workDir, budget string
	gpu                                       string // perf's GPU: launch geometry and the fastest plan
	gpus                                      int    // data-parallel ranks (plan.Config.Ranks)
	shardOpt, dataParallel                    bool
	minMemory                                 bool   // --min-memory: plan.UpdatesMinMemory
	interconnect                              string // with --gpu and --gpus: the links the choice assumes
	nnodes                                    int    // with --gpu and --gpus: the machines the ranks span
}

// builder is one run of cnnc build: the model file, where it reports,
// and the clock its steps are timed by.
type builder struct {
	path           string
	stdout, stderr io.Writer
	start          time.Time
}

// step reports a finished step with the seconds since the build started.
func (b *builder) step(format string, a ...any) {
	fmt.Fprintf(b.stdout, "[%6.2fs] %s\n", time.Since(b.start).Seconds(), dsl.Printable(fmt.Sprintf(format, a...)))
}

// fail prints err as cnnc's error and ends the build with exit status 1.
func (b *builder) fail(err error) error {
	fmt.Fprintf(b.stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
	return exitError{exitModel}
}

// runBuild is cnnc build FILE: check, plan, generate, then write the
// kernels (--emit-cuda) and/or build the trainer (-o).
func runBuild(cmd *cobra.Command, path string, f *compileFlags, bf *buildFlags, stdout, stderr io.Writer) error {
	if bf.output == "" && bf.emitCUDA == "" {
		fmt.Fprintf(stderr, "cnnc build: say what to build: -o BINARY (a trainer) and/or --emit-cuda DIR (the kernels)\nusage: %s\n", cmd.UseLine())
		return exitError{exitUsage}
	}
	chosen := cmd.Flags().Changed("target") && bf.target == "cpu" // not the default
	target, err := buildTarget("build", bf.target, stderr)
	if err != nil {
		return err
	}
	b := &builder{path: path, stdout: stdout, stderr: stderr, start: time.Now()}
	res, err := loadModel(path, f, stdout, stderr)
	if err != nil {
		return err
	}
	if f.infer {
		return b.buildInfer(res, target, chosen, bf)
	}
	b.step("checked %s: %s, %s, %s parameters", path, res.Graph.Name, res.Train.BatchWords(), compiler.Commas(res.Graph.ParamCount()))
	cfg, err := buildBudget(res, bf.budget, stderr)
	if err != nil {
		return err
	}
	if bf.gpus < 1 || bf.gpus > plan.MaxRanks {
		fmt.Fprintf(stderr, "cnnc build: --gpus %d: want between 1 and %d ranks\n", bf.gpus, plan.MaxRanks)
		return exitError{exitUsage}
	}
	if bf.gpus > 1 || bf.dataParallel {
		cfg.Ranks, cfg.ShardOptimizer, cfg.DataParallel = bf.gpus, bf.shardOpt, bf.dataParallel
	}
	if bf.minMemory {
		cfg.Updates = plan.UpdatesMinMemory
	}
	if bf.shardOpt && bf.gpus < 2 {
		fmt.Fprintf(stderr, "cnnc build: --shard-optimizer shares the optimizer state among data-parallel ranks: it needs --gpus 2 or more\n")
		return exitError{exitUsage}
	}
	if err := checkFabricFlags(bf); err != nil {
		fmt.Fprintf(stderr, "cnnc build: %v\n", err)
		return exitError{exitUsage}
	}
	if target == "cpu" && bf.output == "" {
		target = "cuda" // only --emit-cuda: the CUDA C is all it writes
	}
	if target == "cpu" {
		if target, err = b.cpuOrEmulator(res, chosen); err != nil {
			return err
		}
	}
	c, err := b.compile(res, cfg, target, bf)
	if err != nil {
		return err
	}
	b.step("planned memory: arena %s B (%s, %s)", compiler.Commas(c.Spec.ArenaBytes), units.FormatBytes(c.Spec.ArenaBytes), c.Plan.Choices.Strategy)
	b.step("generated %d kernels, %d launches per training step", len(c.Train.Kernels), len(c.Train.Launches))
	if bf.emitCUDA != "" {
		if err := b.emitCUDA(res, cfg, c, target, bf.emitCUDA); err != nil {
			return err
		}
	}
	if bf.output == "" {
		return nil
	}
	return b.buildTrainer(c, target, bf)
}

// compile plans and generates res's training step for target; with a
// GPU named, the kernels' launches are sized for it and, of the plans that
// meet the budget (driver.Alternatives), the one the performance model
// predicts fastest is built — the plan cnnc plan --gpu shows.
func (b *builder) compile(res *compiler.Result, cfg plan.Config, target string, bf *buildFlags) (*trainergen.Compiled, error) {
	gpuName := bf.gpu
	if gpuName == "" {
		c, err := driver.Compile(res, cfg, driver.Target(target))
		if err != nil {
			return nil, backendError(b.path, res, err, b.stderr)
		}
		return c, nil
	}
	gpu, err := perf.LookupGPU(gpuName)
	if err != nil {
		fmt.Fprintf(b.stderr, "cnnc build: --gpu: %v\n", err)
		return nil, exitError{exitUsage}
	}
	if target != "cuda" {
		fmt.Fprintf(b.stderr, "cnnc build: --gpu %s chooses among CUDA plans: it needs --target cuda (or auto with nvcc), or --emit-cuda alone\n", gpuName)
		return nil, exitError{exitUsage}
	}
	var fabric *perf.Fabric // a rank's plans are judged with their collectives
	if cfg.Ranks > 1 {
		f, err := perf.LookupFabric(gpuName, bf.interconnect, cfg.Ranks, bf.nnodes)
		if err != nil {
			fmt.Fprintf(b.stderr, "cnnc build: --gpus %d --interconnect %q --nnodes %d: %v\n", cfg.Ranks, bf.interconnect, bf.nnodes, err)
			return nil, exitError{exitUsage}
		}
		fabric = &f
	}
	res.Train.SMs, res.Train.Arch = int64(gpu.SMs), gpu.Arch
	alts, unbudgeted, err := driver.Alternatives(res, cfg, driver.CUDA)
	if err != nil {
		return nil, backendError(b.path, res, err, b.stderr)
	}
	ch, err := perf.Fastest(alts, unbudgeted, gpu, fabric)
	if err != nil {
		return nil, b.fail(err)
	}
	b.step("predicted on %s: %s, %.1f µs a step, the fastest of %d plans that meet the budget (a prediction; cnnc plan --gpu %s shows them)",
		gpu.Name, ch.Best.Plan.Choices.Strategy, 1e6*ch.Prediction.PredictedStepSeconds, len(alts), gpuName)
	if pp := ch.Parallel; pp != nil {
		what := "all-reduces overlapped with the backward pass"
		if pp.Shard != nil {
			what += fmt.Sprintf(", the rank's share of the updates, then %d parameter broadcasts (%.1f µs)", pp.Shard.Broadcasts, 1e6*pp.Shard.Broadcast.Seconds)
		}
		links := ""
		if bf.interconnect != "" {
			links += " --interconnect " + bf.interconnect
		}
		if bf.nnodes != 1 {
			links += fmt.Sprintf(" --nnodes %d", bf.nnodes)
		}
		b.step("predicted data-parallel step on %s: %.1f µs with its %s (a prediction; cnnc plan --gpu %s --gpus %d%s shows it)",
			pp.Fabric.Describe(), 1e6*pp.PredictedStepSeconds, what, gpuName, cfg.Ranks, links)
	}
	return ch.Best, nil
}

// checkFabricFlags checks --interconnect and --nnodes: they describe a
// data-parallel job's links, for the performance model's choice.
func checkFabricFlags(bf *buildFlags) error {
	switch {
	case (bf.interconnect != "" || bf.nnodes != 1) && (bf.gpu == "" || bf.gpus < 2):
		return fmt.Errorf("--interconnect and --nnodes describe the all-reduce's links for the performance model: they need --gpu and --gpus N")
	case bf.nnodes < 1 || bf.nnodes > plan.MaxRanks:
		return fmt.Errorf("--nnodes %d: want between 1 and %d machines", bf.nnodes, plan.MaxRanks)
	case bf.gpus%bf.nnodes != 0:
		return fmt.Errorf("--gpus %d: the GPUs do not split evenly over --nnodes %d machines", bf.gpus, bf.nnodes)
	}
	switch bf.interconnect {
	case "", "nvlink", "pcie", "ib":
		return nil
	}
	return fmt.Errorf("--interconnect %q: want nvlink, pcie or ib", bf.interconnect)
}

// buildInfer is cnnc build --infer: the inference compilation's forward
// kernels on its own plan, built into a binary whose one command is the
// trainer's predict.
func (b *builder) buildInfer(res *compiler.Result, target string, chosen bool, bf *buildFlags) error {
	if bf.output == "" || bf.emitCUDA != "" || bf.budget != "" || bf.gpu != "" {
		fmt.Fprintf(b.stderr, "cnnc build --infer: give -o BINARY (no --emit-cuda, --memory-budget or --gpu: the inference plan is the forward pass at --batch)\n")
		return exitError{exitUsage}
	}
	if bf.gpus != 1 || bf.dataParallel || bf.shardOpt {
		// an inference binary predicts on one device: nothing to sum
		fmt.Fprintf(b.stderr, "cnnc build --infer: --gpus, --data-parallel and --shard-optimizer are for trainers (data-parallel training); an inference binary runs on one device\n")
		return exitError{exitUsage}
	}
	b.step("checked %s for inference: %s, batch %d, %s parameters", b.path, res.Graph.Name, res.Train.Batch, compiler.Commas(res.Graph.ParamCount()))
	if target == "cpu" {
		var err error
		if target, err = b.cpuOrEmulator(res, chosen); err != nil {
			return err
		}
	}
	c, err := driver.CompileInfer(res, plan.Config{}, driver.Target(target))
	if err != nil {
		return backendError(b.path, res, err, b.stderr)
	}
	b.step("planned inference memory: arena %s B (%s)", compiler.Commas(c.Spec.ArenaBytes), units.FormatBytes(c.Spec.ArenaBytes))
	b.step("generated %d kernels, %d launches per batch", len(c.Eval.Kernels), len(c.Eval.Launches))
	return b.buildTrainer(c, target, bf)
}

// buildTarget resolves cnnc command's --target: auto is cuda where nvcc is
// installed, else cpu.
func buildTarget(command, target string, stderr io.Writer) (string, error) {
	switch target {
	case "cpu", "cuda", "emu":
	case "auto":
		target = "cpu"
		if _, err := nvcc.Path(); err == nil {
			target = "cuda"
		}
	default:
		fmt.Fprintf(stderr, "cnnc %s: --target %s: want cpu, cuda, emu or auto\n", command, target)
		return "", exitError{exitUsage}
	}
	return target, nil
}

// buildBudget is the planner's budget: --memory-budget (a size, or none)
// over the train block's memory_budget.
func buildBudget(res *compiler.Result, budget string, stderr io.Writer) (plan.Config, error) {
	if budget == "" {
		return driver.Budget(res, res.Train.MemoryBudget, ""), nil
	}
	var bytes int64
	if budget != "none" {
		var err error
		if bytes, err = dsl.ParseSize(budget); err != nil || bytes <= 0 {
			fmt.Fprintf(stderr, "cnnc build: --memory-budget %q: want a size such as 40MB or 64MiB, or none\n", budget)
			return plan.Config{}, exitError{exitUsage}
		}
	}
	return driver.Budget(res, bytes, "--memory-budget"), nil
}

// cpuOrEmulator checks that the CPU target generates every layer of res:
// a model with a layer it cannot generate is an error when --target cpu
// was asked for (chosen), else it builds for the emulator, with a warning.
func (b *builder) cpuOrEmulator(res *compiler.Result, chosen bool) (string, error) {
	d := cpuRefusal(res, !chosen)
	if d == nil {
		return "cpu", nil
	}
	src, _ := dsl.ReadFile(b.path)
	d.Span(identLen(src, d.Pos.Offset))
	if chosen {
		d.Hint("build with --target emu (cnnc's CUDA kernels on its CPU emulator, slower) or --target cuda")
		printDiagnostics(b.stderr, dsl.Diagnostics{d}, map[string][]byte{b.path: src})
		return "", exitError{exitModel}
	}
	d.Hint("building for the CUDA emulator instead (--target emu: slower than the CPU target)")
	printDiagnostics(b.stderr, dsl.Diagnostics{d}, map[string][]byte{b.path: src})
	return "emu", nil
}

// emitCUDA writes the CUDA C of the model (c's kernels, or for the CPU
// target another target's, on the same plan) to dir/NAME.cu.
func (b *builder) emitCUDA(res *compiler.Result, cfg plan.Config, c *trainergen.Compiled, target, dir string) error {
	cudaC := c.Kernels
	if target == "cpu" {
		cu, err := driver.Compile(res, cfg, driver.CUDA)
		if err != nil {
			return backendError(b.path, res, err, b.stderr)
		}
		cudaC = cu.Kernels
	}
	name := strings.TrimSuffix(filepath.Base(b.path), filepath.Ext(b.path)) + ".cu"
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return b.fail(err)
	}
	if err := os.WriteFile(path, cudaC, 0o644); err != nil {
		return b.fail(err)
	}
	b.step("wrote %s", path)
	return nil
}

// buildTrainer writes the trainer module (in --work DIR, else a temporary
// directory) and builds the binary -o names.
func (b *builder) buildTrainer(c *trainergen.Compiled, target string, bf *buildFlags) error {
	dir := bf.workDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "cnnc-build-*"); err != nil {
			return b.fail(err)
		}
		defer os.RemoveAll(dir)
	}
	log := func(s string) { b.step("%s", s) }
	if err := driver.Build(c, driver.Target(target), driver.BuildOptions{Dir: dir, Output: bf.output, Log: log}); err != nil {
		if errors.Is(err, driver.ErrNoGo) {
			fmt.Fprintf(b.stderr, "cnnc build: %s\n", err)
			return exitError{exitModel}
		}
		return b.fail(err)
	}
	b.step("built %s (target %s); run it with -h for its flags", bf.output, target)
	if target == "cuda" {
		fmt.Fprintf(b.stdout, "note: a cuda trainer links gorgonia.org/cu and exits at start on a machine without a GPU\n")
	}
	return nil
}
