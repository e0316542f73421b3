package cpu

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// conv2d -> tanh -> avgpool2d blocks on the CPU (cnnc_cpu.h's ConvPoolFwd, ConvPoolDgrad,
// ConvPoolWgrad; the ops in compiler/ops/conv_tanh_pool.go): direct kernels, as CUDA's
// (codegen/conv_pool.go). The forward and the input gradient split into tasks of planes; the
// weight gradient into tasks of output channels, each summing its channel's weights over the
// whole batch (no scratch partials), written or, in a micro-batch loop, added.

func init() {
	register(ops.ConvTanhPoolOp, convPool)
	register(ops.ConvTanhPoolGradInputOp, convPool)
	register(ops.ConvTanhPoolGradWeightOp, convPool)
}

// convPoolGeom is a block's compile-time geometry, as cnnc_cpu.h's struct P names it.
type convPoolGeom struct {
	B, C, H, W                   int64
	U8                           bool
	O, KH, KW, SH, SW, PH, PW    int64
	HO, WO                       int64
	PKH, PKW, PSH, PSW, PPH, PPW int64
	PHO, PWO                     int64
	Bias, Save, Acc              bool
	PT                           int64
}

func newConvPoolGeom(n *ir.Node, x ir.Type, batch int64) (*convPoolGeom, error) {
	a := n.Attrs
	if a.Pool == nil || a.Aug != nil {
		return nil, fmt.Errorf("%s: a conv_pool block needs a pool window and no augmentation", n.Text())
	}
	g := &convPoolGeom{B: batch, O: a.Out, KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1],
		PKH: a.Pool.Kernel[0], PKW: a.Pool.Kernel[1], PSH: a.Pool.Stride[0], PSW: a.Pool.Stride[1], PPH: a.Pool.Pad[0], PPW: a.Pool.Pad[1],
		Bias: a.Bias, Save: a.SaveAct}
	switch {
	case x.DType == ir.U8 && len(x.Dims) == 3:
		g.U8, g.H, g.W, g.C = true, x.Dims[0], x.Dims[1], x.Dims[2]
	case x.DType == ir.F32 && len(x.Dims) == 3:
		g.C, g.H, g.W = x.Dims[0], x.Dims[1], x.Dims[2]
	default:
		return nil, fmt.Errorf("%s: block input %s is neither f32 [C,H,W] nor u8 [H,W,C]", n.Text(), x)
	}
	var ok1, ok2, ok3, ok4 bool
	g.HO, ok1 = ir.ConvOut(g.H, g.KH, g.SH, g.PH)
	g.WO, ok2 = ir.ConvOut(g.W, g.KW, g.SW, g.PW)
	g.PHO, ok3 = ir.ConvOut(g.HO, g.PKH, g.PSH, g.PPH)
	g.PWO, ok4 = ir.ConvOut(g.WO, g.PKW, g.PSW, g.PPW)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, fmt.Errorf("%s: the windows do not fit", n.Text())
	}
	if g.KH > 32 || g.KW > 32 {
		return nil, fmt.Errorf("%s: kernels larger than 32x32 are not supported", n.Text())
	}
	return g, nil
}

func (g *convPoolGeom) defs() []def {
	return []def{{"B", g.B}, {"C", g.C}, {"H", g.H}, {"W", g.W}, {"U8", g.U8},
		{"O", g.O}, {"KH", g.KH}, {"KW", g.KW}, {"SH", g.SH}, {"SW", g.SW}, {"PH", g.PH}, {"PW", g.PW}, {"HO", g.HO}, {"WO", g.WO},
		{"PKH", g.PKH}, {"PKW", g.PKW}, {"PSH", g.PSH}, {"PSW", g.PSW}, {"PPH", g.PPH}, {"PPW", g.PPW}, {"PHO", g.PHO}, {"PWO", g.PWO},
		{"BIAS", g.Bias}, {"SAVE", g.Save}, {"ACC", g.Acc}, {"PT", g.PT}}
}

func (g *convPoolGeom) shape() string {
	s := fmt.Sprintf("x%dx%dx%d", g.C, g.H, g.W)
	if g.U8 {
		s += "u8"
	}
	return s + fmt.Sprintf("_o%d_k%dx%ds%dp%d_tanh_avg%dx%ds%d_b%d", g.O, g.KH, g.KW, g.SH, g.PH, g.PKH, g.PKW, g.PSH, g.B)
}

func (g *convPoolGeom) doc(what string) string {
	s := fmt.Sprintf("%s of conv %dx%d stride %dx%d pad %dx%d of [B=%d,%d,%d,%d]", what, g.KH, g.KW, g.SH, g.SW, g.PH, g.PW, g.B, g.C, g.H, g.W)
	if g.U8 {
		s += " (u8 HWC images, /255)"
	}
	s += fmt.Sprintf(" to %d channels", g.O)
	if g.Bias {
		s += " + bias"
	}
	s += fmt.Sprintf(", tanh, avg-pool %dx%d stride %dx%d pad %dx%d", g.PKH, g.PKW, g.PSH, g.PSW, g.PPH, g.PPW)
	if g.Save {
		s += "; t = tanh(conv) saved"
	}
	return s + "."
}

// split sets PT for units units of work each (as directGeom.split) and returns the task count.
func (g *convPoolGeom) split(units, work int64) int64 {
	g.PT = max(1, min(directTaskWork/max(work, 1), cdiv(units, minTasks)))
	return cdiv(units, g.PT)
}

// convPool emits a block node's kernel: its inputs, then its outputs, are the parameters.
func convPool(e codegen.Emitter, n *ir.Node) error {
	x := n.Ins[0].Type
	switch n.Op {
	case ops.ConvTanhPoolGradInputOp:
		x = ir.F32Batched(n.Attrs.Dims...)
	case ops.ConvTanhPoolGradWeightOp:
		x = n.Ins[1].Type
	}
	g, err := newConvPoolGeom(n, x, e.Batch())
	if err != nil {
		return err
	}
	taps := g.C * g.KH * g.KW
	var family, impl, what string
	var tasks int64
	switch n.Op {
	case ops.ConvTanhPoolOp:
		family, impl, what = "conv_pool_fwd", "ConvPoolFwd<%s>", "the forward"
		tasks = g.split(g.B*g.O, g.HO*g.WO*taps)
	case ops.ConvTanhPoolGradInputOp:
		family, impl, what = "conv_pool_dgrad", "ConvPoolDgrad<%s>", "the input gradient"
		tasks = g.split(g.B*g.C, g.HO*g.WO*g.O*g.KH*g.KW)
	default:
		g.Acc = e.Accumulate() // a micro-batch loop's step, as the plan says
		family, impl, what = "conv_pool_wgrad", "ConvPoolWgrad<%s>", "the weight gradient"
		// one channel a task: its weights sum over the whole batch
		g.PT, tasks = 1, g.O
	}
	var args []codegen.Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	for _, v := range n.Outs {
		args = append(args, buf(v))
	}
	name := emit(e, kernelSpec{family: family, shape: g.shape(), doc: g.doc(what), structs: []structSpec{{"g", g.defs()}}, impl: impl, nparams: len(args)})
	return launch(e, n, name, tasks, args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}
