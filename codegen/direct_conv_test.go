package codegen_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// directSplitCases add to kernelcases.DirectConvCases maps large enough
// that the weight and bias gradients split their positions over several
// blocks at batch 3 (≥ 512 positions a split), one with a 5x5 window (25
// taps: two tap groups of a row, the second short).
var directSplitCases = []kernelcases.DirectConv{
	{C: 4, H: 40, W: 37, Out: 4, K: [2]int64{5, 5}, S: [2]int64{1, 1}, P: [2]int64{2, 2}, D: [2]int64{1, 1}, Groups: 4, Bias: true},
	{C: 6, H: 31, W: 29, Out: 3, K: [2]int64{3, 3}, S: [2]int64{1, 1}, P: [2]int64{2, 1}, D: [2]int64{2, 1}, Groups: 3},
}

// checkNodeOn is checkNode for kernels sized for a GPU of sms SMs (the
// direct conv gradients' split counts follow it); it returns the launches'
// grids.
func checkNodeOn(t *testing.T, n *ir.Node, batch, sms int64, seed uint64) [][3]uint32 {
	t.Helper()
	prog, err := codegen.GenerateNodes("T", []*ir.Node{n}, codegen.Options{Batch: batch, SMs: sms})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err, string(prog.Source))
	defer dev.Close()
	ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(seed, uint64(batch))))
	r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{LR: 0.05}, reference.NodeOptions{})
	require.NoError(t, err)
	require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s at batch %d, %d SMs: %s", n.Text(), batch, sms, r)
	var grids [][3]uint32
	for _, l := range prog.Launches {
		grids = append(grids, l.Grid)
	}
	return grids
}

// The CUDA direct conv kernels (forward, input, weight and bias gradients)
// on the emulator against the float64 reference, outputs and scratch
// poisoned with NaN, at batches 1 and 3, sized for no GPU and for an H200
// (132 SMs) — different split counts of the gradients' reductions.
//
// Tolerance: kernelcheck.Tolerance (1e-4 of the tensor's largest
// magnitude). The forward and input gradient sum at most 25·2 products per
// element in fp32. A weight or bias gradient element sums at most
// Q = 3·40·37 = 4440 products of inputs in [-1, 1): a thread adds at most
// ⌈Q/(splits·256)⌉ ≤ 18 of them in order, the shuffle and warp trees add
// 5 + 3 levels and the reduce ≤ 9 splits in order — at most 35 roundings
// along any path, so |error| ≤ 35·2^-24·Σ|products| ≈ 35·6e-8·(Q/4) ≈ 2.3e-3
// (E|xy| = 1/4). The elements are sums of Q products of variance 1/9 (σ ≈
// √Q/3 ≈ 22); the largest of a gradient's ≥ 100 elements is ≈ 2.5σ ≈ 55:
// ≈ 4e-5 relative as a worst case (independent roundings: √35 times less).
// The serial kernel this replaced had up to Q roundings along its path.
func TestDirectConvKernels(t *testing.T) {
	cases := append(append([]kernelcases.DirectConv{}, kernelcases.DirectConvCases...), directSplitCases...)
	saved := kernelcases.DirectConvCases
	kernelcases.DirectConvCases = cases
	checks := kernelcases.DirectConvChecks(t)
	kernelcases.DirectConvCases = saved
	split := false
	for _, batch := range []int64{1, 3} {
		for _, sms := range []int64{0, 132} {
			for i, c := range checks {
				grids := checkNodeOn(t, c.N, batch, sms, 71+uint64(i))
				if (c.N.Op == ir.OpConv2DGradWeight || c.N.Op == ir.OpConv2DGradBias) && grids[0][1] > 1 {
					split = true
				}
			}
		}
	}
	require.True(t, split, "no weight or bias gradient split its reduction: the cases do not test the partials")
}
