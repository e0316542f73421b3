package codegen

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Batch norm (templates/batchnorm.cu.tmpl): the statistics (training: two
// passes — per (chunk of bnChunk values, channel) cells, one warp each, the
// chunk's mean and M2 into a scratch buffer, then one small block per
// channel merging them in a fixed order with Chan's update into the batch
// mean and variance, the running statistics updated in place; evaluation:
// read from the running ones) and the gradient (three passes: the same
// cells' sums of dy and dy·x̂, a block per channel adding them, dx
// elementwise). One block per channel reading the whole tensor (as
// before) kept most SMs idle: ResNet-18's first stage has 64 channels.
// The normalisation itself is an elementwise kernel bound in its op's file
// (the ReLU or other pointwise activation after it folded in by the fuse
// pass; the gradient's cells and dx passes then recompute the values
// before the activation and take its derivative, bnAct). With a max-pool
// folded in (ir.Attrs.Pool), batchnorm2d is this file's: batchnorm_apply_pool,
// a thread per pooled output normalising its window, writing the maximum,
// a packed argmax word's lanes (bnPool) combining their fields; the gradient's cells and dx
// passes then read the pooled dy and the argmax and route dy to each
// full-resolution value as they load it. All read the batch's
// valid count from the step's scalar block: a padded last batch is
// normalised over its real samples.
//
// The statistics' cells, part[(p·C + c)·2 + {mean, M2}] with cell p of
// channel c the values p·bnChunk.. of the channel's batch-major B·S, are
// the conv forward's partials layout (ops.BNPartialsType): a conv block
// (or a direct conv, flat cells: direct_conv.go) whose output only the
// batch norm reads writes its tiles' cells (a tile
// may be an output region of one or several samples: the merge derives
// each cell's count from the tiling, ops.BNTiling.Count) in its epilogue (ir.Attrs.BNStats; the statistics node's fifth
// input), and the first pass is not launched.

const bnThreads = 256 // the templates' reductions assume it

// bnChunk is the statistics' first pass's values a cell (a warp's, so a
// multiple of 32).
const bnChunk = ops.BNChunk

func init() {
	register(ops.BatchNormStats, batchNormRule)
	register(ops.BatchNormGrad, batchNormRule)
	register(ops.BatchNorm2D, batchNormApplyRule)
	registerScratch(ops.BatchNormStats, batchNormStatsScratch)
	registerScratch(ops.BatchNormGrad, batchNormGradScratch)
}

// bnKernel is what the batch norm templates read.
type bnKernel struct {
	Name, Doc     string
	B, C, S       int64
	Eps, Momentum string
	Affine        bool
	Chunk, Chunks int64 // the statistics' cells
	// the merge's cells are a conv block's tiles (RH > 0: output regions
	// of [H,W] maps; else flat chunks of Chunk values), ops.BNTiling
	ops.BNTiling
	H, W int64
	// Act is the gradient's folded activation's kernel family ("" for
	// none; its formulas are templates/activations.cu.tmpl's), YSave that
	// its gradient reads the output, Consts its constants.
	Act    string
	YSave  bool
	Consts map[string]string
	// Pool is the folded max-pool's geometry (nil: none): the pooled
	// normalisation's, and its gradient's routing of the pooled dy
	Pool *bnPool
	// the pooled normalisation's: its folded ReLU, whether it writes the
	// argmax, and its pooled outputs
	ReLU, Argmax bool
	Elems        int64
}

// bnPool is a batch norm's folded max-pool (ir.Attrs.Pool) over [H,W] maps
// (HW values) into [HO,WO] (HWO), and its packed argmax's Bits an output,
// Per a 32-bit word and BitMask (codegen/argmax.go).
type bnPool struct {
	H, W, HO, WO, HW, HWO, KH, KW, SH, SW, PH, PW int64
	Bits, Per, BitMask                            int64
}

// newBNPool is the pool geometry of batch norm x [C,H,W] with attributes a
// (nil without Attrs.Pool).
func newBNPool(a *ir.Attrs, x ir.Type) *bnPool {
	pw := a.Pool
	if pw == nil {
		return nil
	}
	ho, _ := ir.ConvOut(x.Dims[1], pw.Kernel[0], pw.Stride[0], pw.Pad[0])
	wo, _ := ir.ConvOut(x.Dims[2], pw.Kernel[1], pw.Stride[1], pw.Pad[1])
	bits := ir.ArgmaxType(pw.Kernel[0] * pw.Kernel[1]).Bits
	return &bnPool{H: x.Dims[1], W: x.Dims[2], HO: ho, WO: wo, HW: x.Dims[1] * x.Dims[2], HWO: ho * wo,
		KH: pw.Kernel[0], KW: pw.Kernel[1], SH: pw.Stride[0], SW: pw.Stride[1], PH: pw.Pad[0], PW: pw.Pad[1],
		Bits: bits, Per: 32 / bits, BitMask: 1<<bits - 1}
}

// suffix names the pool in kernel names.
func (p *bnPool) suffix() string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("_pool%dx%ds%dx%dp%dx%d", p.KH, p.KW, p.SH, p.SW, p.PH, p.PW)
}

// batchNormApplyRule: batchnorm2d's normalisation, the elementwise
// batchnorm_apply kernel (ops.BNApplyKernel) — or, with a folded max-pool,
// batchnorm_apply_pool: a thread per pooled output normalises (and
// activates) its window and writes the maximum; the lanes of an argmax
// word pack it with shuffles.
func batchNormApplyRule(e *emitter, n *ir.Node) error {
	x := n.Ins[0].Type
	pool := newBNPool(&n.Attrs, x)
	if pool == nil {
		return elementwiseRule(ops.BNApplyKernel)(e, n)
	}
	k := &bnKernel{B: e.batch, C: x.Dims[0], S: pool.HW, Affine: len(n.Ins) == 5, Pool: pool, ReLU: n.Attrs.ReLU,
		Argmax: len(n.Outs) == 2, Elems: n.Out().Type.Elems(e.batch)}
	k.Name = fmt.Sprintf("batchnorm_apply_pool_%s_b%d_%s", shapeName(x.Dims), e.batch, ops.BNApplyKernel.Suffix(n))
	act, consts, suffix := foldedAct(&n.Attrs)
	k.Act, k.Consts = act, consts
	if act != "" {
		k.Name = strings.TrimSuffix(k.Name, "_"+act) + suffix
	}
	k.Name += pool.suffix()
	if !k.Argmax {
		k.Name += "_noargmax"
	}
	k.Doc = fmt.Sprintf("batch norm over [B,%s] (B = %d) with the max-pool after it folded in", shapeName(x.Dims), e.batch)
	if err := e.kernel("batchnorm_apply_pool", k.Name, k); err != nil {
		return err
	}
	var args []Arg
	for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
		args = append(args, buf(v))
	}
	e.launch(&Launch{Node: n, Kernel: k.Name, Grid: gridFor(k.Elems, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}

// bnCells is the gradient's scratch: two sums per chunk and channel.
func bnCells(c, s, batch int64) ir.Type {
	return ir.F32Fixed(c, (batch*s+bnChunk-1)/bnChunk, 2)
}

// bnStatsCells is the statistics' scratch: (mean, M2) per chunk and
// channel.
func bnStatsCells(c, s, batch int64) ir.Type {
	return ir.F32Fixed((batch*s+bnChunk-1)/bnChunk, c, ops.BNCell)
}

// batchNormStatsScratch is batchNormRule's scratch for the training
// statistics (samples: the batch; evaluation's kernel needs none, and a
// plan's workspace holding it costs a few bytes per value of the batch).
func batchNormStatsScratch(n *ir.Node, samples int64, _ sizing) (int64, error) {
	if len(n.Ins) == 5 {
		return 0, nil // the cells are the conv block's partials (its output, which the first pass fills when the block ran in a micro-batch loop)
	}
	c, s := n.Ins[0].Type.Dims[0], n.Ins[0].Type.SampleElems()/n.Ins[0].Type.Dims[0]
	return ScratchAligned(bnStatsCells(c, s, samples).Bytes(1)), nil
}

func batchNormRule(e *emitter, n *ir.Node) error {
	if e.accumulate {
		return fmt.Errorf("codegen: %s: batch norm cannot run in a micro-batch loop", n.Text())
	}
	x := n.Ins[0].Type
	family := "batchnorm_stats"
	if n.Op == ops.BatchNormGrad {
		family, x = "batchnorm_grad", n.Ins[1].Type
		if e.eval {
			return fmt.Errorf("codegen: %s: no gradient in evaluation", n.Text())
		}
	} else if e.eval {
		family = "batchnorm_stats_eval"
	}
	k := &bnKernel{B: e.batch, C: x.Dims[0], S: x.SampleElems() / x.Dims[0], Affine: n.Attrs.Bias, Chunk: bnChunk}
	if n.Op == ops.BatchNormGrad {
		k.Pool = newBNPool(&n.Attrs, x) // dy is the folded pool's output's gradient
	}
	k.Chunks = (k.B*k.S + bnChunk - 1) / bnChunk
	k.Eps, k.Momentum = cFloat(n.Attrs.Eps), cFloat(n.Attrs.Momentum)
	switch family {
	case "batchnorm_grad":
		k.Name = fmt.Sprintf("%s_%s_b%d", family, shapeName(x.Dims), e.batch)
		if k.Affine {
			k.Name += "_affine"
		}
		k.Name += bnAct(n, k) + k.Pool.suffix()
		k.Doc = fmt.Sprintf("batch norm gradient over [B,%s] (B = %d, valid at run time)", shapeName(x.Dims), e.batch)
	default:
		k.Name = fmt.Sprintf("%s_%s_b%d_eps%s_m%s", family, shapeName(x.Dims), e.batch, nameNumber(n.Attrs.Eps), nameNumber(n.Attrs.Momentum))
		if part, ok := e.bnParts[n.Ins[len(n.Ins)-1]]; family == "batchnorm_stats" && len(n.Ins) == 5 && ok {
			k.Chunks, k.BNTiling = part.cells, part.tiling // the conv block's tiles' cells
			k.H, k.W = x.Dims[1], x.Dims[2]
			k.Name += fmt.Sprintf("_cells%d", part.cells)
			if t := part.tiling; t.RH > 0 {
				k.Name += fmt.Sprintf("_r%dx%dx%d", t.RH, t.RW, t.NS)
			}
		}
		k.Doc = fmt.Sprintf("batch norm statistics over [B,%s] (B = %d, valid at run time), eps %g, momentum %g", shapeName(x.Dims), e.batch, n.Attrs.Eps, n.Attrs.Momentum)
	}
	if err := e.kernel(family, k.Name, k); err != nil {
		return err
	}
	var args []Arg
	for _, v := range n.Ins[:min(len(n.Ins), 4)] { // not the statistics' partials (the fifth): they replace x below
		args = append(args, buf(v))
	}
	for _, v := range n.Outs {
		args = append(args, buf(v))
	}
	args = append(args, scalarsArg) // the batch's valid count
	grid, block := [3]uint32{uint32(k.C), 1, 1}, [3]uint32{bnThreads, 1, 1}
	flops, bytes := n.FLOPs(e.batch), minBytes(n, e.batch)
	switch family {
	case "batchnorm_stats_eval":
		grid = gridFor(k.C, elementwiseBlock)
		block = [3]uint32{elementwiseBlock, 1, 1}
	case "batchnorm_grad":
		return batchNormGradPasses(e, n, k)
	case "batchnorm_stats":
		// the first pass reads x into the cells (unless the conv block before wrote them); the merge reads the cells
		flops, bytes = 8*k.C*k.Chunks, bytes-n.Ins[0].Type.Bytes(e.batch)
		cells := n.Ins[len(n.Ins)-1]
		if _, ok := e.bnParts[cells]; len(n.Ins) == 4 || !ok {
			if len(n.Ins) == 4 {
				cells = e.scratch(n, "cells", bnStatsCells(k.C, k.S, e.batch))
			} // else the conv block ran in a micro-batch loop: its partials' buffer (large enough) takes the cells
			if err := batchNormCells(e, n, k, cells); err != nil {
				return err
			}
			bytes += cells.Type.Bytes(e.batch)
		}
		args[0] = buf(cells)
	}
	e.launch(&Launch{Node: n, Kernel: k.Name, Grid: grid, Block: block, SharedBytes: 0,
		Args: args, FLOPs: flops, MinBytes: bytes})
	return nil
}

// batchNormGradScratch is batchNormRule's scratch for the gradient: the
// cells' sums, then the channels'.
func batchNormGradScratch(n *ir.Node, samples int64, _ sizing) (int64, error) {
	x := n.Ins[1].Type
	c, s := x.Dims[0], x.SampleElems()/x.Dims[0]
	return ScratchAligned(bnCells(c, s, samples).Bytes(1)) + ScratchAligned(ir.F32Fixed(c, 2).Bytes(1)), nil
}

// batchNormGradPasses launches the gradient's three passes: the cells'
// sums of dy and dy·x̂, the channels' (and the parameters' gradients),
// then dx elementwise (k is the last's kernel, already rendered).
func batchNormGradPasses(e *emitter, n *ir.Node, k *bnKernel) error {
	dy, x, mean, invstd := n.Ins[0], n.Ins[1], n.Ins[2], n.Ins[3]
	cells := e.scratch(n, "cells", bnCells(k.C, k.S, e.batch))
	sums := e.scratch(n, "sums", ir.F32Fixed(k.C, 2))
	shape := fmt.Sprintf("%s_b%d", shapeName(x.Type.Dims), e.batch)
	pk, rk := *k, *k
	pk.Name, pk.Doc = "batchnorm_grad_partial_"+shape, k.Doc+": the cells' sums"
	rk.Name, rk.Doc = "batchnorm_grad_reduce_"+shape, k.Doc+": the channels' sums"
	if k.Affine {
		rk.Name += "_affine"
	}
	var wb []Arg // the folded activation's z reads weight and bias
	if k.Act != "" {
		if k.Affine {
			pk.Name += "_affine"
			wb = []Arg{buf(n.Ins[4]), buf(n.Ins[5])}
		}
		pk.Name += bnAct(n, &pk)
	}
	pk.Name += k.Pool.suffix()
	var am []Arg // a folded pool's argmax, for routing the pooled dy
	if k.Pool != nil {
		am = []Arg{buf(n.Ins[len(n.Ins)-1])}
	}
	if err := e.kernel("batchnorm_grad_partial", pk.Name, &pk); err != nil {
		return err
	}
	if err := e.kernel("batchnorm_grad_reduce", rk.Name, &rk); err != nil {
		return err
	}
	const warps = bnThreads / 32
	xBytes, cellBytes := x.Type.Bytes(e.batch), cells.Type.Bytes(e.batch)
	e.launch(&Launch{Node: n, Kernel: pk.Name, Grid: [3]uint32{uint32((k.C*k.Chunks + warps - 1) / warps), 1, 1},
		Block: [3]uint32{bnThreads, 1, 1}, Args: append(append(append([]Arg{buf(dy), buf(x), buf(mean), buf(invstd)}, wb...), am...), buf(cells), scalarsArg),
		FLOPs: 5 * x.Type.Elems(e.batch), MinBytes: 2*xBytes + cellBytes})
	rargs := []Arg{buf(cells), buf(sums)}
	if k.Affine {
		rargs = append(rargs, buf(n.Outs[1]), buf(n.Outs[2]))
	}
	e.launch(&Launch{Node: n, Kernel: rk.Name, Grid: [3]uint32{uint32(k.C), 1, 1}, Block: [3]uint32{bnThreads, 1, 1},
		Args: append(rargs, scalarsArg), FLOPs: 2 * k.C * k.Chunks, MinBytes: cellBytes + 4*k.C*4})
	args := append([]Arg{buf(dy), buf(x), buf(mean), buf(invstd)}, wb...)
	if k.Affine && k.Act == "" {
		args = append(args, buf(n.Ins[4]))
	}
	args = append(append(args, am...), buf(sums), buf(n.Outs[0]), scalarsArg)
	e.launch(&Launch{Node: n, Kernel: k.Name, Grid: gridFor(x.Type.Elems(e.batch), elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
		Args: args, FLOPs: 5 * x.Type.Elems(e.batch), MinBytes: 3 * xBytes})
	return nil
}

// bnAct sets k's folded activation from gradient node n (Attrs.Act) and
// returns the kernel name's suffix for it: the family and its constants.
func bnAct(n *ir.Node, k *bnKernel) string {
	act, consts, suffix := foldedAct(&n.Attrs)
	if act == "" {
		return ""
	}
	k.Act, k.Consts = act, consts
	k.YSave = ops.PointwiseOf(n.Attrs.Act).SaveOutput
	return suffix
}

// foldedAct is the kernel family of the activation folded into a node with
// attributes a (Attrs.Act; "" for none), its constants as C float literals
// (what templates/activations.cu.tmpl's formulas read as .Consts), and a
// kernel name's suffix for both.
func foldedAct(a *ir.Attrs) (string, map[string]string, string) {
	act := ops.BNActKernel(a)
	if act == "" {
		return "", nil, ""
	}
	consts := map[string]string{}
	suffix := "_" + act
	for _, c := range ops.BNActConsts(a) {
		consts[c.Name] = cFloat(c.Value)
		suffix += fmt.Sprintf("_%s%s", strings.ToLower(c.Name), nameNumber(c.Value))
	}
	return act, consts, suffix
}

// batchNormCells launches the statistics' first pass: x into the cells.
func batchNormCells(e *emitter, n *ir.Node, k *bnKernel, cells *ir.Value) error {
	pk := *k
	pk.Name = fmt.Sprintf("batchnorm_stats_partial_%s_b%d", shapeName(n.Ins[0].Type.Dims), e.batch)
	pk.Doc = fmt.Sprintf("batch norm statistics' cells over [B,%s] (B = %d, valid at run time)", shapeName(n.Ins[0].Type.Dims), e.batch)
	if err := e.kernel("batchnorm_stats_partial", pk.Name, &pk); err != nil {
		return err
	}
	const warps = bnThreads / 32
	blocks := (k.C*k.Chunks + warps - 1) / warps
	x := n.Ins[0]
	e.launch(&Launch{Node: n, Kernel: pk.Name, Grid: [3]uint32{uint32(blocks), 1, 1}, Block: [3]uint32{bnThreads, 1, 1},
		Args: []Arg{buf(x), buf(cells), scalarsArg}, FLOPs: n.FLOPs(e.batch), MinBytes: x.Type.Bytes(e.batch) + cells.Type.Bytes(e.batch)})
	return nil
}
