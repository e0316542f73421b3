package trainer

// A sharded optimizer's step and checkpoints (Spec.DataParallel.Shard,
// ZeRO stage 1). Each rank keeps the optimizer state of its share of the
// parameters only — the ranks' shares overlap in the arena, so the plan is
// smaller by the state less the largest share — runs the updates of its
// parameters after the all-reduce (skipping the others'), and then every
// parameter is broadcast from the rank that updated it, so that all ranks
// start the next step with the same parameters: bit for bit those of the
// unsharded step, which runs the same update kernels on the same summed
// gradients.
//
// Checkpoints hold the whole state: before a save every rank calls
// GatherOptimizerState, which broadcasts each state tensor rank 0 lacks
// from its owner into the tensor's scratch (its parameter's gradient
// buffer, which holds nothing between steps) and keeps rank 0's copy on
// the host, where the save reads it. A resume loads each rank's own share
// of the state from the complete checkpoint.

import (
	"fmt"
	"slices"

	"github.com/cnnc/cnnc/runtime/device"
)

// Broadcaster copies count float32 values at from on rank root to to on
// every rank (nccl.Reducer's Broadcast on the session's device).
type Broadcaster interface {
	BroadcastTo(from, to device.Ptr, count, root int) error
}

// validateShard checks a sharded optimizer's assignment against the spec.
func (s *Spec) validateShard() error {
	dp := s.DataParallel
	sh := dp.Shard
	if sh == nil {
		return nil
	}
	if len(sh.Owners) != len(s.Params) || len(sh.Scratch) != len(s.State) || len(sh.StateParams) != len(s.State) {
		return fmt.Errorf("trainer: spec %s: the sharded optimizer names %d parameters and %d state tensors, the spec has %d and %d", s.Model, len(sh.Owners), len(sh.Scratch), len(s.Params), len(s.State))
	}
	for i, o := range sh.Owners {
		if o < -1 || o >= dp.Ranks {
			return fmt.Errorf("trainer: spec %s: %s's optimizer state lies with rank %d of %d", s.Model, s.Params[i].Name, o, dp.Ranks)
		}
	}
	for _, u := range sh.Updates {
		if u.Launch < dp.ReduceAfter || u.Launch >= len(s.Train.Launches) || u.Param < 0 || u.Param >= len(s.Params) || sh.Owners[u.Param] < 0 {
			return fmt.Errorf("trainer: spec %s: update launch %d of parameter %d is not a sharded parameter's update after the all-reduce", s.Model, u.Launch, u.Param)
		}
	}
	for j, t := range s.State {
		p := sh.StateParams[j]
		if p < 0 || p >= len(s.Params) || sh.Owners[p] < 0 {
			return fmt.Errorf("trainer: spec %s: %s belongs to no sharded parameter", s.Model, t.Name)
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
// of other ranks' parameters.
func shardLaunches(sh *Shard, ls []Launch, rank int) []Launch {
	skip := map[int]bool{}
	for _, u := range sh.Updates {
		if sh.Owners[u.Param] != rank {
			skip[u.Launch] = true
		}
	}
	var out []Launch
	for i, l := range ls {
		if !skip[i] {
			out = append(out, l)
		}
	}
	return out
}

// broadcastParams sends every sharded parameter from the rank that updated
// it to the others, after the updates have finished.
func (s *Session) broadcastParams() error {
	sh := s.Spec.DataParallel.Shard
	if sh == nil {
		return nil
	}
	if err := s.Dev.Sync(); err != nil {
		return err
	}
	for i, p := range s.Spec.Params {
		if o := sh.Owners[i]; o >= 0 {
			at := s.addr(p.Arena, p.Offset)
			if err := s.broadcaster.BroadcastTo(at, at, int(p.Elems()), o); err != nil {
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
		if err := s.broadcaster.BroadcastTo(s.addr(t.Arena, t.Offset), to, int(t.Elems()), o); err != nil {
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
	return nil, fmt.Errorf("%s lies with rank %d: every rank calls GatherOptimizerState after step %d before rank %d can save it", t.Name, sh.Owners[sh.StateParams[j]], s.Step, s.rank)
}
