package cpu_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/device"
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
			l := updateLaunch(t, prog, n)
			elems := n.Ins[0].Type.SampleElems()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			ins := kernelcheck.RandomInputs(n, 1, rng)
			var data [][]byte
			for k, v := range n.Ins {
				data = append(data, kernelcheck.Encode(v.Type, ins[k], 1))
			}
			states := 2 + optStateCount(n)
			whole := runRanges(t, dev, l, data, states, block, [][2]int64{{0, elems}})
			for _, cuts := range [][]int64{{0, 64 * ((elems/3 + 63) / 64), 64 * ((2*elems/3 + 63) / 64), elems}, {0, 0, min(16384+64, 64*(elems/128)), elems}} {
				var ranges [][2]int64
				for k := 1; k < len(cuts); k++ {
					ranges = append(ranges, [2]int64{cuts[k-1], cuts[k]})
				}
				got := runRanges(t, dev, l, data, states, block, ranges)
				for k := range whole {
					require.True(t, bytes.Equal(whole[k], got[k]), "%s %s: operand %d of the update over %v differs from the whole update's", isa, n.Name, k, ranges)
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

// updateLaunch is n's one launch in prog, with its range arguments located.
func updateLaunch(t *testing.T, prog *codegen.Program, n *ir.Node) *codegen.Launch {
	t.Helper()
	var out *codegen.Launch
	for _, l := range prog.Launches {
		if l.Node == n {
			require.Nil(t, out, "%s has more than one launch", n.Name)
			out = l
		}
	}
	require.NotNil(t, out, "no launch for %s", n.Name)
	first, ok := codegen.UpdateRangeArgs(out)
	require.True(t, ok, "%s's launch has no element range", n.Name)
	require.Equal(t, int64(0), out.Args[first].Int)
	require.Equal(t, n.Ins[0].Type.SampleElems(), out.Args[first+1].Int)
	return out
}

// runRanges runs launch l once per range on copies of data (param, grad, the states, maybe a
// clipping coefficient), each launch given only its range's state (a buffer of the range's
// elements, as a rank keeps it), and returns param and the states reassembled.
func runRanges(t *testing.T, dev device.Device, l *codegen.Launch, data [][]byte, states int, block device.Ptr, ranges [][2]int64) [][]byte {
	t.Helper()
	first, _ := codegen.UpdateRangeArgs(l)
	alloc := func(b []byte) device.Ptr {
		p, err := dev.Alloc(int64(max(len(b), 4)))
		require.NoError(t, err)
		t.Cleanup(func() { dev.Free(p) })
		require.NoError(t, dev.CopyIn(p, b))
		return p
	}
	ptrs := make([]device.Ptr, len(data))
	for k, b := range data {
		if k < 2 || k >= states {
			ptrs[k] = alloc(b)
		}
	}
	out := [][]byte{make([]byte, len(data[0]))}
	for k := 2; k < states; k++ {
		out = append(out, make([]byte, len(data[k])))
	}
	for _, r := range ranges {
		params := make([]uint64, len(l.Args))
		for k := range data {
			if k >= 2 && k < states {
				ptrs[k] = alloc(data[k][4*r[0] : 4*r[1]])
			}
			params[k] = uint64(ptrs[k])
		}
		params[first-1] = uint64(block)
		params[first], params[first+1] = uint64(r[0]), uint64(r[1])
		require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params))
		require.NoError(t, dev.Sync())
		for k := 2; k < states; k++ {
			require.NoError(t, dev.CopyOut(out[k-1][4*r[0]:4*r[1]], ptrs[k]))
		}
	}
	require.NoError(t, dev.CopyOut(out[0], ptrs[0]))
	return out
}
