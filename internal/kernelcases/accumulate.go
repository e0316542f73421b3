package kernelcases

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/device"
)

// AccumulatingNodes are nodes whose kernels a micro-batch loop's steps run in their accumulating
// form (codegen.Options.Accumulate: each adds its share to what its outputs hold): the conv
// block's, the conv2d_tanh_avgpool block's and the linear block's weight gradients, a grouped, dilated, strided conv's weight and
// bias gradients (the direct kernels), and the loss and correct count, plain and with label
// smoothing (whose dlogits are written, not added), and the classifier tail writing its
// gradients (its logits and dX written, the loss, correct count, dW and dB added).
func AccumulatingNodes(t testing.TB) []*ir.Node {
	g := ir.NewGraph("T")
	val := func(name string, ty ir.Type) *ir.Value { return g.NewValue(name, ty, ir.RoleActivation, dsl.Pos{}) }
	label := func(name string) *ir.Value { return val(name, ir.Type{DType: ir.Class, Batched: true, Classes: 7}) }
	pool := &ir.Window{Kernel: k2, Stride: s2}
	conv := ir.Attrs{Out: 4, Kernel: k3, Stride: s1, Pad: p1, Bias: true, ReLU: true, Pool: pool, DOutMasked: true}
	direct := ir.Attrs{Out: 6, Kernel: k3, Stride: [2]int64{2, 1}, Pad: [2]int64{1, 2}, Dilation: [2]int64{1, 2}, Groups: 3}
	dy := val("dy3", ir.F32Batched(6, 5, 7))
	tpool := ir.Attrs{Out: 3, Kernel: k3, Stride: s1, Pad: p1, Bias: true, Pool: pool} // conv2d_tanh_avgpool, t recomputed
	return []*ir.Node{
		Typed(t, g, ir.OpConvBlockGradWeight, "conv", conv,
			[]*ir.Value{val("dpool", ir.F32Batched(4, 4, 3)), val("x", ir.F32Batched(5, 9, 7)), val("am", ir.ArgmaxType(4, 4, 4, 3))}, "dw", "db"),
		Typed(t, g, ir.OpLinearBlockGradWeight, "fc", ir.Attrs{Out: 6, Bias: true},
			[]*ir.Value{val("dy", ir.F32Batched(6)), val("h", ir.F32Batched(17))}, "dw2", "db2"),
		Typed(t, g, ir.OpConv2DGradWeight, "dconv", direct, []*ir.Value{dy, val("x3", ir.F32Batched(9, 9, 7))}, "dw3"),
		Typed(t, g, ir.OpConv2DGradBias, "dconv", ir.Attrs{}, []*ir.Value{dy}, "db3"),
		Typed(t, g, ops.ConvTanhPoolGradWeightOp, "tconv", tpool,
			[]*ir.Value{val("dtpool", ir.F32Batched(3, 3, 3)), val("x4", ir.F32Batched(2, 7, 6)), val("w4", ir.F32Fixed(3, 2, 3, 3)), val("b4", ir.F32Fixed(3))},
			"dw4", "db4"),
		Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{}, []*ir.Value{val("logits", ir.F32Batched(7)), label("label")}, "l", "dl", "c"),
		Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{Smoothing: 0.2},
			[]*ir.Value{val("logits2", ir.F32Batched(7)), label("label2")}, "l2", "dl2", "c2"),
		LinearCrossEntropyNode(t, g, "tail", LinearCrossEntropy{In: 17, Out: 7, Bias: true, InputGrad: true, MaskOut: true, Smoothing: 0.1}),
	}
}

// writtenInLoop says whether output i of n is written, not added, by its accumulating kernel:
// the per-sample gradients and logits of the loss kernels.
func writtenInLoop(n *ir.Node, i int) bool {
	switch n.Op {
	case ir.OpSoftmaxCrossEntropy:
		return i == 1 // dlogits
	case ops.LinearCrossEntropyOp:
		return i == 1 || (n.Attrs.InputGrad && i == 3) // the logits, dX
	}
	return false
}

// CheckAccumulates runs node n's launches of prog (generated with n accumulating) on dev over
// outputs holding random values, and requires each output to be those values plus the
// reference's (dlogits, the tail's logits and dX, which are written, the reference's), within 1e-4
// relative (at least 1e-4 absolute): AccumulatingNodes's sums are of at most 3·9·7 = 189 products of values in [-1, 1)
// per element, a relative fp32 error of at most 189·2^-24 ≈ 1.1e-5.
func CheckAccumulates(t *testing.T, dev device.Device, prog *codegen.Program, n *ir.Node, rng *rand.Rand) {
	t.Helper()
	batch := prog.Batch
	ins := kernelcheck.RandomInputs(n, batch, rng)
	ValidArgmax(n, ins, rng)
	want, err := reference.RunNode(n, ins, int(batch), reference.NodeOptions{})
	require.NoError(t, err)
	init := make([][]float64, len(n.Outs))
	for i, v := range n.Outs {
		init[i] = make([]float64, v.Type.Elems(batch))
		for j := range init[i] {
			init[i][j] = float64(float32(rng.Float64()*2 - 1))
		}
	}
	got, err := kernelcheck.LaunchOver(dev, prog, n, ins, init, kernelcheck.Scalars{})
	require.NoError(t, err)
	for i, v := range n.Outs {
		accumulates := !writtenInLoop(n, i)
		for j, g := range got.Outs[i] {
			w := want[i][j]
			if accumulates {
				w += init[i][j]
			}
			assert.InDelta(t, w, g, 1e-4*math.Max(1, math.Abs(w)), "%s %s[%d]", n.Op, v.Name, j)
		}
	}
}
