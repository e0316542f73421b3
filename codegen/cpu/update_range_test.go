package cpu_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/native"
)

// A standalone update split into element ranges (a sharded optimizer's ranks, each holding the
// state of its range only) writes, bit for bit, the parameter and state the whole update writes:
// every element takes the same arithmetic, and ranges starting at multiples of 64 elements (a
// multiple of every vector width) the same vector path. Every optimizer, clipped and not, on
// tensors of one and of two CHUNKs' tasks (26,000 elements), with ranges that cross a task
// boundary (on the larger) and one that is empty; elements outside a launch's range are left alone.
func TestUpdateElementRanges(t *testing.T) {
	var nodes []*ir.Node
	for _, c := range append(kernelcases.LossUpdateDropoutChecks(t, 1), kernelcases.ClipChecks(t, 1)...) {
		if (c.N.Op == ir.OpSGDUpdate || c.N.Op == ir.OpAdamUpdate) && c.N.Ins[0].Type.SampleElems() > 1000 {
			nodes = append(nodes, c.N)
		}
	}
	require.NotEmpty(t, nodes)
	prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: 1})
	require.NoError(t, err)
	for _, isa := range isas(t) {
		dev := openDevice(t, prog, native.Options{ISA: isa})
		block, err := kernelcheck.ScalarBlock(dev, kernelcheck.Scalars{LR: kernelcases.LR, Step: 5}, 1)
		require.NoError(t, err)
		for i, n := range nodes {
			l, first, err := kernelcheck.UpdateLaunch(prog, n)
			require.NoError(t, err)
			elems := n.Ins[0].Type.SampleElems()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			ins := kernelcheck.RandomInputs(n, 1, rng)
			var data [][]byte
			for k, v := range n.Ins {
				data = append(data, kernelcheck.Encode(v.Type, ins[k], 1))
			}
			states := 2 + optStateCount(n)
			whole, err := kernelcheck.UpdateRange(dev, l, first, data, states, block, 0, elems)
			require.NoError(t, err, "%s %s", isa, n.Name)
			for _, cuts := range [][]int64{{0, 64 * ((elems/3 + 63) / 64), 64 * ((2*elems/3 + 63) / 64), elems}, {0, 0, min(16384+64, 64*(elems/128)), elems}} {
				for k := 1; k < len(cuts); k++ {
					got, err := kernelcheck.UpdateRange(dev, l, first, data, states, block, cuts[k-1], cuts[k])
					require.NoError(t, err, "%s %s", isa, n.Name)
					require.NoError(t, kernelcheck.CheckUpdateRange(whole, got, cuts[k-1], cuts[k]), "%s %s", isa, n.Name)
				}
			}
		}
	}
}

// optStateCount is the number of optimizer-state operands of update n (after param and grad,
// before a clipping coefficient).
func optStateCount(n *ir.Node) int {
	k := 0
	for _, v := range n.Ins[2:] {
		if v.Role == ir.RoleOptState {
			k++
		}
	}
	return k
}
