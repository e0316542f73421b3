package dist

import (
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/nccl"
)

// Reducer is a trainer's all-reduce (runtime/trainer.Reducer) over an NCCL
// communicator: float32 sums in place on Stream (0: the default stream; on
// the CPU target the buffers are host memory, which only the fake libnccl
// of internal/fakenccl sums — NVIDIA's NCCL needs device memory).
type Reducer struct {
	Comm   *nccl.Comm
	Stream uintptr
}

// AllReduce sums count float32 values at p over every rank, in place.
func (r Reducer) AllReduce(p device.Ptr, count int) error {
	return r.Comm.AllReduce(uintptr(p), uintptr(p), count, nccl.Float32, nccl.Sum, r.Stream)
}
