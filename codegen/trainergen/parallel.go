package trainergen

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// dataParallel is the data-parallel side of a rank's Spec (nil for one
// device): the plan's buckets; the launch after which they are all
// written — the end of the backward pass — and before the first that
// reads one (an update, the clipping norm), where the rank sums them; and
// the first-sample arguments a rank moves to its share's place.
func dataParallel(p *plan.Plan, train *codegen.Program) (*trainer.DataParallel, error) {
	dp := p.DataParallel
	if dp == nil {
		return nil, nil
	}
	out := &trainer.DataParallel{Ranks: dp.Ranks, GlobalBatch: int(dp.GlobalBatch)}
	ready, needed := -1, len(p.Steps)
	for _, b := range dp.Buckets {
		out.Buckets = append(out.Buckets, trainer.Bucket{Offset: b.Offset, Bytes: b.Bytes})
		ready = max(ready, b.ReadyStep)
		if b.NeededStep >= 0 {
			needed = min(needed, b.NeededStep)
		}
	}
	if needed <= ready {
		return nil, fmt.Errorf("trainergen: step %d reads a gradient bucket before step %d has written every bucket", needed, ready)
	}
	out.ReduceAfter = len(train.Launches)
	for i, l := range train.Launches {
		if l.Step > ready && out.ReduceAfter == len(train.Launches) {
			out.ReduceAfter = i
		}
		if (l.Step > ready) != (i >= out.ReduceAfter) && l.Step >= 0 {
			return nil, fmt.Errorf("trainergen: launch %d (%s, plan step %d) runs out of the plan's order around the all-reduce after step %d", i, l.Kernel, l.Step, ready)
		}
		if arg, per, ok := codegen.FirstSampleArg(l); ok {
			out.FirstArgs = append(out.FirstArgs, trainer.FirstArg{Launch: i, Arg: arg, PerSample: per})
		}
	}
	return out, nil
}
