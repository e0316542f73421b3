package driver

import (
	"errors"
	"slices"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

// Alternatives are the distinct plans that meet cfg's budget, each
// compiled for t: the planner's own choice first (memory-first split
// updates; recomputation when it fits, else micro-batching), then
// recomputation alone and micro-batching alone where they fit and differ
// from it, then the same three with fused-first split updates
// (plan.UpdatesFusedFirst: updates kept fused in their weight-gradient
// kernels while the budget allows, trading the in-place input gradients'
// memory for fewer launches). The planner orders strategies by memory and
// FLOPs; which is faster depends on the device (a micro-batched step
// launches every kernel once per micro-batch, a split update is a launch
// of its own), so the performance model chooses among these
// (perf.Fastest). At most six plans are compiled besides the unbudgeted
// one. Unbudgeted is the plan without a budget — what the budget costs is
// the difference — or nil when cfg has no budget. A forced micro-batch or
// accumulate fixes the strategy (the planner's choice and its fused-first
// twin remain); cfg.Updates = plan.UpdatesMinMemory, data parallelism
// (every update split) and no budget offer no fused-first plan.
func Alternatives(res *compiler.Result, cfg plan.Config, t Target) (alts []*trainergen.Compiled, unbudgeted *trainergen.Compiled, err error) {
	policies := []plan.UpdatePolicy{plan.UpdatesMemoryFirst, plan.UpdatesFusedFirst}
	if cfg.Updates == plan.UpdatesMinMemory || cfg.Ranks > 1 || cfg.DataParallel {
		policies = policies[:1]
	}
	cfg.Updates = plan.UpdatesMemoryFirst
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
	fixed := cfg.MicroBatch > 0 || cfg.Trunk != "" || res.Train.Accumulate > 1
	for _, policy := range policies {
		for _, only := range []plan.Config{{}, {NoMicroBatch: true}, {NoRecompute: true}} {
			own := !only.NoMicroBatch && !only.NoRecompute
			if (fixed && !own) || (own && policy == plan.UpdatesMemoryFirst) {
				continue // a fixed strategy; the planner's own choice, first
			}
			c := cfg
			c.Updates = policy
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
