package trainergen

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// dataParallel is the data-parallel side of a rank's Spec (nil for one
// device): the plan's buckets, each with the launch after which it is
// written (its plan step's last launch) and the first launch that reads
// it (an update, the clipping norm), between which its all-reduce runs on
// a device with a second stream; the launch after which they are all
// written — the end of the backward pass — and before the first that
// reads one, where a rank without one sums them all; the first-sample
// arguments a rank moves to its share's place; and, with a sharded
// optimizer, which rank keeps which parameter's state.
func dataParallel(p *plan.Plan, train *codegen.Program, spec *trainer.Spec) (*trainer.DataParallel, error) {
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
	if dp.Shard != nil {
		sh, err := shard(p, train, spec, out.ReduceAfter)
		if err != nil {
			return nil, err
		}
		out.Shard = sh
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

// shard is a sharded optimizer's assignment: each parameter's owner (the
// plan's owner of its state buffers) or the ranges its state is split in
// (the plan's RangeElems), the update launches only the owner runs or
// every rank runs on its range (the CPU target's update kernels take one:
// codegen.UpdateRangeArgs), and each state tensor's scratch: its parameter's
// gradient buffer.
func shard(p *plan.Plan, train *codegen.Program, spec *trainer.Spec, reduceAfter int) (*trainer.Shard, error) {
	sh := &trainer.Shard{}
	index := map[string]int{}
	for i, t := range spec.Params {
		index[t.Name] = i
		sh.Owners = append(sh.Owners, -1)
		sh.Split = append(sh.Split, 0)
	}
	for _, prm := range p.Params {
		i, ok := index[prm.Name]
		if !ok {
			return nil, fmt.Errorf("trainergen: the plan's parameter %s is not in the spec", prm.Name)
		}
		for k, id := range prm.State {
			b := p.Buffers[id]
			if k > 0 && b.RangeElems != sh.Split[i] {
				return nil, fmt.Errorf("trainergen: %s's optimizer state is split unalike", prm.Name)
			}
			if sh.Split[i] = b.RangeElems; b.RangeElems > 0 {
				continue
			}
			if o := b.Owner - 1; o < 0 || (sh.Owners[i] >= 0 && sh.Owners[i] != o) {
				return nil, fmt.Errorf("trainergen: %s's optimizer state is not one rank's", prm.Name)
			} else {
				sh.Owners[i] = o
			}
		}
	}
	for li, l := range train.Launches {
		if l.Node == nil {
			continue
		}
		for _, prm := range l.Node.UpdatedParams() {
			i := index[prm.Name]
			if sh.Owners[i] < 0 && sh.Split[i] == 0 {
				continue // no state: every rank updates it
			}
			if li < reduceAfter || len(l.Node.UpdatedParams()) != 1 {
				return nil, fmt.Errorf("trainergen: launch %d (%s) updates %s with others or before the all-reduce: a sharded parameter's update runs alone", li, l.Kernel, prm.Name)
			}
			u := trainer.ShardUpdate{Launch: li, Param: i}
			if sh.Split[i] > 0 {
				arg, ok := codegen.UpdateRangeArgs(l)
				if !ok {
					return nil, fmt.Errorf("trainergen: launch %d (%s) updates %s, whose optimizer state is split in element ranges, over the whole tensor: its kernel takes no element range", li, l.Kernel, prm.Name)
				}
				u.RangeArg = arg
			}
			sh.Updates = append(sh.Updates, u)
		}
	}
	grads := gradientOffsets(p)
	for _, t := range spec.State {
		var owner *ir.Param
		for _, prm := range p.Graph.Params {
			for _, s := range prm.State {
				if "optimizer."+s.Name == t.Name {
					owner = prm
				}
			}
		}
		if owner == nil {
			return nil, fmt.Errorf("trainergen: %s belongs to no parameter", t.Name)
		}
		at, ok := grads[owner.Name]
		if !ok {
			return nil, fmt.Errorf("trainergen: %s's gradient is in no bucket, where %s would be gathered", owner.Name, t.Name)
		}
		sh.StateParams = append(sh.StateParams, index[owner.Name])
		sh.Scratch = append(sh.Scratch, at)
	}
	for j := range spec.State {
		spec.State[j].RankElems = sh.Split[sh.StateParams[j]]
	}
	return sh, nil
}

// gradientOffsets are where the plan's gradient buckets hold each
// parameter's gradient.
func gradientOffsets(p *plan.Plan) map[string]int64 {
	inBucket := map[int]bool{}
	for _, b := range p.DataParallel.Buckets {
		for _, id := range b.Buffers {
			inBucket[id] = true
		}
	}
	out := map[string]int64{}
	for _, n := range p.Graph.Nodes {
		for _, v := range n.Outs {
			if v.Role != ir.RoleGrad || v.Param == nil {
				continue
			}
			for _, b := range p.Buffers {
				if inBucket[b.ID] && len(b.Holds) > 0 && b.Holds[0].Value == v.Name {
					out[v.Param.Name] = b.Offset
				}
			}
		}
	}
	return out
}
