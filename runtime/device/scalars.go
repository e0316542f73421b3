package device

import (
	"encoding/binary"
	"math"
)

// StepScalarsBytes is the size of a step's scalar block.
const StepScalarsBytes = 32

// StepScalars are the run-time scalars of one training step (or one
// evaluation chunk). Kernels do not take them as arguments: they read them
// from one block of device memory (a kernel argument that points to it and
// never changes), which the trainer fills before each step — inside the
// step's CUDA graph, by the same copy that brings the batch — so that a
// captured graph never needs its kernel arguments updated.
//
// The block's layout is the C struct CnncStepScalars of the generated
// kernels (templates/prelude.cu.tmpl), little-endian:
//
//	offset 0:  int64   step   0-based training step (Adam's bias correction, SGD momentum's first step, dropout's counter)
//	offset 8:  uint64  seed   the run's seed (dropout's key)
//	offset 16: int64   valid  samples of the batch that are real (a partial batch is padded)
//	offset 24: float32 lr     the learning rate
//	offset 28: 4 bytes of zero padding
type StepScalars struct {
	Step  int64
	Seed  uint64
	Valid int64
	LR    float32
}

// Put writes s into b[:StepScalarsBytes] in the block's layout.
func (s StepScalars) Put(b []byte) {
	_ = b[StepScalarsBytes-1]
	binary.LittleEndian.PutUint64(b[0:], uint64(s.Step))
	binary.LittleEndian.PutUint64(b[8:], s.Seed)
	binary.LittleEndian.PutUint64(b[16:], uint64(s.Valid))
	binary.LittleEndian.PutUint32(b[24:], math.Float32bits(s.LR))
	binary.LittleEndian.PutUint32(b[28:], 0)
}

// Bytes is s in the block's layout.
func (s StepScalars) Bytes() []byte {
	b := make([]byte, StepScalarsBytes)
	s.Put(b)
	return b
}
