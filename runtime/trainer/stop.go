package trainer

// Coordinated interrupts on data-parallel ranks. SIGINT or SIGTERM sent
// to the launcher reaches every rank (runtime/dist forwards it), but not
// at the same moment: ranks that each stopped at their own step boundary
// would leave the others waiting in the next all-reduce, and rank 0's
// checkpoint might not be the step the others finished. So a rank does
// not stop on its own: at agreed step boundaries (every epoch's start and
// every stopAgreeEvery-th step, loop.go) all ranks sum a flag — 1
// where the rank was asked to stop — with one all-reduce of one float32,
// and all stop when the sum is positive, after the same step; rank 0 then
// writes the checkpoint (with a sharded optimizer, after every rank
// gathered the state). The flag lives in a small allocation of its own,
// outside the planned arena (NCCL needs device memory; no arena byte is
// free between steps on every plan).

import (
	"fmt"
	"math"
)

// AgreeStop is called by every data-parallel rank at the same step
// boundary with whether it was asked to stop; every rank gets whether
// any was. On one device it returns asked.
func (s *Session) AgreeStop(asked bool) (bool, error) {
	if s.reducer == nil {
		return asked, nil
	}
	if err := s.Flush(); err != nil {
		return false, err
	}
	if s.stopFlag == 0 {
		p, err := s.Dev.Alloc(4)
		if err != nil {
			return false, fmt.Errorf("rank %d: allocating the stop flag: %w", s.rank, err)
		}
		s.stopFlag = p
	}
	flag := float32(0)
	if asked {
		flag = 1
	}
	if err := s.Dev.CopyIn(s.stopFlag, f32bytes([]float32{flag})); err != nil {
		return false, err
	}
	if err := s.reducer.AllReduce(s.stopFlag, 1); err != nil {
		return false, fmt.Errorf("rank %d: agreeing whether to stop: %w", s.rank, err)
	}
	if err := s.Dev.Sync(); err != nil {
		return false, err
	}
	b := make([]byte, 4)
	if err := s.Dev.CopyOut(b, s.stopFlag); err != nil {
		return false, err
	}
	sum := bytesf32(b)[0]
	return sum > 0 && !math.IsNaN(float64(sum)), nil
}
