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

	alts, unbudgeted, err := driver.Alternatives(res, cfg, driver.CUDA)
	if err != nil {
		return planError(path, err, stderr)
	}
	ch, err := perf.Fastest(alts, unbudgeted, gpu)
	if err != nil {
		fmt.Fprintf(stderr, "cnnc: %v\n", err)
		return exitError{exitModel}
	}
	comp, p := ch.Best, ch.Prediction
	if pf.json {
		out := struct {
			*perf.Prediction
			PeakBytes int64  `json:"peak_bytes"`
			Strategy  string `json:"strategy"`
			*perf.Choice
		}{Prediction: p, PeakBytes: comp.Plan.ArenaBytes, Strategy: comp.Plan.Choices.Strategy}
		if unbudgeted != nil {
			out.Choice = ch
		}
		return writeJSON(stdout, out)
	}
	if unbudgeted != nil {
		ch.WriteChoice(stdout, gpu.Name, cfg.Budget)
	}
	fmt.Fprintf(stdout, "plan: peak %.2f MB (%d bytes), %s\n\n", float64(comp.Plan.ArenaBytes)/1e6, comp.Plan.ArenaBytes, comp.Plan.Choices.Strategy)
	p.WriteTable(stdout)
	writeClipTime(stdout, comp.Plan, p)
	return nil
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
