package reference

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Slice places one kernel call inside a batch that a memory plan runs in
// micro-batches: the call processes samples [First, First+batch) of a
// batch of Of samples.
type Slice struct {
	First int
	Of    int
}

// RunNodeSlice is RunNode for one micro-batch: dropout draws the mask of
// those samples' elements of the whole batch, and the loss and its
// gradient average over the whole batch (Of samples), so that the
// micro-batches' losses and weight gradients add up to the full batch's.
func RunNodeSlice(n *ir.Node, ins [][]float64, batch int, o NodeOptions, s Slice) ([][]float64, error) {
	k, err := kernelOf(n)
	if err != nil {
		return nil, err
	}
	if len(ins) != len(n.Ins) {
		return nil, fmt.Errorf("reference: %s takes %d inputs, got %d", n.Op, len(n.Ins), len(ins))
	}
	if s.First < 0 || (s.Of > 0 && s.First+batch > s.Of) {
		return nil, fmt.Errorf("reference: samples [%d,%d) are outside a batch of %d", s.First, s.First+batch, s.Of)
	}
	env := &ops.RefEnv{Batch: batch, Training: o.Training, Update: o.Update, Seed: o.Seed, Step: o.Step, FirstSample: s.First, FullBatch: s.Of, BNTiles: o.BNTiles}
	return k(env, n, ins), nil
}
