package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Standalone pools (templates/pool.cu.tmpl), for pools the fuse pass leaves
// alone (e.g. after an add): max-pool and average-pool forward, one thread
// per output, and their gradients, one thread per input element gathering
// from the windows that hold it (in window order, so the sums are
// deterministic; no atomics). maxpool2d_grad finds each window's maximum
// again from x, as PyTorch's first maximum in scan order; avgpool counts the
// padding in the divisor (count_include_pad).

const poolBlock = 256

func init() {
	register(ir.OpMaxPool2D, poolRule("maxpool2d_fwd"))
	register(ir.OpAvgPool2D, poolRule("avgpool2d_fwd"))
	register(ir.OpMaxPool2DGrad, poolRule("maxpool2d_grad"))
	register(ir.OpAvgPool2DGrad, poolRule("avgpool2d_grad"))
}

// poolData is what the pool templates read: input [C,H,W], output
// [C,PHO,PWO], the window, and Elems, the launch's threads.
type poolData struct {
	Name, Doc, Idx                            string
	C, H, W, PHO, PWO, KH, KW, SH, SW, PH, PW int64
	HW, PHWO, Elems                           int64
	Div                                       string // avg: the window size as a C float
}

func poolRule(family string) rule {
	return func(e *emitter, n *ir.Node) error {
		a := n.Attrs
		var in, out ir.Type // the pool's input and output
		switch n.Op {
		case ir.OpMaxPool2D, ir.OpAvgPool2D:
			in, out = n.Ins[0].Type, n.Out().Type
		case ir.OpMaxPool2DGrad:
			in, out = n.Ins[1].Type, n.Ins[0].Type
		default:
			in, out = n.Out().Type, n.Ins[0].Type
		}
		if len(in.Dims) != 3 || len(out.Dims) != 3 {
			return fmt.Errorf("codegen: %s: pools need [B,C,H,W] tensors", n.Text())
		}
		d := &poolData{C: in.Dims[0], H: in.Dims[1], W: in.Dims[2], PHO: out.Dims[1], PWO: out.Dims[2],
			KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1]}
		d.HW, d.PHWO = d.H*d.W, d.PHO*d.PWO
		d.Elems = out.Elems(e.batch) // forward: one thread per output
		if n.Op == ir.OpMaxPool2DGrad || n.Op == ir.OpAvgPool2DGrad {
			d.Elems = in.Elems(e.batch) // gradients: one thread per input element
		}
		d.Idx = indexType(in.Elems(e.batch), out.Elems(e.batch))
		suffix := ""
		if forceLongIndex || d.Idx == "long" {
			d.Idx, suffix = "long", "_i64"
		}
		d.Div = cFloat(float64(d.KH * d.KW))
		d.Name = fmt.Sprintf("%s_%s_k%dx%ds%dx%dp%dx%d_b%d%s", family, shapeName(in.Dims), d.KH, d.KW, d.SH, d.SW, d.PH, d.PW, e.batch, suffix)
		d.Doc = fmt.Sprintf("%s %dx%d stride %dx%d pad %dx%d, [B,%d,%d,%d] <-> [B,%d,%d,%d]", n.Op, d.KH, d.KW, d.SH, d.SW, d.PH, d.PW,
			d.C, d.H, d.W, d.C, d.PHO, d.PWO)
		if err := e.kernel(family, d.Name, d); err != nil {
			return err
		}
		var args []Arg
		for _, v := range n.Ins {
			args = append(args, buf(v))
		}
		args = append(args, buf(n.Out()))
		e.launch(&Launch{Node: n, Kernel: d.Name, Grid: gridFor(d.Elems, poolBlock), Block: [3]uint32{poolBlock, 1, 1},
			Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
		return nil
	}
}
