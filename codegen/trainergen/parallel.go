package trainergen

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// dataParallel is the data-parallel side of a rank's Spec (nil for one
// device): the plan's buckets, each with the launch after which it is
// written (its plan step's last launch) and the first launch that reads
// it (an update, the clipping norm), between which its all-reduce runs on
// a device with a second stream; the launch after which they are all
// written — the end of the backward pass — and before the first that
// reads one, where a rank without one sums them all; and the first-sample
// arguments a rank moves to its share's place.
func dataParallel(p *plan.Plan, train *codegen.Program) (*trainer.DataParallel, error) {
	dp := p.DataParallel
	if dp == nil {
		return nil, nil
	}
	out := &trainer.DataParallel{Ranks: dp.Ranks, GlobalBatch: int(dp.GlobalBatch)}
	ready, needed := -1, len(p.Steps)
	for _, b := range dp.Buckets {
		readyAfter, neededAt, err := bucketLaunches(b, train.Launches)
		if err != nil {
			return nil, err
		}
		out.Buckets = append(out.Buckets, trainer.Bucket{Offset: b.Offset, Bytes: b.Bytes, ReadyAfter: readyAfter, NeededAt: neededAt})
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

// bucketLaunches places bucket b among the step's launches: readyAfter
// counts the launches up to the last of a plan step at or before its
// ReadyStep (in a micro-batch loop, the last iteration's), after which
// every value of it is written; neededAt is the first launch of a plan
// step at or after its NeededStep (len(launches) when only the host reads
// it).
func bucketLaunches(b plan.Bucket, launches []*codegen.Launch) (readyAfter, neededAt int, err error) {
	neededAt = len(launches)
	for i, l := range launches {
		if l.Step < 0 {
			continue
		}
		if l.Step <= b.ReadyStep {
			readyAfter = i + 1
		}
		if b.NeededStep >= 0 && l.Step >= b.NeededStep && neededAt == len(launches) {
			neededAt = i
		}
	}
	if readyAfter == 0 || readyAfter > neededAt {
		return 0, 0, fmt.Errorf("trainergen: gradient bucket %d is written by launch %d but read by launch %d", b.Index, readyAfter-1, neededAt)
	}
	return readyAfter, neededAt, nil
}
