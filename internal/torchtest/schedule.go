package torchtest

import (
	"path/filepath"
	"runtime"
	"testing"

	"github.com/cnnc/cnnc/runtime/schedule"
)

// ScheduleRun is a run whose learning rates PyTorch computes: a schedule,
// the base rate, steps per epoch and epochs.
type ScheduleRun struct {
	Name     string
	Schedule schedule.Schedule
	Base     float64
	PerEpoch int
	Epochs   int
}

// ScheduleLRs returns, per run, the rate of every optimizer step that
// torch.optim.lr_scheduler gives (scripts/torch_lr_schedule.py), in
// PyTorch's usual use (see the script).
func ScheduleLRs(t testing.TB, runs []ScheduleRun) (lrs map[string][]float64, version string) {
	t.Helper()
	var cases []map[string]any
	for _, r := range runs {
		s := r.Schedule
		c := map[string]any{"name": r.Name, "kind": s.Kind.String(), "base": r.Base, "per_epoch": r.PerEpoch, "epochs": r.Epochs,
			"warmup": s.Warmup, "every": s.Every, "gamma": s.Gamma, "milestones": s.Milestones, "eta_min": s.EtaMin, "t_max": s.TMax}
		if s.Kind == schedule.OneCycle {
			pct, div, finalDiv := s.PctStart, s.DivFactor, s.FinalDivFactor
			if pct == 0 {
				pct = schedule.DefaultPctStart
			}
			if div == 0 {
				div = schedule.DefaultDivFactor
			}
			if finalDiv == 0 {
				finalDiv = schedule.DefaultFinalDivFactor
			}
			c["pct_start"], c["div_factor"], c["final_div_factor"] = pct, div, finalDiv
			if s.LinearAnneal {
				c["anneal_strategy"] = "linear"
			}
		}
		cases = append(cases, c)
	}
	var out struct {
		Torch string
		LRs   map[string][]float64
	}
	Run(t, Script("torch_lr_schedule.py"), map[string]any{"cases": cases}, &out)
	return out.LRs, out.Torch
}

// Script is the path of scripts/NAME in this repository.
func Script(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", name)
}
