package compiler

// The train block's learning-rate schedule: `schedule = step(every=30)`,
// multistep(...), cosine(...) or onecycle(...), and `warmup = N` steps,
// read into a schedule.Schedule (runtime/schedule computes the rates, in
// the trainers too).

import (
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/schedule"
)

// scheduleArgs are each schedule's keyword arguments.
var scheduleArgs = map[string][]argSpec{
	"step": {
		{Name: "every", Kind: ops.ArgInt, Required: true, Min: 1, Doc: "epochs between decays, StepLR's step_size"},
		{Name: "gamma", Kind: ops.ArgFloat, Min: 0, Doc: "factor applied every `every` epochs (default 0.1)"},
	},
	"multistep": {
		{Name: "milestones", Kind: ops.ArgCustom, Required: true, Doc: "increasing epochs at which the rate is multiplied by gamma, e.g. [30, 60]"},
		{Name: "gamma", Kind: ops.ArgFloat, Min: 0, Doc: "factor applied at each milestone (default 0.1)"},
	},
	"cosine": {
		{Name: "eta_min", Kind: ops.ArgFloat, Min: 0, Doc: "the lowest rate (default 0)"},
		{Name: "t_max", Kind: ops.ArgInt, Min: 1, Doc: "epochs from the base rate down to eta_min (default: the run's epochs)"},
	},
	"onecycle": {
		{Name: "max_lr", Kind: ops.ArgFloat, Required: true, Min: 0, Doc: "the peak rate, reached after pct_start of the steps; the run's base rate (--lr)"},
		{Name: "pct_start", Kind: ops.ArgFloat, Min: 0, Max: 1, Doc: "fraction of the steps spent rising (default 0.3)"},
		{Name: "div_factor", Kind: ops.ArgFloat, Min: 0, Doc: "the first rate is max_lr/div_factor (default 25)"},
		{Name: "final_div_factor", Kind: ops.ArgFloat, Min: 0, Doc: "the last rate is max_lr/div_factor/final_div_factor (default 1e4)"},
		{Name: "anneal_strategy", Kind: ops.ArgString, Doc: `"cos" (default) or "linear"`},
		{Name: "cycle_momentum", Kind: ops.ArgBool, Doc: "false: momentum stays the optimizer's"},
	},
}

var scheduleNames = []string{"step", "multistep", "cosine", "onecycle"}

// parseSchedule reads `schedule = ...` and `warmup = N` (either may be
// nil) into s; for onecycle, maxLR is its max_lr (the run's base rate).
func parseSchedule(e, warmup *dsl.Expr, diags *dsl.Diagnostics) (s schedule.Schedule, maxLR float64) {
	if warmup != nil {
		s.Warmup = int(warmup.Int)
	}
	if e == nil {
		return s, 0
	}
	if e.Kind != dsl.ExprCall {
		*diags = append(*diags, dsl.Errorf(e.Pos, "schedule must be a call such as cosine() or step(every=30), got %s", describe(e)).Span(exprSpan(e)))
		return s, 0
	}
	c := e.Call
	specs, ok := scheduleArgs[c.Name]
	if !ok {
		d := dsl.Errorf(c.Pos, "unknown schedule %s", c.Name).Span(len(c.Name))
		if sg := suggest(c.Name, scheduleNames); sg != "" {
			d.Hint("did you mean %s?", sg)
		} else {
			d.Hint("schedules: step, multistep, cosine, onecycle")
		}
		*diags = append(*diags, d)
		return s, 0
	}
	if p := c.Positional(); len(p) > 0 {
		*diags = append(*diags, dsl.Errorf(p[0].Pos, "%s takes keyword arguments only (%s=...)", c.Name, specs[0].Name))
		return s, 0
	}
	before := len(*diags)
	a := checkArgs(c.Name, c, specs, diags)
	if len(*diags) > before {
		return s, 0
	}
	positive := func(key string) bool {
		if v := a[key]; v != nil && ops.Number(v) <= 0 {
			*diags = append(*diags, dsl.Errorf(v.Pos, "%s: %s must be above 0, got %s", c.Name, key, v.Text).Span(exprSpan(v)))
			return false
		}
		return true
	}
	switch c.Name {
	case "step":
		s.Kind, s.Every, s.Gamma = schedule.Step, int(a.Int("every", 1)), a.Float("gamma", 0.1)
	case "multistep":
		s.Kind, s.Gamma = schedule.MultiStep, a.Float("gamma", 0.1)
		s.Milestones = milestones(c.Name, a["milestones"], diags)
	case "cosine":
		s.Kind, s.EtaMin, s.TMax = schedule.Cosine, a.Float("eta_min", 0), int(a.Int("t_max", 0))
	case "onecycle":
		if !positive("max_lr") || !positive("pct_start") || !positive("div_factor") || !positive("final_div_factor") {
			return s, 0
		}
		s.Kind = schedule.OneCycle
		s.PctStart = a.Float("pct_start", schedule.DefaultPctStart)
		s.DivFactor = a.Float("div_factor", schedule.DefaultDivFactor)
		s.FinalDivFactor = a.Float("final_div_factor", schedule.DefaultFinalDivFactor)
		if v := a["anneal_strategy"]; v != nil {
			switch v.String {
			case "cos":
			case "linear":
				s.LinearAnneal = true
			default:
				*diags = append(*diags, dsl.Errorf(v.Pos, "onecycle: anneal_strategy must be \"cos\" or \"linear\", got %q", v.String).Span(exprSpan(v)))
			}
		}
		if v := a["cycle_momentum"]; v != nil && a.Bool("cycle_momentum", false) {
			*diags = append(*diags, dsl.Errorf(v.Pos, "onecycle: cnnc does not cycle momentum: the optimizer's momentum and betas are compiled into its update kernels").Span(exprSpan(v)).
				Hint("write cycle_momentum=false or leave it out: cnnc's onecycle is PyTorch's OneCycleLR(..., cycle_momentum=False)"))
		}
		if warmup != nil {
			*diags = append(*diags, dsl.Errorf(warmup.Pos, "warmup with onecycle: onecycle warms up by itself, over pct_start of the steps").Span(exprSpan(warmup)).
				Hint("leave warmup out, or raise pct_start"))
		}
		return s, a.Float("max_lr", 0)
	}
	return s, 0
}

// milestones reads multistep's milestones: a list of increasing epochs.
func milestones(what string, e *dsl.Expr, diags *dsl.Diagnostics) []int {
	if e.Kind != dsl.ExprList || len(e.List) == 0 {
		*diags = append(*diags, dsl.Errorf(e.Pos, "%s: milestones must be a list of epochs such as [30, 60], got %s", what, describe(e)).Span(exprSpan(e)))
		return nil
	}
	var ms []int
	for _, x := range e.List {
		switch {
		case x.Kind != dsl.ExprInt || x.Int < 1:
			*diags = append(*diags, dsl.Errorf(x.Pos, "%s: a milestone is an epoch, an integer of at least 1, got %s", what, describe(x)).Span(exprSpan(x)))
			return nil
		case len(ms) > 0 && int(x.Int) <= ms[len(ms)-1]:
			*diags = append(*diags, dsl.Errorf(x.Pos, "%s: milestones must increase, but %d follows %d", what, x.Int, ms[len(ms)-1]).Span(exprSpan(x)))
			return nil
		}
		ms = append(ms, int(x.Int))
	}
	return ms
}

// warnUnusedLR says that an optimizer's lr is not used with onecycle,
// whose max_lr is the run's base rate (PyTorch's OneCycleLR overwrites the
// optimizer's rate too).
func warnUnusedLR(opt *dsl.Expr, maxLR float64, diags *dsl.Diagnostics) {
	if opt == nil || opt.Kind != dsl.ExprCall {
		return
	}
	for _, a := range opt.Call.Args {
		if a.Key == "lr" {
			*diags = append(*diags, dsl.Warnf(a.Pos, "%s's lr is not used: onecycle's max_lr=%g is the run's base rate", opt.Call.Name, maxLR).Span(len("lr")).
				Hint("PyTorch's OneCycleLR overwrites the optimizer's lr as well; leave lr out"))
		}
	}
}
