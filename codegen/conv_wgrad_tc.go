package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// The tensor-core weight gradient (conv_block_wgrad_tc): dw(o, r) = sum over
// positions q = (b, oy, ox) of dy(o, q)·x(r, q), an M = O by N = K = C·KH·KW
// GEMM whose reduction runs over batch x space.
// At TF32 without augmentation, for kernels of more than one tap, the
// staged-region kernel (conv_wgrad_halo.go) replaces this one: it reads
// each input element about once from the L2 instead of KH·KW times. This
// one stays for BF16, augmented images and 1x1 kernels.
//
// Each warp works alone on chunks of 16 positions: its 32 lanes load the
// chunk's dy rows and im2col columns (lane = position, so the loads are
// coalesced) into its own staging tiles and multiply them into one
// accumulator tile of BM x BN (every loaded fragment feeds FM or FN
// mma_syncs). The shared-memory model (compiler/perf) prices what that
// costs per position: BM + BN staged values and the fragment loads, both in
// conflict-free wavefronts, because
//   - dy is staged row-major (channel row m, position k at m·LDS + k), x
//     column-major (column n at n·LDS + k): a warp's store writes 16
//     consecutive positions of two rows that lie two rows apart (row ρ of
//     the tile holds channel/column π(ρ), bits 0 and 1 of ρ swapped), 64
//     words on distinct banks when 2·LDS is 16 modulo 32;
//   - a fragment load reads 16 lines of KS elements (32 bytes) LDS apart,
//     four per wavefront, on distinct banks when LDS·bytes is 32 or 96
//     modulo 128: LDS 24 for TF32, 16 for BF16;
//   - the tile is chosen for the layer (wgradTCLayout): conv1 of SimpleCNN
//     (K = 27) takes a 16 x 32 tile instead of 64 columns, conv2 (K = 144)
//     three 32 x 48 tiles.
//
// The warps of a block (Warps) take the chunks of their split in turn and
// add their tiles in warp order at the end, so a block's split covers
// Warps times the positions and the partials to reduce shrink by as much;
// the column table of the FP32 kernel is computed instead of read from
// shared memory. The bias gradient sums dy in fp32 per lane, then the lanes
// and warps in a fixed order: results are deterministic.

// wgradTC is the tensor-core weight gradient's layout (convData embeds it).
type wgradTC struct {
	WGWarps int64 // warps per block, each its own chunks and staging
	WGLDS   int64 // staging leading dimension (elements): positions of a row or column
	WGStage int64 // staging elements per warp: (BM + BN) · WGLDS
	WGRSOff int64 // floats from the aligned base: the lanes' bias sums (Warps x BM x 16)
	// DYLoadAll: conv_wgrad_dy loads dout (and yout) on every lane and selects
	DYLoadAll bool
	wgradHalo // the staged-region kernel's layout (conv_wgrad_halo.go), when WGHalo
}

// wgradTCBQ is the positions a warp stages per chunk.
const wgradTCBQ = 16

// wgradTCGeom is a tensor-core weight gradient's geometry.
type wgradTCGeom struct {
	tile gemmTile
	wgradTC
	tc          *tcConv
	ldc, shared int64 // the accumulator tiles' row stride (floats); the block's shared bytes
}

// wgradTCLayout picks the tile, the warps per block and the shared bytes of
// a tensor-core weight gradient: BM = O rounded up to 16, at most 32; BN
// (16 to 64 columns, at most 6 fragments a warp, as wide as the 128
// registers of 16 resident warps hold: wgradTCRegs within
// wgradTCRegBudget) the one with the least staging and
// fragment traffic over the layer's column tiles, divUp(K, BN)·(BM + BN)
// per position, ties to the wider; as many warps (4, 2, 1) as the
// accumulator tiles' sum fits maxStaticShared.
func wgradTCLayout(g *convGeom, prec Precision) (*wgradTCGeom, error) {
	bm := min(roundUp(g.O, 16), 32)
	bn, best := int64(0), int64(-1)
	for c := int64(16); c <= 64; c += 16 {
		if bm/16*(c/16) > 6 || c > 16 && wgradTCRegs(g, bm, c) > wgradTCRegBudget(g) {
			break
		}
		if cost := divUp(g.K, c) * (bm + c); best < 0 || cost <= best {
			bn, best = c, cost
		}
	}
	tc, err := newTCConv(prec, bm, bn, 1)
	if err != nil {
		return nil, err
	}
	l := &wgradTCGeom{tc: tc, wgradTC: wgradTC{WGLDS: 24}}
	if prec == BF16 {
		l.WGLDS = 16
	}
	l.WGStage = (bm + bn) * l.WGLDS
	l.ldc = bn + (48-bn%32)%32 // 16 modulo 32: the accumulator stores' lines on distinct banks
	shared := func(warps int64) int64 {
		cs := warps * bm * l.ldc
		if g.Bias {
			cs += warps * bm * wgradTCBQ
		}
		return max(warps*l.WGStage*tc.Elem, 4*cs) + tcAlignSlack
	}
	l.WGWarps = 4
	for l.WGWarps > 1 && shared(l.WGWarps) > maxStaticShared {
		l.WGWarps /= 2
	}
	l.shared = shared(l.WGWarps)
	if l.shared > maxStaticShared {
		return nil, fmt.Errorf("the weight-gradient tile needs %d bytes of shared memory", l.shared)
	}
	l.WGRSOff = l.WGWarps * bm * l.ldc
	l.tile = gemmTile{BM: bm, BN: bn, T: 32 * l.WGWarps}
	return l, nil
}

// wgradTCRegs estimates the registers a bm x bn tile keeps live through
// the chunk loop, in floats: the accumulators (8 per fragment), the bias
// sums and the dy values of a lane (bm/2 each), and the loads those wait
// for outside a pool window's loop (unrolled: ptxas issues them all at
// once).
func wgradTCRegs(g *convGeom, bm, bn int64) int64 {
	dpt := bm / 2
	regs := bm/16*(bn/16)*8 + dpt
	if g.Bias {
		regs += dpt
	}
	if !g.Pool {
		regs += dpt
	}
	return regs
}

// wgradTCRegBudget is the most wgradTCRegs may be: found with ptxas
// (TestConvWeightGradTensorCoresPtxas, sm_80 and sm_90, TF32, 128
// registers): SimpleCNN's conv2 (32 x 48, pooled, bias: 80) fits, an
// unpooled 1x1 conv with bias at 32 x 48 (96) spills and at 32 x 32 (80)
// does not, and with 64-bit indices a pooled 32 x 48 without bias (64)
// spills a word.
func wgradTCRegBudget(g *convGeom) int64 {
	if g.Idx == "long" {
		return 56
	}
	return 80
}

// wgradTCSplits splits the reduction's chunks of wgradTCBQ positions so
// that the grid fills a GPU of sms SMs: fillBlocks blocks (16 warps per
// SM), each warp with at least 2 chunks (4 left the MNIST net's conv2 at
// batch 256 at 12 warps per SM); with no GPU named (sms 0) about
// 2·wgradLegacyBlocks warps, as the FP32 kernel's 512 blocks of 2. The
// kernel divides the chunks between the splits evenly.
func wgradTCSplits(g *convGeom, l *wgradTCGeom, batch, sms int64) int64 {
	chunks := wgradChunks(g, wgradTCBQ, batch)
	tiles := divUp(g.O, l.tile.BM) * divUp(g.K, l.tile.BN)
	blocks := fillBlocks(sms, l.tile.T)
	if sms <= 0 {
		blocks = divUp(2*wgradLegacyBlocks, l.WGWarps)
	}
	return min(divUp(blocks, tiles), max(1, chunks/(2*l.WGWarps)), 65535)
}

// wgradTCPartials is the tensor-core kernel's scratch (wgradPartials).
func wgradTCPartials(g *convGeom, prec Precision, sms int64) ir.Type {
	if h := wgradHaloChosen(g, prec, sms); h != nil {
		return wgradHaloPartials(g, h, sms)
	}
	return wgradGatherPartials(g, prec, sms)
}

// wgradHaloChosen is the staged-region layout where it applies
// (wgradHaloLayout) and its split partials are no larger than the
// gathering kernel's, else nil: the faster kernel never raises the
// workspace the memory plan sees (SimpleCNN's conv2 at TF32 would take
// 396 splits of its whole weight gradient where the gathering kernel
// takes 176 — 4.1 MB more, which raised the minimal plan from 47.37 to
// 51.04 MB and cut the 64 MiB budget's micro-batch at batch 256 from 17
// to 7 samples). Its conv1 (27 taps of 3 channels) takes 264 splits
// against 528 and keeps it.
func wgradHaloChosen(g *convGeom, prec Precision, sms int64) *wgradHaloGeom {
	h := wgradHaloLayout(g, prec)
	if h == nil || !forceWgradHalo && wgradHaloPartials(g, h, sms).Elems(1) > wgradGatherPartials(g, prec, sms).Elems(1) {
		return nil
	}
	return h
}

// forceWgradHalo takes the staged-region kernel wherever it applies,
// whatever its partials (tests: small shapes on few SMs would otherwise
// mostly get the gathering kernel).
var forceWgradHalo = false

// wgradGatherPartials is the gathering tensor-core kernel's scratch.
func wgradGatherPartials(g *convGeom, prec Precision, sms int64) ir.Type {
	we := g.O * g.K
	if g.Bias {
		we += g.O
	}
	l, err := wgradTCLayout(g, prec)
	if err != nil {
		return ir.F32Fixed(1, we) // the rule reports the error
	}
	return ir.F32Fixed(maxOver(g.B, func(b int64) int64 { return wgradTCSplits(g, l, b, sms) }), we)
}

// convBlockGradWeightTCRule is convBlockGradWeightRule at TF32 and BF16:
// the staged-region kernel where it applies (conv_wgrad_halo.go), else
// the gathering one.
func convBlockGradWeightTCRule(e *emitter, n *ir.Node, p ir.BlockParts, g *convGeom) error {
	if h := wgradHaloChosen(g, e.prec, e.sms); h != nil {
		return convBlockGradWeightHaloRule(e, n, p, g, h)
	}
	l, err := wgradTCLayout(g, e.prec)
	if err != nil {
		return fmt.Errorf("codegen: %s: %v", n.Text(), err)
	}
	d := &convData{convGeom: g, gemmTile: l.tile, TC: l.tc, wgradTC: l.wgradTC, TCLDC: l.ldc}
	d.BQ, d.G, d.DYLoadAll = wgradTCBQ, 2, true
	d.XPT, d.DPT = d.BN/d.G, d.BM/d.G
	d.MinBlocks = fillWarpsPerSM / l.WGWarps // 128 registers
	d.Q = g.B * g.HWO
	d.Splits = wgradTCSplits(g, l, g.B, e.sms)
	d.Chunks = wgradChunks(g, d.BQ, g.B)
	d.QPerSplit = divUp(d.Chunks, d.Splits) * d.BQ
	return emitWeightGrad(e, n, p, d, "conv_block_wgrad_tc", l.shared, wgradTCPartials(g, e.prec, e.sms))
}
