package codegen_test

import (
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
)

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

		l, first, err := kernelcheck.UpdateLaunch(prog, n)
		require.NoError(t, err)
		elems := n.Ins[0].Type.SampleElems()

		var data [][]byte
		for k, v := range n.Ins {
			data = append(data, kernelcheck.Encode(v.Type, ins[k], 1))
		}
		block, err := kernelcheck.ScalarBlock(dev, s, 1)
		require.NoError(t, err)
		states := 2 + len(n.Attrs.Opt.StateNames())
		whole, err := kernelcheck.UpdateRange(dev, l, first, data, states, block, 0, elems)
		require.NoError(t, err, n.Name)
		ranges := [][2]int64{{0, elems}, {0, 0}, {elems - 1, elems}}
		if elems > 3 {
			ranges = append(ranges, [2]int64{0, 1}, [2]int64{1, 700}, [2]int64{700, 1333}, [2]int64{1333, elems}, [2]int64{elems / 2, elems/2 + 1})
		}
		for _, rg := range ranges {
			got, err := kernelcheck.UpdateRange(dev, l, first, data, states, block, rg[0], rg[1])
			require.NoError(t, err, n.Name)
			require.NoError(t, kernelcheck.CheckUpdateRange(whole, got, rg[0], rg[1]), n.Name)
		}
		dev.Free(block)
	}
}
