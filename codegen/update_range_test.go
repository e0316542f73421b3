package codegen_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// rangePoison is the NaN that fills every element an update over a range
// must leave alone: a payload no arithmetic produces, so any write shows.
const rangePoison = 0x7fc0dead

// The standalone CUDA updates split into element ranges (a sharded
// optimizer's ranks on the CUDA target, each holding the state of its
// range only) write, bit for bit, the parameter and state elements the
// whole update writes — itself checked against the float64 reference
// within kernelcheck.Tolerance — and touch nothing outside the range:
// the parameter's and gradient's elements outside it, and the words
// around the range's state buffer, are NaN-poisoned and must keep their
// bits. Every optimizer, clipped and not, at step 0 and a later step, on
// odd sizes (1 and 2001 elements), with ranges that start at odd
// elements, a one-element range and an empty one; on the emulator.
func TestCUDAUpdateElementRanges(t *testing.T) {
	g := ir.NewGraph("T")
	type rcase struct {
		n    *ir.Node
		step int64
	}
	var cases []rcase
	for k, opt := range testOptimizers {
		for si, dims := range [][]int64{{1}, {3, 667}} {
			for _, clip := range []bool{false, true} {
				p := g.AddParam(fmt.Sprintf("r%d_%d_%v", k, si, clip), "weight", ir.Init{}, dsl.Pos{})
				p.Value.Type = ir.F32Fixed(dims...)
				grad := g.NewValue(p.Name+".grad", p.Value.Type, ir.RoleGrad, dsl.Pos{})
				ins := append([]*ir.Value{p.Value, grad}, kernelcases.NewState(g, p, opt)...)
				if clip {
					ins = append(ins, g.NewValue(p.Name+".coef", ops.ClipCoefType, ir.RoleActivation, dsl.Pos{}))
				}
				op := ir.OpSGDUpdate
				if opt.Kind != ir.SGD {
					op = ir.OpAdamUpdate
				}
				n := g.NewNode(op, p.Layer, ir.Update, dsl.Pos{}, ins, nil, 0)
				n.Attrs.Opt = opt
				_, err := op.Info().Infer(n)
				require.NoError(t, err)
				cases = append(cases, rcase{n, int64((k + si) % 2 * 5)})
			}
		}
	}
	var nodes []*ir.Node
	for _, c := range cases {
		nodes = append(nodes, c.n)
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 1})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err, string(prog.Source))
	defer dev.Close()
	for i, c := range cases {
		n := c.n
		rng := rand.New(rand.NewPCG(uint64(i), 11))
		ins := kernelcheck.RandomInputs(n, 1, rng)
		s := kernelcheck.Scalars{LR: testLR, Step: c.step}
		r, err := kernelcheck.Node(dev, prog, n, ins, s, reference.NodeOptions{Step: c.step, Update: true})
		require.NoError(t, err, n.Text())
		require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s\n%s", n.Text(), r)

		var l *codegen.Launch
		for _, pl := range prog.Launches {
			if pl.Node == n {
				require.Nil(t, l, "%s has more than one launch", n.Name)
				l = pl
			}
		}
		require.NotNil(t, l, "no launch for %s", n.Name)
		first, ok := codegen.UpdateRangeArgs(l)
		require.True(t, ok, "%s's launch has no element range", n.Name)
		elems := n.Ins[0].Type.SampleElems()
		require.Equal(t, int64(0), l.Args[first].Int)
		require.Equal(t, elems, l.Args[first+1].Int, "as generated, the whole tensor")

		var data [][]byte
		for k, v := range n.Ins {
			data = append(data, kernelcheck.Encode(v.Type, ins[k], 1))
		}
		block, err := kernelcheck.ScalarBlock(dev, s, 1)
		require.NoError(t, err)
		states := 2 + len(n.Attrs.Opt.StateNames())
		whole := runCUDARange(t, dev, l, first, data, states, block, 0, elems)
		ranges := [][2]int64{{0, elems}, {0, 0}, {elems - 1, elems}}
		if elems > 3 {
			ranges = append(ranges, [2]int64{0, 1}, [2]int64{1, 700}, [2]int64{700, 1333}, [2]int64{1333, elems}, [2]int64{elems / 2, elems/2 + 1})
		}
		for _, rg := range ranges {
			got := runCUDARange(t, dev, l, first, data, states, block, rg[0], rg[1])
			for k := range got {
				require.True(t, bytes.Equal(whole[k][4*rg[0]:4*rg[1]], got[k][4*rg[0]:4*rg[1]]),
					"%s: operand %d of the update over [%d, %d) differs from the whole update's", n.Name, k, rg[0], rg[1])
				for e := int64(0); e < int64(len(got[k])/4); e++ {
					if e < rg[0] || e >= rg[1] {
						require.Equal(t, uint32(rangePoison), binary.LittleEndian.Uint32(got[k][4*e:]),
							"%s: operand %d's element %d, outside the update's range [%d, %d), was written", n.Name, k, e, rg[0], rg[1])
					}
				}
			}
		}
		dev.Free(block)
	}
}

// runCUDARange runs update launch l (range arguments at first, first+1)
// on elements [lo, hi) of data (param, grad, the states, maybe a clipping
// coefficient) as a sharded rank does: param and grad whole, with every
// element outside the range poisoned; each state a buffer of the range's
// elements only, between poisoned guard words. It returns param and the
// states laid out as whole tensors, the elements outside the range (and,
// for a state, its guard words' verdict folded in) as they came back:
// poison unless something wrote there.
func runCUDARange(t *testing.T, dev device.Device, l *codegen.Launch, first int, data [][]byte, states int, block device.Ptr, lo, hi int64) [][]byte {
	t.Helper()
	const guard = 64 // poisoned words on each side of a range's state
	poisoned := func(b []byte, lo, hi int64) []byte {
		out := bytes.Clone(b)
		for e := int64(0); e < int64(len(b)/4); e++ {
			if e < lo || e >= hi {
				binary.LittleEndian.PutUint32(out[4*e:], rangePoison)
			}
		}
		return out
	}
	alloc := func(b []byte) device.Ptr {
		p, err := dev.Alloc(int64(max(len(b), 4)))
		require.NoError(t, err)
		t.Cleanup(func() { dev.Free(p) })
		require.NoError(t, dev.CopyIn(p, b))
		return p
	}
	params := make([]uint64, len(l.Args))
	bufs := make([]device.Ptr, len(data))
	for k, b := range data {
		switch {
		case k < 2:
			bufs[k] = alloc(poisoned(b, lo, hi))
			params[k] = uint64(bufs[k])
		case k < states: // the range's state between guards
			g := make([]byte, 4*guard)
			for e := range guard {
				binary.LittleEndian.PutUint32(g[4*e:], rangePoison)
			}
			bufs[k] = alloc(append(append(bytes.Clone(g), b[4*lo:4*hi]...), g...))
			params[k] = uint64(bufs[k]) + 4*guard
		default: // the clipping coefficient
			bufs[k] = alloc(b)
			params[k] = uint64(bufs[k])
		}
	}
	params[first-1] = uint64(block)
	params[first], params[first+1] = uint64(lo), uint64(hi)
	require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params))
	require.NoError(t, dev.Sync())
	out := [][]byte{make([]byte, len(data[0]))}
	require.NoError(t, dev.CopyOut(out[0], bufs[0]))
	for k := 2; k < states; k++ {
		b := make([]byte, 4*(2*guard+hi-lo))
		require.NoError(t, dev.CopyOut(b, bufs[k]))
		for e := range guard {
			require.Equal(t, uint32(rangePoison), binary.LittleEndian.Uint32(b[4*e:]), "state %d's guard word %d before the range [%d, %d) was written", k, e, lo, hi)
			require.Equal(t, uint32(rangePoison), binary.LittleEndian.Uint32(b[4*(guard+hi-lo+int64(e)):]), "state %d's guard word %d after the range [%d, %d) was written", k, e, lo, hi)
		}
		whole := poisoned(data[k], lo, hi) // the elements outside the range: never written
		copy(whole[4*lo:4*hi], b[4*guard:4*(guard+hi-lo)])
		out = append(out, whole)
	}
	return out
}
