package driver

import (
	"errors"
	"slices"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

// Alternatives are the distinct plans that meet cfg's budget, each
// compiled for t: the planner's own choice first (recomputation when it
// fits, else micro-batching), then recomputation alone and micro-batching
// alone where they fit and differ from it. The planner orders strategies
// by memory and FLOPs; which is faster depends on the device (a
// micro-batched step launches every kernel once per micro-batch), so the
// performance model chooses among these (perf.Fastest). Unbudgeted is the
// plan without a budget — what the budget costs is the difference — or nil
// when cfg has no budget. A forced micro-batch or accumulate fixes the
// plan: it is the only alternative.
func Alternatives(res *compiler.Result, cfg plan.Config, t Target) (alts []*trainergen.Compiled, unbudgeted *trainergen.Compiled, err error) {
	first, err := Compile(res, cfg, t)
	if err != nil {
		return nil, nil, err
	}
	alts = []*trainergen.Compiled{first}
	if cfg.Budget <= 0 {
		return alts, nil, nil
	}
	free := cfg
	free.Budget = 0
	if unbudgeted, err = Compile(res, free, t); err != nil {
		return nil, nil, err
	}
	if cfg.MicroBatch > 0 || cfg.Trunk != "" || res.Train.Accumulate > 1 {
		return alts, unbudgeted, nil
	}
	for _, only := range []plan.Config{{NoMicroBatch: true}, {NoRecompute: true}} {
		c := cfg
		c.NoMicroBatch, c.NoRecompute = c.NoMicroBatch || only.NoMicroBatch, c.NoRecompute || only.NoRecompute
		comp, err := Compile(res, c, t)
		var be *plan.BudgetError
		if errors.As(err, &be) {
			continue // this strategy alone does not meet the budget
		}
		if err != nil {
			return nil, nil, err
		}
		if !samePlan(alts, comp.Plan) {
			alts = append(alts, comp)
		}
	}
	return alts, unbudgeted, nil
}

// samePlan says whether p makes the choices of one of alts' plans.
func samePlan(alts []*trainergen.Compiled, p *plan.Plan) bool {
	for _, a := range alts {
		q := a.Plan
		if q.ArenaBytes == p.ArenaBytes && q.Choices.Strategy == p.Choices.Strategy && q.Choices.MicroBatch == p.Choices.MicroBatch &&
			q.Choices.MicroBatched == p.Choices.MicroBatched && slices.Equal(q.Choices.Recompute, p.Choices.Recompute) &&
			slices.Equal(q.Choices.SplitUpdates, p.Choices.SplitUpdates) {
			return true
		}
	}
	return false
}
