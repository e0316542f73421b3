package trainer

// A data-parallel rank's step (Spec.DataParallel): the rank trains on its
// share of every global batch, sums the gradient buckets — the loss and
// correct count with them — over the ranks (Reducer: NCCL's all-reduce),
// then runs the updates, so every rank updates the same parameters with
// the global batch's gradient.
//
// On a GPU (a device with a second stream, device.SideStreamer, and a
// reducer that queues its all-reduce on a given stream, StreamReducer)
// each bucket's all-reduce overlaps the rest of the backward pass, as
// PyTorch's DistributedDataParallel does: right after the launch writing
// the bucket's last gradient (Bucket.ReadyAfter) is queued, the side
// stream waits for the device's stream so far (an event) and NCCL's
// all-reduce is queued on it; right before the first launch reading the
// bucket (Bucket.NeededAt, its update) the device's stream waits for the
// side stream so far. Nothing waits on the host: the host queues the
// whole step, the GPU orders it. Buckets are queued in the order their
// gradients are written, and every rank queues them in the same order,
// as NCCL requires of collectives on one communicator.
//
// Elsewhere (the CPU target, runtime/native, whose launches are
// synchronous) the all-reduces run from the host after the backward pass
// has finished, one bucket after another, then the updates: nothing could
// overlap there.
//
// With a sharded optimizer a rank runs only its parameters' updates (and
// a split parameter's on its element range), each after its bucket's
// all-reduce as above — the buckets' launch numbers counted in the
// launches the rank runs — and broadcasts them once they have finished
// (shard.go): on a GPU on the device's stream, after the updates, in one
// NCCL group and without the host waiting, before the next step's
// all-reduces, which wait for the device's stream; ranks
// agree when to stop (stop.go).

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

// StreamReducer is a Reducer that can queue its all-reduce on a stream of
// the device (nccl.Reducer): called on the device's thread, it returns
// once the all-reduce is queued, and the stream runs it after the work
// queued before on it.
type StreamReducer interface {
	Reducer
	AllReduceOn(stream uintptr, p device.Ptr, count int) error
}

// SetParallel makes s rank rank of its spec's data-parallel ranks, summing
// through r: from then on every training step takes a Batch of the rank's
// share (GlobalValid set) and sums its buckets with r, on a second stream
// of the device when it has one and r can use it. Graphs are turned off:
// the all-reduces are queued from the host between launches (NCCL's
// collectives can be captured into a graph, the fake libnccl's cannot).
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
	if err := s.closeSide(); err != nil {
		return err
	}
	buckets, bc := dp.Buckets, Broadcaster(nil)
	if dp.Shard != nil {
		var ok bool
		if bc, ok = r.(Broadcaster); !ok {
			return fmt.Errorf("trainer: rank %d: a sharded optimizer needs a reducer that broadcasts", rank)
		}
		// a sharded rank skips other ranks' updates: the buckets' launch
		// numbers are counted in the launches it runs
		ls, buckets = shardLaunches(dp.Shard, s.Spec.Params, ls, dp.Buckets, rank)
	}
	if ss, ok := s.Dev.(device.SideStreamer); ok {
		if _, ok := r.(StreamReducer); ok {
			side, err := ss.NewSideStream(len(dp.Buckets))
			if err != nil {
				return fmt.Errorf("trainer: rank %d: the all-reduce's stream: %w", rank, err)
			}
			s.side = side
		}
	}
	s.rank, s.reducer, s.rankLaunches, s.rankBuckets, s.broadcaster = rank, r, ls, buckets, bc
	s.UseGraphs = false
	return s.dropGraphs()
}

// closeSide closes the all-reduce's stream, if any.
func (s *Session) closeSide() error {
	if s.side == nil {
		return nil
	}
	err := s.side.Close()
	s.side = nil
	return err
}

// Rank is s's data-parallel rank (0 on one device).
func (s *Session) Rank() int { return s.rank }

// launchTrain queues the training step's launches; on a data-parallel
// rank with a second stream, with each bucket's all-reduce between the
// launch that completes it and the first that reads it (overlapped);
// elsewhere, the backward pass, the buckets' all-reduces once it has
// finished, then the updates.
func (s *Session) launchTrain() error {
	if s.reducer == nil {
		return s.launch(s.Spec.Train.Launches)
	}
	if s.side != nil {
		if err := s.launchOverlapped(); err != nil {
			return err
		}
		return s.broadcastParams()
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

// launchOverlapped queues the step's launches on the device's stream and
// the buckets' all-reduces on the side stream, ordered by events (see the
// file's comment): after each all-reduce, the side stream's mark of its
// bucket, which the device's stream waits for before the bucket's first
// reader. Buckets only the host reads are waited for at the step's end
// (the host reads the loss; the next step writes the gradients again).
func (s *Session) launchOverlapped() error {
	buckets := s.rankBuckets
	r := s.reducer.(StreamReducer)
	ls, next := s.rankLaunches, 0 // next: the next bucket to sum
	for i := 0; i <= len(ls); i++ {
		for ; next < len(buckets) && buckets[next].ReadyAfter == i; next++ {
			if err := s.allReduceOnSide(r, next); err != nil {
				return err
			}
		}
		for k, b := range buckets[:next] {
			if b.NeededAt == i {
				if err := s.side.DeviceWaits(k); err != nil {
					return err
				}
			}
		}
		if i < len(ls) {
			if err := s.launch(ls[i : i+1]); err != nil {
				return err
			}
		}
	}
	if next < len(buckets) { // Spec.Validate rules it out
		return fmt.Errorf("rank %d: gradient bucket %d is never complete", s.rank, next)
	}
	return nil
}

// allReduceOnSide queues bucket k's all-reduce on the side stream after
// the device's work queued so far, and its mark after it.
func (s *Session) allReduceOnSide(r StreamReducer, k int) error {
	b := s.Spec.DataParallel.Buckets[k]
	if err := s.side.WaitForDevice(); err != nil {
		return err
	}
	err := s.side.Run(func(stream uintptr) error {
		return r.AllReduceOn(stream, s.addr(TrainArena, b.Offset), int(b.Bytes/4))
	})
	if err != nil {
		return fmt.Errorf("rank %d: all-reduce of gradient bucket %d: %w", s.rank, k, err)
	}
	return s.side.Mark(k)
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
