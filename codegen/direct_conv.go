package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Direct convolutions (templates/direct_conv.cu.tmpl): the kernels of an
// unfused conv2d and its gradients — the convs the conv blocks do not take
// (grouped, depthwise, dilated; the fuse pass leaves them alone). Each is
// one thread per output element summing its taps in a fixed order: simple
// and deterministic, not tiled. The weight gradient's thread sums over the
// whole batch and every output position, so it is the slow one on large
// maps (a split-K version like conv_block_wgrad's is the way to speed it).

func init() {
	register(ir.OpConv2D, directConvRule("direct_conv_fwd"))
	register(ir.OpConv2DGradInput, directConvRule("direct_conv_dgrad"))
	register(ir.OpConv2DGradWeight, directConvRule("direct_conv_wgrad"))
	register(ir.OpConv2DGradBias, directConvRule("direct_conv_bgrad"))
}

// directConvGeom is what the direct conv templates read.
type directConvGeom struct {
	Name, Doc              string
	B, C, H, W, O, HO, WO  int64
	CG, OG                 int64 // input and output channels per group
	KH, KW, SH, SW, PH, PW int64
	DH, DW                 int64
	HW, HWO, KHKW          int64
	Elems, InElems, WElems int64 // outputs, inputs, weights at the batch
	Bias, Accumulate       bool
	launchElems            int64
}

// DirectConvTypes are the input and output types of the conv that node n
// (conv2d or one of its gradients) computes or differentiates; for the
// bias gradient, which only the output's shape concerns, both are dy's.
func DirectConvTypes(n *ir.Node) (x, y ir.Type) {
	switch n.Op {
	case ir.OpConv2D:
		return n.Ins[0].Type, n.Out().Type
	case ir.OpConv2DGradInput:
		return n.Out().Type, n.Ins[0].Type
	case ir.OpConv2DGradWeight:
		return n.Ins[1].Type, n.Ins[0].Type
	}
	return n.Ins[0].Type, n.Ins[0].Type
}

func directConvRule(family string) rule {
	return func(e *emitter, n *ir.Node) error {
		x, y := DirectConvTypes(n)
		if len(x.Dims) != 3 || len(y.Dims) != 3 {
			return fmt.Errorf("codegen: %s: convolutions need [B,C,H,W] tensors", n.Text())
		}
		a := n.Attrs
		d, g := a.Dil(), a.GroupCount()
		k := &directConvGeom{B: e.batch, C: x.Dims[0], H: x.Dims[1], W: x.Dims[2], O: y.Dims[0], HO: y.Dims[1], WO: y.Dims[2],
			KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1], DH: d[0], DW: d[1],
			Accumulate: e.accumulate}
		k.CG, k.OG = k.C/g, k.O/g
		k.HW, k.HWO, k.KHKW = k.H*k.W, k.HO*k.WO, k.KH*k.KW
		k.Elems, k.InElems, k.WElems = y.Elems(e.batch), x.Elems(e.batch), k.O*k.CG*k.KHKW
		shape := fmt.Sprintf("x%s_o%d_k%dx%ds%dx%dp%dx%dd%dx%d_g%d", shapeName(x.Dims), k.O, k.KH, k.KW, k.SH, k.SW, k.PH, k.PW, k.DH, k.DW, g)
		if n.Op == ir.OpConv2DGradBias {
			shape = fmt.Sprintf("o%dx%dx%d", k.O, k.HO, k.WO)
		}
		suffix := ""
		if k.Accumulate {
			suffix = "_acc"
		}
		var what string
		switch n.Op {
		case ir.OpConv2D:
			k.Bias = len(n.Ins) > 2
			if k.Bias {
				suffix += "_bias"
			}
			k.launchElems, what = k.Elems, "forward"
		case ir.OpConv2DGradInput:
			k.launchElems, what = k.InElems, "input gradient"
		case ir.OpConv2DGradWeight:
			k.launchElems, what = k.WElems, "weight gradient"
		default:
			k.launchElems, what = k.O, "bias gradient"
		}
		k.Name = fmt.Sprintf("%s_%s_b%d%s", family, shape, e.batch, suffix)
		k.Doc = fmt.Sprintf("direct conv2d %s, [B,%d,%d,%d] -> [B,%d,%d,%d], window %dx%d stride %dx%d pad %dx%d dilation %dx%d, %d groups",
			what, k.C, k.H, k.W, k.O, k.HO, k.WO, k.KH, k.KW, k.SH, k.SW, k.PH, k.PW, k.DH, k.DW, g)
		if k.Accumulate {
			k.Doc += ", added to its output (a micro-batch's share)"
		}
		if err := e.kernel(family, k.Name, k); err != nil {
			return err
		}
		var args []Arg
		for _, v := range n.Ins {
			args = append(args, buf(v))
		}
		args = append(args, buf(n.Out()))
		e.launch(&Launch{Node: n, Kernel: k.Name, Grid: gridFor(k.launchElems, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
			Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
		return nil
	}
}
