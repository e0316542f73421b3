package trainer

// A sharded optimizer's step and checkpoints (Spec.DataParallel.Shard,
// ZeRO stage 1). Each rank keeps the optimizer state of its share of the
// parameters only — the ranks' shares overlap in the arena, so the plan is
// smaller by the state less the largest share — runs the updates of its
// parameters after the all-reduce (skipping the others'), and then every
// parameter is broadcast from the rank that updated it, so that all ranks
// start the next step with the same parameters: bit for bit those of the
// unsharded step, which runs the same update kernels on the same summed
// gradients. A large parameter's state is split in element ranges
// (Shard.Split): every rank runs its update launch on its own range (the
// launch's range arguments set to it), and each range is broadcast from
// its rank; an element's update is the same arithmetic on any rank.
//
// Checkpoints hold the whole state: before a save every rank calls
// GatherOptimizerState, which broadcasts each state tensor (or range)
// rank 0 lacks from its owner into the tensor's scratch (its parameter's
// gradient buffer, which holds nothing between steps) and keeps rank 0's
// copy on the host, where the save reads it. A resume loads each rank's
// own share (or range) of the state from the complete checkpoint.

import (
	"fmt"
	"slices"

	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// Broadcaster copies count float32 values at from on rank root to to on
// every rank (nccl.Reducer's Broadcast on the session's device).
type Broadcaster interface {
	BroadcastTo(from, to device.Ptr, count, root int) error
}

// GroupBroadcaster is a Broadcaster that queues many broadcasts as one
// NCCL group (nccl.Reducer's BroadcastGroup): queue calls broadcast for
// each, and NCCL launches them together when queue returns, on the
// device's stream after the work queued there (on a GPU, from the
// device's thread).
type GroupBroadcaster interface {
	Broadcaster
	BroadcastGroup(queue func(broadcast func(from, to device.Ptr, count, root int) error) error) error
}

// validateShard checks a sharded optimizer's assignment against the spec.
func (s *Spec) validateShard() error {
	dp := s.DataParallel
	sh := dp.Shard
	if sh == nil {
		return nil
	}
	if len(sh.Owners) != len(s.Params) || len(sh.Split) != len(s.Params) || len(sh.Scratch) != len(s.State) || len(sh.StateParams) != len(s.State) {
		return fmt.Errorf("trainer: spec %s: the sharded optimizer names %d parameters and %d state tensors, the spec has %d and %d", s.Model, len(sh.Owners), len(sh.Scratch), len(s.Params), len(s.State))
	}
	for i, o := range sh.Owners {
		if o < -1 || o >= dp.Ranks || (sh.Split[i] != 0 && (o != -1 || sh.Split[i] < 0 || sh.Split[i]*int64(dp.Ranks) < s.Params[i].Elems())) {
			return fmt.Errorf("trainer: spec %s: %s's optimizer state lies with rank %d of %d, split in ranges of %d elements", s.Model, s.Params[i].Name, o, dp.Ranks, sh.Split[i])
		}
	}
	sharded := func(p int) bool { return sh.Owners[p] >= 0 || sh.Split[p] > 0 }
	for _, u := range sh.Updates {
		if u.Launch < dp.ReduceAfter || u.Launch >= len(s.Train.Launches) || u.Param < 0 || u.Param >= len(s.Params) || !sharded(u.Param) {
			return fmt.Errorf("trainer: spec %s: update launch %d of parameter %d is not a sharded parameter's update after the all-reduce", s.Model, u.Launch, u.Param)
		}
		if args := s.Train.Launches[u.Launch].Args; sh.Split[u.Param] > 0 && (u.RangeArg < 0 || u.RangeArg+1 >= len(args) ||
			args[u.RangeArg].Kind != kernelarg.Int || args[u.RangeArg+1].Kind != kernelarg.Int) {
			return fmt.Errorf("trainer: spec %s: update launch %d of split parameter %s has no element range at argument %d", s.Model, u.Launch, s.Params[u.Param].Name, u.RangeArg)
		}
	}
	for j, t := range s.State {
		p := sh.StateParams[j]
		if p < 0 || p >= len(s.Params) || !sharded(p) {
			return fmt.Errorf("trainer: spec %s: %s belongs to no sharded parameter", s.Model, t.Name)
		}
		if t.RankElems != sh.Split[p] || t.Elems() != s.Params[p].Elems() {
			return fmt.Errorf("trainer: spec %s: %s is split in ranges of %d elements, its parameter %s in ranges of %d", s.Model, t.Name, t.RankElems, s.Params[p].Name, sh.Split[p])
		}
		in := false
		for _, b := range dp.Buckets {
			in = in || sh.Scratch[j] >= b.Offset && sh.Scratch[j]+t.Bytes() <= b.Offset+b.Bytes
		}
		if !in {
			return fmt.Errorf("trainer: spec %s: %s's scratch [%d, %d) lies in no gradient bucket", s.Model, t.Name, sh.Scratch[j], sh.Scratch[j]+t.Bytes())
		}
	}
	return nil
}

// shardLaunches are the training launches rank runs: all but the updates
// of other ranks' parameters, a split parameter's on the rank's range;
// and the buckets with their launch numbers counted in those (a bucket
// whose first reader is skipped is waited for before the next launch the
// rank runs), for the overlapped step.
func shardLaunches(sh *Shard, params []Tensor, ls []Launch, buckets []Bucket, rank int) ([]Launch, []Bucket) {
	skip := map[int]bool{}
	for _, u := range sh.Updates {
		if k := sh.Split[u.Param]; k > 0 {
			lo, hi := Tensor{Shape: params[u.Param].Shape, RankElems: k}.RankRange(rank)
			l := &ls[u.Launch]
			l.Args = slices.Clone(l.Args)
			l.Args[u.RangeArg].Int, l.Args[u.RangeArg+1].Int = lo, hi
			continue
		}
		if sh.Owners[u.Param] != rank {
			skip[u.Launch] = true
		}
	}
	var out []Launch
	kept := make([]int, len(ls)+1) // kept[i]: the launches before launch i the rank runs
	for i, l := range ls {
		kept[i] = len(out)
		if !skip[i] {
			out = append(out, l)
		}
	}
	kept[len(ls)] = len(out)
	bs := slices.Clone(buckets)
	for k := range bs {
		bs[k].ReadyAfter, bs[k].NeededAt = kept[bs[k].ReadyAfter], kept[bs[k].NeededAt]
	}
	return out, bs
}

// broadcastParams sends every sharded parameter from the rank that updated
// it to the others, after the updates. On a GPU (the overlapped step,
// s.side) with a GroupBroadcaster nothing waits on the host: the
// broadcasts are queued on the device's stream behind the updates, as one
// NCCL group (one launch); the next step's all-reduces wait for the
// device's stream, so they follow them. Otherwise the host waits for the
// device before it broadcasts (a plain Broadcaster may read the arena from
// the host; the CPU target's launches have finished when they return, so
// its Sync is free).
func (s *Session) broadcastParams() error {
	sh := s.Spec.DataParallel.Shard
	if sh == nil {
		return nil
	}
	g, grouped := s.broadcaster.(GroupBroadcaster)
	if s.side == nil || !grouped {
		if err := s.Dev.Sync(); err != nil {
			return err
		}
	}
	if grouped {
		return g.BroadcastGroup(s.queueParamBroadcasts)
	}
	return s.queueParamBroadcasts(s.broadcaster.BroadcastTo)
}

// queueParamBroadcasts calls broadcast for every sharded parameter (every
// rank's range of a split one) from the rank that updated it, in the
// same order on every rank, as NCCL requires.
func (s *Session) queueParamBroadcasts(broadcast func(from, to device.Ptr, count, root int) error) error {
	sh := s.Spec.DataParallel.Shard
	for i, p := range s.Spec.Params {
		if k := sh.Split[i]; k > 0 {
			for r := range s.Spec.DataParallel.Ranks {
				lo, hi := Tensor{Shape: p.Shape, RankElems: k}.RankRange(r)
				if hi == lo {
					continue
				}
				at := s.addr(p.Arena, p.Offset+4*lo)
				if err := broadcast(at, at, int(hi-lo), r); err != nil {
					return fmt.Errorf("rank %d: broadcasting %s's elements [%d, %d) from rank %d: %w", s.rank, p.Name, lo, hi, r, err)
				}
			}
			continue
		}
		if o := sh.Owners[i]; o >= 0 {
			at := s.addr(p.Arena, p.Offset)
			if err := broadcast(at, at, int(p.Elems()), o); err != nil {
				return fmt.Errorf("rank %d: broadcasting %s from rank %d: %w", s.rank, p.Name, o, err)
			}
		}
	}
	return nil
}

// ownsState says whether this rank holds State[j] (every rank does
// without a sharded optimizer).
func (s *Session) ownsState(j int) bool {
	dp := s.Spec.DataParallel
	if dp == nil || dp.Shard == nil {
		return true
	}
	return dp.Shard.Owners[dp.Shard.StateParams[j]] == s.rank
}

// GatherOptimizerState brings the optimizer state of every rank to rank
// 0, for its next checkpoint (which needs it; without a sharded optimizer
// it does nothing). Every rank must call it at the same point, between
// steps: it is a collective.
func (s *Session) GatherOptimizerState() error {
	dp := s.Spec.DataParallel
	if dp == nil || dp.Shard == nil {
		return nil
	}
	if s.broadcaster == nil {
		return fmt.Errorf("trainer: gathering a sharded optimizer's state before the session is a rank (SetParallel)")
	}
	if err := s.Flush(); err != nil {
		return err
	}
	gathered := map[int][]byte{}
	for j, t := range s.Spec.State {
		o := dp.Shard.Owners[dp.Shard.StateParams[j]]
		if o == 0 {
			continue
		}
		to := s.addr(TrainArena, dp.Shard.Scratch[j])
		if t.RankElems > 0 { // every rank's range, rank 0's too, into place
			for r := range dp.Ranks {
				lo, hi := t.RankRange(r)
				if hi == lo {
					continue
				}
				if err := s.broadcaster.BroadcastTo(s.addr(t.Arena, t.Offset), to+device.Ptr(4*lo), int(hi-lo), r); err != nil {
					return fmt.Errorf("rank %d: gathering %s's elements [%d, %d) from rank %d: %w", s.rank, t.Name, lo, hi, r, err)
				}
			}
		} else if err := s.broadcaster.BroadcastTo(s.addr(t.Arena, t.Offset), to, int(t.Elems()), o); err != nil {
			return fmt.Errorf("rank %d: gathering %s from rank %d: %w", s.rank, t.Name, o, err)
		}
		if s.rank != 0 {
			continue
		}
		if err := s.Dev.Sync(); err != nil {
			return err
		}
		b := make([]byte, t.Bytes())
		if err := s.Dev.CopyOut(b, to); err != nil {
			return err
		}
		gathered[j] = b
	}
	s.gathered, s.gatheredStep = gathered, s.Step
	return nil
}

// stateBytes is State[j] as this rank can save it: from the arena when it
// holds it, else gathered from its owner at this step.
func (s *Session) stateBytes(j int) ([]byte, error) {
	t := s.Spec.State[j]
	if s.ownsState(j) {
		b := make([]byte, t.Bytes())
		return b, s.Dev.CopyOut(b, s.addr(t.Arena, t.Offset))
	}
	if b, ok := s.gathered[j]; ok && s.gatheredStep == s.Step && s.rank == 0 {
		return slices.Clone(b), nil
	}
	sh := s.Spec.DataParallel.Shard
	if t.RankElems > 0 {
		return nil, fmt.Errorf("%s is split over the ranks: every rank calls GatherOptimizerState after step %d before rank %d can save it", t.Name, s.Step, s.rank)
	}
	return nil, fmt.Errorf("%s lies with rank %d: every rank calls GatherOptimizerState after step %d before rank %d can save it", t.Name, sh.Owners[sh.StateParams[j]], s.Step, s.rank)
}
