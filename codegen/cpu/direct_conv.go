package cpu

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
)

// Direct convolutions on the CPU (cnnc_cpu.h's DirectConvFwd, DirectConvDgrad, DirectConvWgrad,
// DirectConvBgrad): the kernels of an unfused conv2d and its gradients — the convs the conv
// blocks do not take (grouped, depthwise, dilated; the fuse pass leaves them alone), as codegen's
// direct_conv.go for CUDA. Like CUDA's they fuse nothing: the weight gradient is written (or
// added, in a micro-batch loop) and a standalone update applies the optimizer. Each output
// element is summed by one task in a fixed order; the weight and bias gradients sum in double
// across rows, so their error does not grow with the batch.

func init() {
	register(ir.OpConv2D, directConv)
	register(ir.OpConv2DGradInput, directConv)
	register(ir.OpConv2DGradWeight, directConv)
	register(ir.OpConv2DGradBias, directConv)
}

// directGeom is a direct conv's compile-time geometry, as cnnc_cpu.h's struct D names it.
type directGeom struct {
	B, C, H, W, O, HO, WO  int64
	CG, OG                 int64 // input and output channels per group
	KH, KW, SH, SW, PH, PW int64
	DH, DW                 int64
	Bias, Acc              bool
	PT                     int64 // planes (weight rows, channels) a task takes
}

// newDirectGeom reads n's conv: x and y are the conv's input and output types.
func newDirectGeom(n *ir.Node, x, y ir.Type, batch int64) (*directGeom, error) {
	if len(x.Dims) != 3 || len(y.Dims) != 3 || x.DType != ir.F32 {
		return nil, fmt.Errorf("%s: direct convolutions need f32 [B,C,H,W] tensors", n.Text())
	}
	a := n.Attrs
	d, grp := a.Dil(), a.GroupCount()
	g := &directGeom{B: batch, C: x.Dims[0], H: x.Dims[1], W: x.Dims[2], O: y.Dims[0], HO: y.Dims[1], WO: y.Dims[2],
		KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1], DH: d[0], DW: d[1]}
	if grp < 1 || g.C%grp != 0 || g.O%grp != 0 {
		return nil, fmt.Errorf("%s: groups=%d must divide the %d input and %d output channels", n.Text(), grp, g.C, g.O)
	}
	if n.Op != ir.OpConv2DGradBias && (g.KH < 1 || g.KW < 1 || g.KH > 32 || g.KW > 32) { // the bias gradient has no window
		return nil, fmt.Errorf("%s: kernels larger than 32x32 are not supported", n.Text())
	}
	g.CG, g.OG = g.C/grp, g.O/grp
	return g, nil
}

func (g *directGeom) defs() []def {
	return []def{{"B", g.B}, {"C", g.C}, {"H", g.H}, {"W", g.W}, {"O", g.O}, {"HO", g.HO}, {"WO", g.WO},
		{"CG", g.CG}, {"OG", g.OG}, {"KH", g.KH}, {"KW", g.KW}, {"SH", g.SH}, {"SW", g.SW}, {"PH", g.PH}, {"PW", g.PW},
		{"DH", g.DH}, {"DW", g.DW}, {"BIAS", g.Bias}, {"ACC", g.Acc}, {"PT", g.PT}}
}

// shape is the kernel name's description: x16x32x32_o16_k3x3s2x2p1x1d1x1_g16_b8.
func (g *directGeom) shape() string {
	return fmt.Sprintf("x%dx%dx%d_o%d_k%dx%ds%dx%dp%dx%dd%dx%d_g%d_b%d", g.C, g.H, g.W, g.O, g.KH, g.KW, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, g.C/g.CG, g.B)
}

func (g *directGeom) doc(what string) string {
	s := fmt.Sprintf("direct conv2d %s, [B=%d,%d,%d,%d] -> [%d,%d,%d], window %dx%d stride %dx%d pad %dx%d dilation %dx%d, %d groups",
		what, g.B, g.C, g.H, g.W, g.O, g.HO, g.WO, g.KH, g.KW, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, g.C/g.CG)
	if g.Bias {
		s += ", bias"
	}
	if g.Acc {
		s += ", added to its output (a micro-batch's share)"
	}
	return s + "."
}

// directTaskWork is the multiply-adds a direct conv task aims at: enough that a task's fixed cost
// is small beside it (as an elementwise task's chunk of elements).
const directTaskWork = 1 << 16

// split sets PT so that units units of work each make tasks of about directTaskWork, but at
// least minTasks of them where there are that many units, and returns the task count.
func (g *directGeom) split(units, work int64) int64 {
	g.PT = max(1, min(directTaskWork/max(work, 1), cdiv(units, minTasks)))
	return cdiv(units, g.PT)
}

// directConv emits the kernel of a conv2d, conv2d_grad_input, conv2d_grad_weight or
// conv2d_grad_bias node: its inputs, then its output, are the parameters. A forward that writes
// batch norm's partials (Attrs.BNStats) launches bn_partials after it, as a conv block does.
func directConv(e codegen.Emitter, n *ir.Node) error {
	x, y := codegen.DirectConvTypes(n)
	g, err := newDirectGeom(n, x, y, e.Batch())
	if err != nil {
		return err
	}
	taps := g.CG * g.KH * g.KW
	var family, impl, what string
	var tasks int64
	switch n.Op {
	case ir.OpConv2D:
		g.Bias = len(n.Ins) > 2
		family, impl, what = "direct_conv_fwd", "DirectConvFwd<%s>", "forward"
		tasks = g.split(g.B*g.O, g.HO*g.WO*taps)
	case ir.OpConv2DGradInput:
		family, impl, what = "direct_conv_dgrad", "DirectConvDgrad<%s>", "input gradient"
		tasks = g.split(g.B*g.C, g.HO*g.WO*g.OG*g.KH*g.KW)
	case ir.OpConv2DGradWeight:
		g.Acc = e.Accumulate()
		family, impl, what = "direct_conv_wgrad", "DirectConvWgrad<%s>", "weight gradient"
		tasks = g.split(g.O*g.CG, g.B*g.HO*g.WO*g.KH*g.KW)
	default:
		g.Acc = e.Accumulate()
		family, impl, what = "direct_conv_bgrad", "DirectConvBgrad<%s>", "bias gradient"
		tasks = g.split(g.O, g.B*g.HO*g.WO)
	}
	shape := g.shape()
	if n.Op == ir.OpConv2DGradBias {
		shape = fmt.Sprintf("o%dx%dx%d_b%d", g.O, g.HO, g.WO, g.B)
	}
	var args []codegen.Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	args = append(args, buf(n.Out()))
	name := emit(e, kernelSpec{family: family, shape: shape, doc: g.doc(what), structs: []structSpec{{"g", g.defs()}}, impl: impl, nparams: len(args)})
	if err := launch(e, n, name, tasks, args, n.FLOPs(e.Batch()), minBytes(n, e.Batch())); err != nil {
		return err
	}
	if n.Op == ir.OpConv2D && n.Attrs.BNStats {
		return bnPartials(e, n) // as after a conv block
	}
	return nil
}
