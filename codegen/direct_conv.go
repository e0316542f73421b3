package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Direct convolutions (templates/direct_conv.cu.tmpl): the kernels of an
// unfused conv2d and its gradients — the convs the conv blocks do not take
// (grouped, depthwise, dilated; the fuse pass leaves them alone). The
// forward and input gradient are one thread per output element summing its
// taps in a fixed order: simple and deterministic, not tiled. The weight
// and bias gradients reduce over every sample's output positions, so one
// thread per weight would leave the GPU nearly empty (a depthwise layer has
// a few hundred weights): they split the positions over the grid's y
// dimension (directSplits, from the batch and the SM count as the conv
// blocks' wgradSplits), a block per (weight row, split) writes its partial
// sums by a fixed tree, and conv_block_wgrad_reduce adds the splits in
// order — deterministic for a given split count. A forward whose output
// only a batch norm reads (ir.Attrs.BNStats, in training and not in a
// micro-batch loop) also writes the statistics' partials
// (directConvBNRule): flat cells of ops.BNChunk values, a warp each, the
// tiling batchnorm_stats merges; elsewhere it writes none and the
// statistics compute the cells from the output, as after a conv block.

func init() {
	register(ir.OpConv2D, directConvRule("direct_conv_fwd"))
	register(ir.OpConv2DGradInput, directConvRule("direct_conv_dgrad"))
	register(ir.OpConv2DGradWeight, directConvRule("direct_conv_wgrad"))
	register(ir.OpConv2DGradBias, directConvRule("direct_conv_bgrad"))
	registerScratch(ir.OpConv2DGradWeight, directPartialsScratch)
	registerScratch(ir.OpConv2DGradBias, directPartialsScratch)
}

// directRedThreads is the block of the weight and bias gradients' partial
// kernels (8 warps).
const directRedThreads = 256

// directMaxTaps is the most taps of a weight row one partial block sums
// (registers per thread); larger windows split their taps over blocks.
const directMaxTaps = 16

// directMinPerThread is the fewest positions a partial block's thread
// takes: fewer would make the reduce's reads outweigh the sums.
const directMinPerThread = 2

// directTaps splits a weight row's khkw taps into tgn groups of at most
// directMaxTaps, tg each (balanced; the last may be short).
func directTaps(khkw int64) (tg, tgn int64) {
	tgn = divUp(khkw, directMaxTaps)
	return divUp(khkw, tgn), tgn
}

// directSplits splits q positions over a grid of rowBlocks blocks per split
// so that it fills a GPU of sms SMs (fillBlocks; wgradLegacyBlocks with no
// GPU named), each thread taking at least directMinPerThread positions:
// the splits and the most positions one takes (no split is empty).
func directSplits(q, rowBlocks, sms int64) (splits, perSplit int64) {
	want := int64(wgradLegacyBlocks)
	if sms > 0 {
		want = fillBlocks(sms, directRedThreads)
	}
	splits = min(divUp(want, rowBlocks), max(1, q/(directMinPerThread*directRedThreads)), 65535)
	perSplit = divUp(q, splits)
	return divUp(q, perSplit), perSplit
}

// directReduction is the weight (or bias) gradient's reduction at batch
// samples: the gradient's elements, the blocks per split, the splits and
// the positions per split.
func directReduction(k *directConvGeom, bias bool, batch, sms int64) (we, rowBlocks, splits, perSplit int64) {
	q := batch * k.HWO
	if bias {
		we, rowBlocks = k.O, k.O
	} else {
		_, tgn := directTaps(k.KHKW)
		we, rowBlocks = k.WElems, k.O*k.CG*tgn
	}
	splits, perSplit = directSplits(q, rowBlocks, sms)
	return we, rowBlocks, splits, perSplit
}

// directPartialsType is the partial sums' scratch, sized for the most
// splits any batch up to samples takes (a micro-batch loop's last one may
// be smaller).
func directPartialsType(k *directConvGeom, bias bool, samples, sms int64) ir.Type {
	we, _, _, _ := directReduction(k, bias, 1, sms)
	splits := maxOver(samples, func(b int64) int64 { _, _, s, _ := directReduction(k, bias, b, sms); return s })
	return ir.F32Fixed(splits, we)
}

// directPartialsScratch is the weight and bias gradients' scratch.
func directPartialsScratch(n *ir.Node, samples int64, sz sizing) (int64, error) {
	k, err := newDirectConvGeom(n, samples)
	if err != nil {
		return 0, err
	}
	return ScratchAligned(directPartialsType(k, n.Op == ir.OpConv2DGradBias, samples, sz.sms).Bytes(1)), nil
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
	// BNStats: the forward also writes batch norm's statistics partials
	// (ir.Attrs.BNStats; direct_conv_fwd_bn): BNCells flat cells of Chunk
	// values a channel, BNPartUsed of the buffer's BNPartElems floats, the
	// rest zeroed
	BNStats                 bool
	Chunk, BNCells          int64
	BNPartUsed, BNPartElems int64
	// the weight and bias gradients' partial kernels: T threads (Warps
	// warps) per block, TG taps of a weight row per block (TGN blocks per
	// row), Q positions in splits of QPer
	T, Warps, TG, TGN, Q, QPer int64
}

// doc describes the conv for a kernel's comment.
func (k *directConvGeom) doc(what string, groups int64) string {
	return fmt.Sprintf("direct conv2d %s, [B,%d,%d,%d] -> [B,%d,%d,%d], window %dx%d stride %dx%d pad %dx%d dilation %dx%d, %d groups",
		what, k.C, k.H, k.W, k.O, k.HO, k.WO, k.KH, k.KW, k.SH, k.SW, k.PH, k.PW, k.DH, k.DW, groups)
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

// newDirectConvGeom is node n's geometry at batch samples.
func newDirectConvGeom(n *ir.Node, batch int64) (*directConvGeom, error) {
	x, y := DirectConvTypes(n)
	if len(x.Dims) != 3 || len(y.Dims) != 3 {
		return nil, fmt.Errorf("codegen: %s: convolutions need [B,C,H,W] tensors", n.Text())
	}
	a := n.Attrs
	d, g := a.Dil(), a.GroupCount()
	k := &directConvGeom{B: batch, C: x.Dims[0], H: x.Dims[1], W: x.Dims[2], O: y.Dims[0], HO: y.Dims[1], WO: y.Dims[2],
		KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1], DH: d[0], DW: d[1]}
	if n.Op == ir.OpConv2DGradBias {
		k.KH, k.KW = 1, 1 // the bias gradient has no window
	}
	k.CG, k.OG = k.C/g, k.O/g
	k.HW, k.HWO, k.KHKW = k.H*k.W, k.HO*k.WO, k.KH*k.KW
	k.Elems, k.InElems, k.WElems = y.Elems(batch), x.Elems(batch), k.O*k.CG*k.KHKW
	return k, nil
}

func directConvRule(family string) rule {
	return func(e *emitter, n *ir.Node) error {
		k, err := newDirectConvGeom(n, e.batch)
		if err != nil {
			return err
		}
		k.Accumulate = e.accumulate
		x, _ := DirectConvTypes(n)
		a := n.Attrs
		g := a.GroupCount()
		shape := fmt.Sprintf("x%s_o%d_k%dx%ds%dx%dp%dx%dd%dx%d_g%d", shapeName(x.Dims), k.O, k.KH, k.KW, k.SH, k.SW, k.PH, k.PW, k.DH, k.DW, g)
		if n.Op == ir.OpConv2DGradBias {
			shape = fmt.Sprintf("o%dx%dx%d", k.O, k.HO, k.WO)
		}
		if n.Op == ir.OpConv2DGradWeight || n.Op == ir.OpConv2DGradBias {
			return directReduceRule(e, n, family, shape, g, k)
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
			if n.Attrs.BNStats && e.batch == e.prog.Batch && !e.eval && !k.Accumulate {
				// not in a micro-batch loop (the statistics then compute the cells from the output after it), nor in
				// evaluation (the running statistics)
				return directConvBNRule(e, n, family, shape, suffix, g, k)
			}
		default:
			k.launchElems, what = k.InElems, "input gradient"
		}
		k.Name = fmt.Sprintf("%s_%s_b%d%s", family, shape, e.batch, suffix)
		k.Doc = k.doc(what, g)
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

// directConvBNRule generates a direct conv forward that also writes batch
// norm's statistics partials (direct_conv_fwd_bn): flat cells of
// ops.BNChunk values of a channel's batch-major outputs (ops.BNTiling{},
// the tiling batchnorm_stats's merge then reads), a warp each.
func directConvBNRule(e *emitter, n *ir.Node, family, shape, suffix string, groups int64, k *directConvGeom) error {
	part := n.Outs[1]
	k.BNStats, k.Chunk = true, ops.BNChunk
	k.BNCells = ops.BNTiling{}.Tiles(k.B, k.HWO)
	k.BNPartUsed, k.BNPartElems = k.BNCells*k.O*ops.BNCell, part.Type.Elems(k.B)
	if k.BNPartUsed > k.BNPartElems {
		return fmt.Errorf("codegen: %s: %d cells a channel overflow the partials %s", n.Text(), k.BNCells, part.Type)
	}
	k.Name = fmt.Sprintf("%s_%s_b%d%s_bnstats", family, shape, e.batch, suffix)
	k.Doc = k.doc("forward", groups) + ", with batch norm's statistics partials"
	if err := e.kernel("direct_conv_fwd_bn", k.Name, k); err != nil {
		return err
	}
	if e.bnParts == nil {
		e.bnParts = map[*ir.Value]bnPart{}
	}
	e.bnParts[part] = bnPart{cells: k.BNCells} // flat: no Program.BNTiles entry
	var args []Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	args = append(args, buf(n.Out()), buf(part), scalarsArg)
	const warps = elementwiseBlock / 32
	e.launch(&Launch{Node: n, Kernel: k.Name, Grid: [3]uint32{uint32(divUp(k.BNCells*k.O, warps)), 1, 1}, Block: [3]uint32{elementwiseBlock, 1, 1},
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}

// directReduceRule generates the weight (or bias) gradient of a direct
// conv: the partial kernel, a block per (weight row's taps, split), then
// conv_block_wgrad_reduce adding the splits in order into dw (or db), or
// onto it in a micro-batch loop.
func directReduceRule(e *emitter, n *ir.Node, family, shape string, groups int64, k *directConvGeom) error {
	bias := n.Op == ir.OpConv2DGradBias
	we, rowBlocks, splits, perSplit := directReduction(k, bias, e.batch, e.sms)
	k.T, k.Warps, k.Q, k.QPer = directRedThreads, directRedThreads/32, e.batch*k.HWO, perSplit
	k.TG, k.TGN = 1, 1
	what := "bias gradient"
	if !bias {
		k.TG, k.TGN = directTaps(k.KHKW)
		what = "weight gradient"
	}
	k.Name = fmt.Sprintf("%s_%s_b%d_split%d", family, shape, e.batch, splits)
	k.Doc = k.doc(what, groups)
	if bias {
		k.Doc = fmt.Sprintf("direct conv2d bias gradient of [B,%d,%d,%d]", k.O, k.HO, k.WO)
	}
	if err := e.kernel(family, k.Name, k); err != nil {
		return err
	}
	partial := e.scratch(n, "partials", directPartialsType(k, bias, k.B, e.sms))
	var args []Arg
	inBytes := partial.Type.Bytes(e.batch)
	for _, v := range n.Ins {
		args = append(args, buf(v))
		inBytes += v.Type.Bytes(e.batch)
	}
	args = append(args, buf(partial))
	e.launch(&Launch{Node: n, Kernel: k.Name, Grid: [3]uint32{uint32(rowBlocks), uint32(splits), 1}, Block: [3]uint32{uint32(k.T), 1, 1},
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: inBytes})

	r := &directReduce{Splits: splits, WE: we, WElems: we, Accumulate: e.accumulate, Idx: indexType(splits * we)}
	// warps reading the splits of a block's 32 elements: about 8 splits each (as convWeightReduce)
	r.RedWarps = min(32, max(1, (splits+7)/8))
	r.RedThreads = 32 * r.RedWarps
	r.Params = "const float* __restrict__ partial, float* __restrict__ dw"
	suffix := ""
	if r.Accumulate {
		suffix = "_acc"
	}
	r.Name = fmt.Sprintf("direct_conv_reduce_n%d_split%d%s", we, splits, suffix)
	r.Doc = fmt.Sprintf("sums %d split partials of a direct conv's %d-element %s into it", splits, we, what)
	if r.Accumulate {
		r.Doc += " (added: a micro-batch's share)"
	}
	if err := e.kernel("conv_block_wgrad_reduce", r.Name, r); err != nil {
		return err
	}
	out := n.Out()
	e.launch(&Launch{Node: n, Kernel: r.Name, Grid: [3]uint32{uint32((we + 31) / 32), 1, 1}, Block: [3]uint32{uint32(r.RedThreads), 1, 1},
		Args: []Arg{buf(partial), buf(out)}, FLOPs: (splits - 1) * we, MinBytes: partial.Type.Bytes(e.batch) + 2*out.Type.Bytes(e.batch)})
	return nil
}

// directReduce is what conv_block_wgrad_reduce reads for a direct conv's
// gradient: no bias part and no fused optimizer step.
type directReduce struct {
	Name, Doc, Params, Idx string
	Splits, WE, WElems     int64
	RedWarps, RedThreads   int64
	Accumulate, Bias       bool
	Site, BiasSite         *optSite
}
