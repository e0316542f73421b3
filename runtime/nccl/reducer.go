package nccl

import (
	"github.com/cnnc/cnnc/runtime/device"
)

// Reducer is a trainer's all-reduce (runtime/trainer.Reducer and
// StreamReducer) over an NCCL communicator: float32 sums in place, on
// Stream (0: the default stream) or, on a GPU, on the stream the trainer
// gives (AllReduceOn: its second stream, from the device's thread). On the
// CPU target the buffers are host memory, which only the fake libnccl of
// internal/fakenccl sums — NVIDIA's NCCL needs device memory.
//
// On a GPU, On is the device's OnStream (runtime/cuda.Device.OnStream):
// AllReduce and BroadcastTo, called from any thread (a step boundary's
// stop flag, a sharded optimizer's broadcasts), are queued from the
// device's thread — NCCL takes the device from the context current on the
// calling thread — on the device's stream, after the work queued there.
type Reducer struct {
	Comm   *Comm
	Stream uintptr
	On     func(func(stream uintptr) error) error
}

// AllReduce sums count float32 values at p over every rank, in place.
func (r Reducer) AllReduce(p device.Ptr, count int) error {
	return r.run(func(stream uintptr) error {
		return r.Comm.AllReduce(uintptr(p), uintptr(p), count, Float32, Sum, stream)
	})
}

// AllReduceOn queues the sum of count float32 values at p over every rank,
// in place, on stream. It is called on the device's thread already
// (trainer.SideStream.Run): it never goes through On.
func (r Reducer) AllReduceOn(stream uintptr, p device.Ptr, count int) error {
	return r.Comm.AllReduce(uintptr(p), uintptr(p), count, Float32, Sum, stream)
}

// BroadcastTo copies count float32 values at from on rank root to to on every rank (a sharded
// optimizer's parameters and gathered state: runtime/trainer.Broadcaster).
func (r Reducer) BroadcastTo(from, to device.Ptr, count, root int) error {
	return r.run(func(stream uintptr) error {
		return r.Comm.Broadcast(uintptr(from), uintptr(to), count, Float32, root, stream)
	})
}

// run calls f with the stream to queue on: through On when set (the
// device's thread and stream), else here with Stream.
func (r Reducer) run(f func(stream uintptr) error) error {
	if r.On != nil {
		return r.On(f)
	}
	return f(r.Stream)
}

// BroadcastGroup queues the broadcasts queue makes (each: count float32
// values at from on rank root to to on every rank) in one NCCL group, so
// that NCCL launches them together (runtime/trainer.GroupBroadcaster: a
// sharded optimizer's parameters after its updates): through On on the
// device's stream, after the work queued there, or on Stream. The group is
// ended even when queue fails.
func (r Reducer) BroadcastGroup(queue func(broadcast func(from, to device.Ptr, count, root int) error) error) error {
	return r.run(func(stream uintptr) error {
		return r.Comm.Library().Group(func() error {
			return queue(func(from, to device.Ptr, count, root int) error {
				return r.Comm.Broadcast(uintptr(from), uintptr(to), count, Float32, root, stream)
			})
		})
	})
}
