package codegen_test

import (
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// The accumulating variants micro-batch loops use add their share to what
// their outputs hold: weight gradients (conv and linear) and the loss and
// correct count. Each is checked against "initial contents + reference".
func TestAccumulatingKernels(t *testing.T) {
	const batch = 3
	g := ir.NewGraph("T")
	val := func(name string, ty ir.Type) *ir.Value { return g.NewValue(name, ty, ir.RoleActivation, dsl.Pos{}) }
	pool := &ir.Window{Kernel: [2]int64{2, 2}, Stride: [2]int64{2, 2}}
	convAttrs := ir.Attrs{Out: 4, Kernel: [2]int64{3, 3}, Stride: [2]int64{1, 1}, Pad: [2]int64{1, 1}, Bias: true, ReLU: true, Pool: pool, DOutMasked: true}
	nodes := []*ir.Node{
		kernelcases.Typed(t, g, ir.OpConvBlockGradWeight, "conv", convAttrs,
			[]*ir.Value{val("dpool", ir.F32Batched(4, 4, 3)), val("x", ir.F32Batched(5, 9, 7)), val("am", ir.ArgmaxType(4, 4, 4, 3))}, "dw", "db"),
		kernelcases.Typed(t, g, ir.OpLinearBlockGradWeight, "fc", ir.Attrs{Out: 6, Bias: true},
			[]*ir.Value{val("dy", ir.F32Batched(6)), val("h", ir.F32Batched(17))}, "dw2", "db2"),
		kernelcases.Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{},
			[]*ir.Value{val("logits", ir.F32Batched(7)), val("label", ir.Type{DType: ir.Class, Batched: true, Classes: 7})}, "l", "dl", "c"),
	}
	acc := map[*ir.Node]bool{}
	for _, n := range nodes {
		acc[n] = true // as in a micro-batch loop's steps
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Accumulate: acc})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "acc.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	rng := rand.New(rand.NewPCG(12, 13))
	block, err := kernelcheck.ScalarBlock(dev, kernelcheck.Scalars{}, batch)
	require.NoError(t, err)
	for _, n := range nodes {
		ins := kernelcheck.RandomInputs(n, batch, rng)
		want, err := reference.RunNode(n, ins, batch, reference.NodeOptions{})
		require.NoError(t, err)
		ptr := map[*ir.Value]device.Ptr{}
		alloc := func(v *ir.Value, vals []float64) {
			p, err := dev.Alloc(v.Type.Bytes(batch))
			require.NoError(t, err)
			require.NoError(t, dev.CopyIn(p, kernelcheck.Encode(v.Type, vals, batch)))
			ptr[v] = p
		}
		for i, v := range n.Ins {
			alloc(v, ins[i])
		}
		init := make([][]float64, len(n.Outs))
		for i, v := range n.Outs {
			init[i] = make([]float64, v.Type.Elems(batch))
			for j := range init[i] {
				init[i][j] = float64(float32(rng.Float64()*2 - 1))
			}
			alloc(v, init[i])
		}
		for _, l := range prog.Launches {
			if l.Node != n {
				continue
			}
			var params []uint64
			for _, a := range l.Args {
				switch a.Kind {
				case kernelarg.Buffer:
					if _, ok := ptr[a.Value]; !ok { // scratch
						p, err := dev.Alloc(a.Value.Type.Bytes(batch))
						require.NoError(t, err)
						ptr[a.Value] = p
					}
					params = append(params, uint64(ptr[a.Value]))
				case kernelarg.Scalars:
					params = append(params, uint64(block))
				default:
					params = append(params, uint64(a.Int))
				}
			}
			require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params))
		}
		for i, v := range n.Outs {
			b := make([]byte, v.Type.Bytes(batch))
			require.NoError(t, dev.CopyOut(b, ptr[v]))
			got := kernelcheck.Decode(v.Type, b, batch)
			accumulates := !(n.Op == ir.OpSoftmaxCrossEntropy && i == 1) // dlogits is written, not added
			for j := range got {
				w := want[i][j]
				if accumulates {
					w += init[i][j]
				}
				assert.InDelta(t, w, got[j], 1e-4*math.Max(1, math.Abs(w)), "%s %s[%d]", n.Op, v.Name, j)
			}
		}
	}
}
