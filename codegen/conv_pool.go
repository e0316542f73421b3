package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// conv2d -> tanh -> avgpool2d blocks (compiler/ops/conv_tanh_pool.go;
// templates/conv_pool.cu.tmpl): direct kernels, one thread per output
// element, at FP32 whatever the precision (LeNet-sized layers, where the
// memory the fusion saves matters and the FLOPs do not).
//
//   - forward: without save, one kernel writes the pooled output, each
//     thread computing the tanh of its window's conv outputs; with save, one
//     kernel writes t = tanh(conv) at full resolution and a second pools it.
//   - input gradient (save only): each input element sums w·dy over its
//     taps, dy formed from the pooled gradient and the saved t.
//   - weight gradient: the positions split over blockIdx.x (convPoolSplits
//     at most), a block per (split, output channel) forming a chunk's dy —
//     recomputing t from x, w and b without save — then each weight's sum
//     over the chunk; conv_block_wgrad_reduce adds the splits in order.

func init() {
	register(ops.ConvTanhPoolOp, convPoolForwardRule)
	register(ops.ConvTanhPoolGradInputOp, convPoolGradInputRule)
	register(ops.ConvTanhPoolGradWeightOp, convPoolGradWeightRule)
	registerScratch(ops.ConvTanhPoolGradWeightOp, convPoolGradWeightScratch)
}

// convPoolThreads is the weight-gradient kernel's block: the positions of
// a chunk, and the weights one pass over them covers.
const convPoolThreads = 128

// convPoolSplits bounds the weight gradient's splits: its partial sums
// are convPoolSplits weight gradients at most (LeNet-5's conv2: 155 kB).
const convPoolSplits = 16

// convPoolData is what the conv_pool templates read.
type convPoolData struct {
	Name, Pre, Doc, XT                           string
	B, C, H, W, HW, O, HO, WO, HWO               int64
	KH, KW, SH, SW, PH, PW, KHKW, K              int64
	PKH, PKW, PSH, PSW, PPH, PPW, PHO, PWO, PHWO int64
	PKHKW                                        int64
	U8, Bias, SaveAct                            bool
	PooledElems, ConvElems, InElems              int64
	T, RPT, Q, Splits, WE, WElems                int64
}

// newConvPoolData reads node n's geometry; x is the block's input type (u8
// HWC or f32 CHW).
func newConvPoolData(n *ir.Node, x ir.Type, batch int64) (*convPoolData, error) {
	a := n.Attrs
	if a.Pool == nil || a.Aug != nil {
		return nil, fmt.Errorf("codegen: %s: a conv_pool block needs a pool window and no augmentation", n.Text())
	}
	d := &convPoolData{B: batch, O: a.Out, KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1],
		PKH: a.Pool.Kernel[0], PKW: a.Pool.Kernel[1], PSH: a.Pool.Stride[0], PSW: a.Pool.Stride[1], PPH: a.Pool.Pad[0], PPW: a.Pool.Pad[1],
		Bias: a.Bias, SaveAct: a.SaveAct, XT: "float"}
	switch {
	case x.DType == ir.U8 && len(x.Dims) == 3:
		d.U8, d.XT, d.H, d.W, d.C = true, "unsigned char", x.Dims[0], x.Dims[1], x.Dims[2]
	case x.DType == ir.F32 && len(x.Dims) == 3:
		d.C, d.H, d.W = x.Dims[0], x.Dims[1], x.Dims[2]
	default:
		return nil, fmt.Errorf("codegen: %s: block input %s is neither f32 [C,H,W] nor u8 [H,W,C]", n.Text(), x)
	}
	var ok1, ok2, ok3, ok4 bool
	d.HO, ok1 = ir.ConvOut(d.H, d.KH, d.SH, d.PH)
	d.WO, ok2 = ir.ConvOut(d.W, d.KW, d.SW, d.PW)
	d.PHO, ok3 = ir.ConvOut(d.HO, d.PKH, d.PSH, d.PPH)
	d.PWO, ok4 = ir.ConvOut(d.WO, d.PKW, d.PSW, d.PPW)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return nil, fmt.Errorf("codegen: %s: the windows do not fit", n.Text())
	}
	if d.KH > 32 || d.KW > 32 {
		return nil, fmt.Errorf("codegen: %s: kernels larger than 32x32 are not supported", n.Text())
	}
	d.HW, d.HWO, d.PHWO, d.KHKW, d.PKHKW = d.H*d.W, d.HO*d.WO, d.PHO*d.PWO, d.KH*d.KW, d.PKH*d.PKW
	d.K = d.C * d.KHKW
	d.WElems = d.O * d.K
	d.WE = d.WElems
	if d.Bias {
		d.WE += d.O
	}
	if d.K > ops.MaxConvTanhPoolTaps || d.O > 65535 {
		return nil, fmt.Errorf("codegen: %s: conv_pool blocks take weight rows of at most %d taps and 65535 channels", n.Text(), ops.MaxConvTanhPoolTaps)
	}
	d.PooledElems, d.ConvElems, d.InElems = batch*d.O*d.PHWO, batch*d.O*d.HWO, batch*d.C*d.HW
	d.T = convPoolThreads
	d.RPT = divUp(d.K+1, d.T)
	d.Q = batch * d.HWO
	d.Splits = convPoolSplitsAt(d.HWO, batch)
	return d, nil
}

// convPoolSplitsAt is the weight gradient's splits at a batch: a chunk of
// positions each, convPoolSplits at most.
func convPoolSplitsAt(hwo, batch int64) int64 {
	return max(1, min(divUp(batch*hwo, convPoolThreads), convPoolSplits))
}

// shape names every compile-time property of the geometry.
func (d *convPoolData) shape() string {
	s := fmt.Sprintf("x%dx%dx%d", d.C, d.H, d.W)
	if d.U8 {
		s += "u8"
	}
	s += fmt.Sprintf("_o%d_k%dx%ds%dx%dp%dx%d", d.O, d.KH, d.KW, d.SH, d.SW, d.PH, d.PW)
	if d.Bias {
		s += "_bias"
	}
	return s + fmt.Sprintf("_tanh_avg%dx%ds%dx%dp%dx%d_b%d", d.PKH, d.PKW, d.PSH, d.PSW, d.PPH, d.PPW, d.B)
}

func (d *convPoolData) doc() string {
	in := fmt.Sprintf("f32 [B,%d,%d,%d]", d.C, d.H, d.W)
	if d.U8 {
		in = fmt.Sprintf("u8 [B,%d,%d,%d] (HWC, /255 as it loads)", d.H, d.W, d.C)
	}
	s := fmt.Sprintf("conv %dx%d stride %dx%d pad %dx%d of %s to [B,%d,%d,%d]", d.KH, d.KW, d.SH, d.SW, d.PH, d.PW, in, d.O, d.HO, d.WO)
	if d.Bias {
		s += " + bias"
	}
	return s + fmt.Sprintf(", tanh, avg-pool %dx%d stride %dx%d pad %dx%d to [B,%d,%d,%d]", d.PKH, d.PKW, d.PSH, d.PSW, d.PPH, d.PPW, d.O, d.PHO, d.PWO)
}

// convPoolKernel renders family under a name and launches it over elems
// threads (a grid-stride loop) with args.
func convPoolKernel(e *emitter, n *ir.Node, d *convPoolData, family, what string, elems int64, args []Arg, flops, bytes int64) error {
	c := *d
	c.Name = fmt.Sprintf("%s_%s", family, d.shape())
	c.Pre = c.Name
	c.Doc = what + " of " + d.doc()
	if err := e.kernel(family, c.Name, &c); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: c.Name, Grid: gridFor(elems, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
		Args: args, FLOPs: flops, MinBytes: bytes})
	return nil
}

func convPoolForwardRule(e *emitter, n *ir.Node) error {
	d, err := newConvPoolData(n, n.Ins[0].Type, e.batch)
	if err != nil {
		return err
	}
	args := []Arg{buf(n.Ins[0]), buf(n.Ins[1])}
	if d.Bias {
		args = append(args, buf(n.Ins[2]))
	}
	if !d.SaveAct {
		return convPoolKernel(e, n, d, "conv_pool_fwd", "the pooled output", d.PooledElems, append(args, buf(n.Outs[0])),
			n.FLOPs(e.batch), minBytes(n, e.batch))
	}
	t := n.Outs[1]
	convFLOPs := n.FLOPs(e.batch) - d.PooledElems*d.PKHKW
	if err := convPoolKernel(e, n, d, "conv_pool_fwd_t", "the tanh output", d.ConvElems, append(args, buf(t)),
		convFLOPs, minBytes(n, e.batch)-n.Outs[0].Type.Bytes(e.batch)); err != nil {
		return err
	}
	return convPoolKernel(e, n, d, "conv_pool_avg", "the pool", d.PooledElems, []Arg{buf(t), buf(n.Outs[0])},
		d.PooledElems*d.PKHKW, t.Type.Bytes(e.batch)+n.Outs[0].Type.Bytes(e.batch))
}

func convPoolGradInputRule(e *emitter, n *ir.Node) error {
	d, err := newConvPoolData(n, ir.F32Batched(n.Attrs.Dims...), e.batch)
	if err != nil {
		return err
	}
	args := []Arg{buf(n.Ins[0]), buf(n.Ins[1]), buf(n.Ins[2]), buf(n.Out())}
	return convPoolKernel(e, n, d, "conv_pool_dgrad", "the input gradient", d.InElems, args, n.FLOPs(e.batch), minBytes(n, e.batch))
}

// convPoolPartials is the weight gradient's scratch: a partial weight (and
// bias) gradient per split, at the most splits a batch up to b takes
// (splits grow with the batch).
func convPoolPartials(d *convPoolData, b int64) ir.Type {
	return ir.F32Fixed(convPoolSplitsAt(d.HWO, b), d.WE)
}

func convPoolGradWeightScratch(n *ir.Node, b int64, _ sizing) (int64, error) {
	d, err := newConvPoolData(n, n.Ins[1].Type, b)
	if err != nil {
		return 0, err
	}
	return ScratchAligned(convPoolPartials(d, b).Bytes(b)), nil
}

func convPoolGradWeightRule(e *emitter, n *ir.Node) error {
	d, err := newConvPoolData(n, n.Ins[1].Type, e.batch)
	if err != nil {
		return err
	}
	partial := e.scratch(n, "dw_partials", convPoolPartials(d, e.batch))
	var args []Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	args = append(args, buf(partial))
	c := *d
	c.Name = fmt.Sprintf("conv_pool_wgrad_%s_split%d", d.shape(), d.Splits)
	if d.SaveAct {
		c.Name += "_saved"
	}
	c.Pre = c.Name
	c.Doc = "the weight gradient of " + d.doc()
	if !d.SaveAct {
		c.Doc += "; t recomputed"
	}
	if err := e.kernel("conv_pool_wgrad", c.Name, &c); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: c.Name, Grid: [3]uint32{uint32(d.Splits), uint32(d.O), 1}, Block: [3]uint32{uint32(d.T), 1, 1},
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch) + partial.Type.Bytes(e.batch)})
	g := &convGeom{O: d.O, K: d.K, Bias: d.Bias, WElems: d.WElems}
	return convWeightReduce(e, n, ir.BlockParts{}, &convData{convGeom: g, Splits: d.Splits, WE: d.WE}, partial)
}
