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
type Reducer struct {
	Comm   *Comm
	Stream uintptr
}

// AllReduce sums count float32 values at p over every rank, in place.
func (r Reducer) AllReduce(p device.Ptr, count int) error {
	return r.Comm.AllReduce(uintptr(p), uintptr(p), count, Float32, Sum, r.Stream)
}

// AllReduceOn queues the sum of count float32 values at p over every rank,
// in place, on stream.
func (r Reducer) AllReduceOn(stream uintptr, p device.Ptr, count int) error {
	return r.Comm.AllReduce(uintptr(p), uintptr(p), count, Float32, Sum, stream)
}

// BroadcastTo copies count float32 values at from on rank root to to on every rank (a sharded
// optimizer's parameters and gathered state: runtime/trainer.Broadcaster).
func (r Reducer) BroadcastTo(from, to device.Ptr, count, root int) error {
	return r.Comm.Broadcast(uintptr(from), uintptr(to), count, Float32, root, r.Stream)
}
