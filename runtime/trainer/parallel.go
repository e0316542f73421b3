package trainer

// A data-parallel rank's step (Spec.DataParallel): the rank trains on its
// share of every global batch, sums the gradient buckets — the loss and
// correct count with them — over the ranks after the backward pass
// (Reducer: NCCL's all-reduce), then runs the updates, so every rank
// updates the same parameters with the global batch's gradient.
//
// The all-reduce runs from the host between the backward pass and the
// updates, after the device has finished the backward pass: on the CPU
// target (runtime/native), whose launches are synchronous, that is all
// there is; on a GPU, overlapping each bucket's all-reduce with the rest
// of the backward pass on a second stream is not built yet. With a sharded
// optimizer a rank runs only its parameters' updates and broadcasts them
// (shard.go); ranks agree when to stop (stop.go).

import (
	"fmt"
	"slices"

	"github.com/cnnc/cnnc/runtime/device"
)

// Reducer sums count float32 values at p over every rank, in place, the
// same bits on every rank (nccl.Comm's all-reduce on the session's
// device).
type Reducer interface {
	AllReduce(p device.Ptr, count int) error
}

// SetParallel makes s rank rank of its spec's data-parallel ranks, summing
// through r: from then on every training step takes a Batch of the rank's
// share (GlobalValid set) and sums its buckets with r. Graphs are turned
// off: the all-reduce runs from the host between launches.
func (s *Session) SetParallel(rank int, r Reducer) error {
	dp := s.Spec.DataParallel
	if dp == nil {
		return fmt.Errorf("trainer: %s was not compiled for data-parallel ranks", s.Spec.Model)
	}
	if rank < 0 || rank >= dp.Ranks {
		return fmt.Errorf("trainer: rank %d of a trainer compiled for %d ranks", rank, dp.Ranks)
	}
	if r == nil {
		return fmt.Errorf("trainer: rank %d without a reducer", rank)
	}
	ls := slices.Clone(s.Spec.Train.Launches)
	for _, f := range dp.FirstArgs {
		l := &ls[f.Launch]
		l.Args = slices.Clone(l.Args)
		l.Args[f.Arg].Int += int64(rank) * int64(s.Spec.Batch) * f.PerSample
	}
	if dp.Shard != nil {
		b, ok := r.(Broadcaster)
		if !ok {
			return fmt.Errorf("trainer: rank %d: a sharded optimizer needs a reducer that broadcasts", rank)
		}
		s.broadcaster, ls = b, shardLaunches(dp.Shard, ls, rank)
	}
	s.rank, s.reducer, s.rankLaunches = rank, r, ls
	s.UseGraphs = false
	return s.dropGraphs()
}

// Rank is s's data-parallel rank (0 on one device).
func (s *Session) Rank() int { return s.rank }

// launchTrain queues the training step's launches; on a data-parallel
// rank, the backward pass, the buckets' all-reduces once it has finished,
// then the updates.
func (s *Session) launchTrain() error {
	if s.reducer == nil {
		return s.launch(s.Spec.Train.Launches)
	}
	dp := s.Spec.DataParallel
	if err := s.launch(s.rankLaunches[:dp.ReduceAfter]); err != nil {
		return err
	}
	if err := s.Dev.Sync(); err != nil {
		return err
	}
	for i, b := range dp.Buckets {
		if err := s.reducer.AllReduce(s.addr(TrainArena, b.Offset), int(b.Bytes/4)); err != nil {
			return fmt.Errorf("rank %d: all-reduce of gradient bucket %d: %w", s.rank, i, err)
		}
	}
	if err := s.launch(s.rankLaunches[dp.ReduceAfter:]); err != nil {
		return err
	}
	return s.broadcastParams()
}

// stepValid is the valid count a training step's scalar block carries:
// the loss divides by it. On a data-parallel rank that is the global
// batch's.
func (s *Session) stepValid(b Batch) (int, error) {
	if s.reducer == nil {
		return b.Valid, nil
	}
	if b.GlobalValid < max(b.Valid, 1) || b.GlobalValid > s.Spec.DataParallel.GlobalBatch {
		return 0, fmt.Errorf("trainer: rank %d: a share of %d samples of a global batch of %d (at most %d)", s.rank, b.Valid, b.GlobalValid, s.Spec.DataParallel.GlobalBatch)
	}
	return b.GlobalValid, nil
}
