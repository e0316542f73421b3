package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
)

// runGPUPrediction is `cnnc plan --gpu NAME`: the plan's training step,
// launch by launch, predicted by the performance model (compiler/perf).
// Under a memory budget the model chooses the plan: every distinct plan
// that meets the budget (driver.Alternatives) is predicted and the fastest
// is shown, after a list of those considered and what the budget costs
// against the plan without it.
func runGPUPrediction(path string, res *compiler.Result, cfg plan.Config, pf *planFlags, stdout, stderr io.Writer) error {
	gpu, err := perf.LookupGPU(pf.gpu)
	if err != nil {
		fmt.Fprintf(stderr, "cnnc: --gpu: %v\n", err)
		return exitError{exitUsage}
	}
	if pf.precision != "" {
		prec, err := codegen.ParsePrecision(pf.precision)
		if err != nil {
			fmt.Fprintf(stderr, "cnnc: --precision: %v\n", err)
			return exitError{exitUsage}
		}
		res.Train.Precision = string(prec)
	}
	res.Train.SMs = int64(gpu.SMs) // launch geometry sized for the GPU predicted
	res.Train.Arch = gpu.Arch
	// the links must exist before anything is predicted
	if cfg.Ranks > 1 || pf.scaling != "" {
		if _, err := perf.LookupFabric(pf.gpu, pf.interconnect, pf.nnodes, pf.nnodes); err != nil {
			fmt.Fprintf(stderr, "cnnc: --interconnect: %v\n", err)
			return exitError{exitUsage}
		}
	}
	if pf.scaling != "" {
		return runScaling(path, res, cfg, pf, gpu, stdout, stderr)
	}
	var fabric *perf.Fabric // a rank's plans are judged with their collectives
	if cfg.Ranks > 1 {
		f, err := perf.LookupFabric(pf.gpu, pf.interconnect, cfg.Ranks, pf.nnodes)
		if err != nil {
			fmt.Fprintf(stderr, "cnnc: --gpus %d --nnodes %d: %v\n", cfg.Ranks, pf.nnodes, err)
			return exitError{exitUsage}
		}
		fabric = &f
	}
	ch, budgeted, err := fastestPlan(path, res, cfg, gpu, fabric, stderr)
	if err != nil {
		return err
	}
	var pp *perf.ParallelPrediction
	if cfg.Ranks > 1 {
		if pp, err = parallelPrediction(path, res, cfg, gpu, ch, stderr); err != nil {
			return err
		}
	}
	comp, p := ch.Best, ch.Prediction
	if pf.json {
		out := struct {
			*perf.Prediction
			PeakBytes int64  `json:"peak_bytes"`
			Strategy  string `json:"strategy"`
			*perf.Choice
			// the step; with --gpus the rank's with its all-reduces (the
			// launches' own sum is then data_parallel.compute_seconds)
			Step         float64                  `json:"predicted_step_seconds"`
			DataParallel *perf.ParallelPrediction `json:"data_parallel,omitempty"`
		}{Prediction: p, PeakBytes: comp.Plan.ArenaBytes, Strategy: comp.Plan.Choices.Strategy, Step: p.PredictedStepSeconds, DataParallel: pp}
		if budgeted {
			out.Choice = ch
		}
		if pp != nil {
			out.Step = pp.PredictedStepSeconds
		}
		return writeJSON(stdout, out)
	}
	if budgeted {
		ch.WriteChoice(stdout, gpu.Name, cfg.Budget)
	}
	fmt.Fprintf(stdout, "plan: peak %.2f MB (%d bytes), %s\n\n", float64(comp.Plan.ArenaBytes)/1e6, comp.Plan.ArenaBytes, comp.Plan.Choices.Strategy)
	p.WriteTable(stdout)
	writeClipTime(stdout, comp.Plan, p)
	if pp != nil {
		pp.WriteParallel(stdout)
	}
	return nil
}

// fastestPlan compiles the plans that meet cfg's budget and chooses the
// fastest on gpu (a data-parallel rank's with its collectives on fabric,
// when not nil); budgeted says whether there was a budget to choose for.
func fastestPlan(path string, res *compiler.Result, cfg plan.Config, gpu perf.GPU, fabric *perf.Fabric, stderr io.Writer) (*perf.Choice, bool, error) {
	alts, unbudgeted, err := driver.Alternatives(res, cfg, driver.CUDA)
	if err != nil {
		return nil, false, planError(path, err, stderr)
	}
	ch, err := perf.Fastest(alts, unbudgeted, gpu, fabric)
	if err != nil {
		fmt.Fprintf(stderr, "cnnc: %v\n", err)
		return nil, false, exitError{exitModel}
	}
	return ch, unbudgeted != nil, nil
}

// writeClipTime says, with clip_grad_norm, what the prediction gives the
// clipping's own kernels (the norm's, and the separate updates that read
// its coefficient: codegen names them clip_norm_* and *_clip).
func writeClipTime(w io.Writer, pl *plan.Plan, p *perf.Prediction) {
	if pl.Clip == nil {
		return
	}
	var norm, updates float64
	var nNorm, nUpdates int
	for _, l := range p.Launches {
		switch {
		case strings.HasPrefix(l.Kernel, "clip_norm_"):
			norm += l.Seconds
			nNorm++
		case strings.HasSuffix(l.Kernel, "_clip"):
			updates += l.Seconds
			nUpdates++
		}
	}
	fmt.Fprintf(w, "\nclip_grad_norm = %g (predicted): the norm's %d launches %.1f µs, the %d separate updates reading its coefficient %.1f µs: %.1f%% of the step\n",
		pl.Clip.MaxNorm, nNorm, 1e6*norm, nUpdates, 1e6*updates, 100*(norm+updates)/p.PredictedStepSeconds)
}
