package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/plan/timeline"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/units"
)

// planFlags are the plan command's own flags (compileFlags add --batch,
// --dump-after and --disable).
type planFlags struct {
	budget     string
	plot       string
	json       bool
	maxBatch   bool
	microBatch int64
	trunk      string
	gpu        string
	precision  string
	gpus       int
	shardOpt   bool
	// with --gpu: the data-parallel step's interconnect, machines, and the
	// scaling table's GPU counts
	interconnect string
	nnodes       int
	scaling      string
	// --min-memory: the planner's minimal-memory plan even with --gpu
	minMemory bool
}

func newPlanCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	var pf planFlags
	cmd := &cobra.Command{
		Use:   "plan FILE",
		Short: "plan the training step's memory before running it: peak, what is live there, recomputation, micro-batching",
		Long: `plan compiles FILE and plans every buffer of one training step in one
arena, at fixed offsets: the arena's size is the peak, exactly, and it is
what the generated trainer allocates — once. The report shows the peak and
what is live at it, bytes by category (parameters, optimizer state,
gradients, saved activations, argmax bits, transient, workspace, input),
every kernel with the bytes live during it, and every buffer with its
offset and the DSL line it comes from.

With a memory budget (the train block's memory_budget, or --memory-budget)
the plan recomputes activations in the backward pass (fewest extra FLOPs)
and, if that is not enough, runs the activation-heavy trunk (or the whole
step) in micro-batches with gradient accumulation — the same update as the
full batch. A budget no plan meets is an error naming the smallest budget
that works. --max-batch answers the other question: the largest batch that
fits the budget, without recomputation, with it, and with micro-batching.

Without --gpu the plan is the minimal-memory one: each optimizer update is
split out of its weight-gradient kernel wherever that saves bytes. With
--gpu and a budget the performance model chooses: among the plans within
the budget (split or fused updates x recomputation x micro-batching) the
fastest predicted, ties to the smaller peak; the minimal-memory plan's peak
is shown beside it, and --min-memory keeps it.`,
		Example: `  cnnc plan examples/simplecnn.cnn
  cnnc plan --memory-budget 40MB --plot timeline.svg examples/simplecnn.cnn
  cnnc plan examples/simplecnn.cnn --batch 256 --json
  cnnc plan --max-batch --memory-budget 40MB examples/simplecnn.cnn
  cnnc plan --gpu h200 --batch 256 examples/simplecnn.cnn
  cnnc plan --gpus 8 --batch 256 examples/simplecnn.cnn
  cnnc plan --gpu h200 --gpus 8 --batch 256 examples/simplecnn.cnn
  cnnc plan --gpu h200 --scaling 1,2,4,8 examples/resnet18.cnn`,
		Args: exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runPlan(args[0], &f, &pf, stdout, stderr)
		},
	}
	f.register(cmd)
	f.registerInfer(cmd, "plan inference instead of a training step (what cnnc build --infer runs): the forward pass alone, batch norm folded into the convs, no saved activations, argmax, gradients or optimizer state")
	fl := cmd.Flags()
	fl.StringVar(&pf.budget, "memory-budget", "", "device memory the step may use, a `SIZE` such as 40MB or 64MiB (overrides the train block's memory_budget; \"none\" ignores it)")
	fl.StringVar(&pf.plot, "plot", "", "also draw the memory timeline into this `FILE` (.svg, .png or .pdf)")
	fl.BoolVar(&pf.json, "json", false, "print the plan (or with --max-batch, the answer) as JSON; the peak is peak_bytes")
	fl.BoolVar(&pf.maxBatch, "max-batch", false, "find the largest batch within the budget, without recomputation, with it, and with micro-batching")
	fl.Int64Var(&pf.microBatch, "micro-batch", 0, "skip the search: run in micro-batches of `N` samples (the whole step, or the trunk up to --trunk)")
	fl.StringVar(&pf.trunk, "trunk", "", "with --micro-batch: the last `LAYER` of the micro-batched trunk")
	fl.StringVar(&pf.precision, "precision", "", "with --gpu: the kernels' `PRECISION`, fp32, tf32 or bf16 (overrides the train block's precision)")
	fl.IntVar(&pf.gpus, "gpus", 1, "plan one rank of data-parallel training on `N` GPUs: each takes 1/N of every batch; gradient buckets, split updates and NCCL's buffers (an estimate) are shown")
	fl.BoolVar(&pf.shardOpt, "shard-optimizer", false, "with --gpus (or --scaling): also show the rank's peak with only its share of the optimizer state (ZeRO stage 1, as cnnc build --shard-optimizer builds it) and, with --gpu, predict the sharded step: the rank's share of the updates, then the parameter broadcasts")
	fl.StringVar(&pf.interconnect, "interconnect", "", "with --gpu and --gpus or --scaling: the `LINK` between a machine's GPUs for the all-reduce: nvlink, pcie or ib (default: NVLink where the GPU has it, else PCIe)")
	fl.IntVar(&pf.nnodes, "nnodes", 1, "with --gpu and --gpus or --scaling: the GPUs are spread evenly over `M` machines, joined by InfiniBand NDR (400 Gb/s per GPU)")
	fl.StringVar(&pf.scaling, "scaling", "", "with --gpu: predict the data-parallel step, throughput and scaling efficiency for each GPU count of `LIST` (e.g. 1,2,4,8), the batch per GPU fixed at --batch")
	fl.BoolVar(&pf.minMemory, "min-memory", false, "with --gpu: keep the planner's minimal-memory plan (updates split out of their weight-gradient kernels wherever that saves bytes) instead of choosing, among the plans within the budget, the one the model predicts fastest (without --gpu the plan is always the minimal-memory one)")
	fl.StringVar(&pf.gpu, "gpu", "", "predict every launch's time and the step's on this `GPU` ("+strings.Join(perf.GPUNames(), ", ")+"): the kernels' grids sized for its SM count: a prediction of the performance model (needs nvcc and g++); under a memory budget, the fastest of the plans that meet it")
	return cmd
}

func runPlan(path string, f *compileFlags, pf *planFlags, stdout, stderr io.Writer) error {
	usage := func(format string, args ...any) error {
		fmt.Fprintf(stderr, "cnnc: "+format+"\n", args...)
		return exitError{exitUsage}
	}
	if pf.plot != "" {
		switch strings.ToLower(filepath.Ext(pf.plot)) {
		case ".svg", ".png", ".pdf":
		default:
			return usage("--plot %s: the file must end in .svg, .png or .pdf", pf.plot)
		}
	}
	if pf.plot != "" && pf.maxBatch {
		return usage("--plot draws one plan's memory timeline; --max-batch compares several: give one of them")
	}
	if pf.trunk != "" && pf.microBatch == 0 {
		return usage("--trunk needs --micro-batch")
	}
	if pf.precision != "" && pf.gpu == "" {
		return usage("--precision needs --gpu")
	}
	if pf.microBatch < 0 {
		return usage("--micro-batch %d: a micro-batch must be at least 1 sample", pf.microBatch)
	}
	if pf.gpus < 1 || pf.gpus > plan.MaxRanks {
		return usage("--gpus %d: want between 1 and %d GPUs", pf.gpus, plan.MaxRanks)
	}
	if pf.shardOpt && pf.gpus < 2 && pf.scaling == "" {
		return usage("--shard-optimizer shares the optimizer state among data-parallel GPUs: it needs --gpus 2 or more (or --scaling)")
	}
	if pf.gpus > 1 && (f.infer || pf.maxBatch) {
		return usage("--gpus plans one rank of data-parallel training: not with --infer or --max-batch")
	}
	if err := checkScalingFlags(pf); err != nil {
		return usage("%v", err)
	}
	res, err := loadModel(path, f, stdout, stderr)
	if err != nil {
		return err
	}
	if f.dumpAfter != "" {
		return nil
	}
	if n := int64(pf.gpus); res.Train.Batch%n != 0 {
		return usage("--gpus %d: the batch %d does not split evenly over %d GPUs (each takes an equal share; a batch of %d does)", pf.gpus, res.Train.Batch, pf.gpus, (res.Train.Batch/n+1)*n)
	}
	if res.Train.Accumulate > 1 && (pf.microBatch > 0 || pf.maxBatch) {
		flag := "--micro-batch"
		if pf.maxBatch {
			flag = "--max-batch"
		}
		return usage("%s: the train block's accumulate = %d (%s) fixes the micro-batch at the batch; remove accumulate to use %s", flag, res.Train.Accumulate, res.Train.Pos["accumulate"], flag)
	}
	cfg := plan.Config{Budget: res.Train.MemoryBudget, BudgetPos: res.Train.Pos["memory_budget"],
		MicroBatch: pf.microBatch, Trunk: pf.trunk, Ranks: pf.gpus, ShardOptimizer: pf.shardOpt}
	if pf.minMemory {
		cfg.Updates = plan.UpdatesMinMemory
	}
	switch pf.budget {
	case "":
	case "none":
		cfg.Budget, cfg.BudgetPos = 0, dsl.Pos{}
	default:
		n, err := dsl.ParseSize(pf.budget)
		if err != nil || n <= 0 {
			return usage("--memory-budget %q: want a size such as 40MB or 64MiB, or none", pf.budget)
		}
		cfg.Budget, cfg.BudgetPos, cfg.BudgetSource = n, dsl.Pos{}, "--memory-budget"
	}
	if f.infer {
		if pf.maxBatch || pf.microBatch > 0 || pf.gpu != "" || pf.budget != "" {
			return usage("--infer plans the forward pass at --batch alone: no --max-batch, --micro-batch, --memory-budget or --gpu")
		}
		cfg = plan.Config{}
	}
	if pf.maxBatch {
		return runMaxBatch(res, cfg, pf, stdout, stderr)
	}
	if pf.gpu != "" {
		return runGPUPrediction(path, res, cfg, pf, stdout, stderr)
	}
	p, err := driver.Plan(res, cfg, driver.CUDA)
	if err != nil {
		return planError(path, err, stderr)
	}
	if p.Clip != nil {
		p.Clip.UnclippedPeakBytes = unclippedPeak(res, cfg)
	}
	if dp := p.DataParallel; dp != nil {
		dp.OneDevicePeakBytes = oneDevicePeak(res, cfg)
	}
	if pf.plot != "" {
		if err := timeline.Write(p, pf.plot); err != nil {
			fmt.Fprintf(stderr, "cnnc: --plot: %s\n", dsl.Printable(err.Error()))
			return exitError{exitModel}
		}
	}
	if pf.json {
		return writeJSON(stdout, p)
	}
	from := cfg.BudgetSource
	if cfg.BudgetPos.IsValid() {
		from = "memory_budget at " + cfg.BudgetPos.String()
	}
	p.WriteReport(stdout, plan.ReportOptions{Optimizer: res.Train.Optimizer.String(), Plot: pf.plot, BudgetFrom: from})
	return nil
}

// planError prints a budget no plan meets at the memory_budget line (or
// as a plain message when the budget came from the command line).
func planError(path string, err error, stderr io.Writer) error {
	var be *plan.BudgetError
	if errors.As(err, &be) {
		d := be.Diagnostic()
		if d.Pos.IsValid() {
			src, _ := dsl.ReadFile(path)
			d.Span(tokenLen(src, d.Pos.Offset))
			printDiagnostics(stderr, dsl.Diagnostics{d}, map[string][]byte{path: src})
		} else {
			fmt.Fprintf(stderr, "cnnc: %s\n", d.Message)
			for _, h := range d.Hints {
				fmt.Fprintf(stderr, "    %s\n", h)
			}
		}
		return exitError{exitModel}
	}
	fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
	return exitError{exitModel}
}

// tokenLen is the length of the token at offset (the budget's size, to
// underline it whole).
func tokenLen(src []byte, offset int) int {
	n := 0
	for offset+n < len(src) && !strings.ContainsRune(" \t\r\n#;,)", rune(src[offset+n])) {
		n++
	}
	return max(n, 1)
}

func runMaxBatch(res *compiler.Result, cfg plan.Config, pf *planFlags, stdout, stderr io.Writer) error {
	if cfg.Budget <= 0 {
		fmt.Fprintf(stderr, "cnnc: --max-batch needs a budget: --memory-budget SIZE or memory_budget in the train block\n")
		return exitError{exitUsage}
	}
	if pf.microBatch > 0 {
		fmt.Fprintf(stderr, "cnnc: --max-batch chooses micro-batches itself; drop --micro-batch\n")
		return exitError{exitUsage}
	}
	m, err := driver.MaxBatch(res, cfg.Budget, driver.CUDA)
	if err != nil {
		fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
		return exitError{exitModel}
	}
	if pf.json {
		return writeJSON(stdout, m)
	}
	fmt.Fprintf(stdout, "largest batch of %s within %s (%s B):\n", res.Graph.Name, units.FormatBytes(cfg.Budget), compiler.Commas(cfg.Budget))
	for _, e := range []struct {
		what string
		e    plan.MaxBatchEntry
	}{
		{"without recomputation", m.Plain},
		{"with recomputation", m.Recompute},
		{"with micro-batching", m.MicroBatch},
	} {
		if e.e.Batch == 0 {
			fmt.Fprintf(stdout, "  %-24s none: not even one sample fits\n", e.what)
			continue
		}
		more := ""
		if e.e.Batch >= m.Limit {
			more = " (the most this model allows)"
		}
		fmt.Fprintf(stdout, "  %-24s %9s%s   peak %s   %s\n", e.what, compiler.Commas(e.e.Batch), more, units.FormatBytes(e.e.PeakBytes), e.e.How)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

// unclippedPeak is the peak of res's model planned as if its train block
// had no clip_grad_norm (what clipping costs in memory), or 0 when that
// plan fails (the report then leaves the comparison out).
func unclippedPeak(res *compiler.Result, cfg plan.Config) int64 {
	plain, err := compiler.Compile(res.File, compiler.Options{Batch: res.Train.Batch, NoClip: true})
	if err != nil {
		return 0
	}
	p, err := driver.Plan(plain, cfg, driver.CUDA)
	if err != nil {
		return 0
	}
	return p.PeakBytes
}

// oneDevicePeak is the peak of res's model planned on one device at one
// rank's share of the batch (what data parallelism adds to it), or 0 when
// that plan fails (the report then leaves the comparison out).
func oneDevicePeak(res *compiler.Result, cfg plan.Config) int64 {
	one := *res
	one.Train.Batch /= int64(cfg.Ranks)
	cfg.Ranks, cfg.ShardOptimizer = 0, false
	p, err := driver.Plan(&one, cfg, driver.CUDA)
	if err != nil {
		return 0
	}
	return p.PeakBytes
}
