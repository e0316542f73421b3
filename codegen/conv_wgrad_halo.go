package codegen

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// The staged-region weight gradient (conv_block_wgrad_halo_tc, issue 11):
// the tensor-core weight gradient of conv_wgrad_tc.go gathers each chunk's
// im2col columns from global memory, so every input element is read about
// KH·KW times from the L2, and each column tile re-reads dy. Here a block
// reads each input element about once:
//
//   - the reduction runs over regions of WHR x WHW conv outputs of one
//     sample (WHW a multiple of the mma's k, 8 for TF32); split z of the
//     grid takes regions [z·NR/Splits, (z+1)·NR/Splits) in order;
//   - per region the block stages the input halo of its WHCT channels (at
//     most 16; the grid's x dimension is the channel tiles) once from
//     global memory into planes: plane kx·WHCT + cc holds at (halo row hr,
//     column j) the pixel (iy0 + hr, (ox0 + j)·SW + kx - PW) of channel cc —
//     the dgrad's "one copy per horizontal tap offset" trick: wmma wants a
//     fixed leading dimension and 32-byte aligned fragment pointers, and in
//     plane (kx, cc) the positions (r, j0..j0+7) of tap (ky, kx) are the 8
//     consecutive floats at halo row r·SH + ky. So the N = 16 columns of a
//     B fragment are 16 consecutive planes (WHLDX apart) and a unit of the
//     tile, (kernel row ky, planes 16nf..16nf+15), is read straight from
//     the staging: dw(o, c, ky, kx) += sum over positions dy(o, q)·x(c,
//     q + tap). Few channels share a fragment (SimpleCNN's conv1: 3
//     channels x 3 columns = 9 planes, one unit per kernel row; conv2: 16
//     channels, 48 planes, 3 units per row); u8 images (HWC) are loaded
//     channel-fastest and multiplied as integers, scaled by 1/255 at the end;
//   - it stages dy for the region once (routed through the pool's argmax
//     or the ReLU mask by conv_wgrad_dy, as the gathering kernel does), at
//     BM (16 or 32) channels of the grid's y dimension;
//   - warp w of a group owns units w·WHTPW.. of all BM rows (the A
//     fragments, dy, are loaded once per k step and feed every unit of the
//     warp: 2 A and 3 B loads per 6 mma_syncs for conv2, the gathering
//     kernel's ratio); WHGroups groups of warps (up to 8 warps a block) take
//     a region's k steps in turn and add their tiles in group order, so the
//     block's partial (BM x WHCT·KH·KW) goes to split z's scratch as the
//     gathering kernel's does, and conv_block_wgrad_reduce sums the splits
//     in a fixed order with the update fused;
//   - the bias gradient (channel tile 0) sums the staged dy rows in fp32,
//     each lane over fixed positions, then the lanes by a fixed xor tree:
//     deterministic.
//
// Leading dimensions are 8 modulo 32 floats (32 bytes modulo 128), so that
// a fragment's 16 lines of 32 bytes spread over the banks (four per
// wavefront), as in conv_wgrad_tc.go; the accumulator tiles at the end lie
// a unit apart at 8 modulo 32, so that the readout (consecutive threads,
// consecutive weights: coalesced partial stores) meets at most 3-way
// conflicts. __launch_bounds__ asks for 16 resident warps (the fill rule);
// the staging loops are not unrolled, which keeps the registers under that
// cap without spills (TestPtxasConvWeightGradHalo).
//
// When: TF32 (BF16 would stage rounded dy, and the bias sums want fp32),
// no augmentation (its per-sample boxes stay with the gathering kernel),
// kernels of more than one tap (a 1x1 conv reads each input once anyway),
// at most 16 warps, staging within maxStaticShared, and split partials no
// larger than the gathering kernel's (wgradHaloChosen: the workspace the
// memory plan sees never grows; SimpleCNN's conv2 therefore keeps the
// gathering kernel, its conv1 takes this one). Where it is taken the
// model predicts it (with its reduce) faster or as fast on every weight
// gradient of the tf32 examples it applies to (mnist, vgg_small,
// SimpleCNN; lenet5's step unchanged), e.g. on SimpleCNN's both layers at
// batches 32 and 256 (BENCHMARKS.md,
// h/wgradhalo, where conv2 took it too: conv2 21.0 -> 10.5 and 155.2 ->
// 64.7 µs, conv1 14.1 -> 9.7 and 100.8 -> 66.1 µs), since it reads x about (WHR + KH - 1)/WHR ·
// WHHC/(WHW·SW) times instead of KH·KW and dy once instead of once per
// column tile, for the same tensor-core work and fragment loads per mma.
// Its splits are often more (a region is already 32 to 256 positions) and
// so are the partials the reduce reads (conv2 at batch 32: 7.3 MB instead
// of 3.3 MB, which raised the minimal plan from 47.37 to 51.04 MB: hence
// the rule above). Choosing the kernel per plan — the larger workspace
// where the budget leaves room, as the planner weighs split updates — is
// not done.

// wgradHaloTPW is the most taps a warp multiplies per 16 rows of the tile
// (accumulators: 8 floats per fragment, at most 48 per thread).
const wgradHaloTPW = 6

// wgradHaloLDC is the row stride (floats) of the accumulator tiles in
// shared memory at the end: 16 columns, two rows a wavefront.
const wgradHaloLDC = 16

// wgradHalo is the staged-region layout (wgradTC embeds it).
type wgradHalo struct {
	WGHalo               bool  // the staged-region kernel
	WHR, WHW             int64 // conv-output rows and columns of a region (WHW a multiple of 8)
	WHTilesW, WHRegions  int64 // regions across a conv output row; per sample
	WHNR                 int64 // regions in the batch
	WHHR, WHHC           int64 // the halo's input rows and columns
	WHCT, WHNF           int64 // channels per block (at most 16); fragments of 16 planes (kx, channel) per kernel row
	WHLDX                int64 // a staged plane's stride (WHHR·WHW padded)
	WHNP, WHLDD, WHDsOff int64 // positions per region; dy's row stride; where dy lies (floats from the base)
	WHTaps, WHUnits      int64 // KH·KW; the tile's units (kernel row ky, plane fragment nf): KH·WHNF
	WHTPW, WHWarps       int64 // units per warp; warps per group (one per unit group)
	WHGroups, WHAllWarps int64 // groups of warps, each its share of a region's k steps; warps in all
	WHLDC, WHTS          int64 // the accumulators' row stride; a unit's tile stride (BM·WHLDC + 8: units on other banks)
	WHBR, WHCsFloats     int64 // bias rows per warp; the accumulator tiles' floats
}

// ld8 pads a leading dimension (floats, a multiple of 8) to 8 modulo 32.
func ld8(n int64) int64 { return n + (8-n%32+32)%32 }

// wgradHaloLayout lays out the staged-region kernel for a layer, or
// returns nil where it does not apply (see above). Regions are WHW =
// roundUp(WO / divUp(WO, 32), 8) columns wide (the fewest tiles of at
// most 32, as even as the mma's k allows) and WHR rows high: the most of
// 4, 2, 1 (at most HO) whose staging fits maxStaticShared.
func wgradHaloLayout(g *convGeom, prec Precision) *wgradHaloGeom {
	taps := g.KH * g.KW
	if prec != TF32 || g.Aug != nil || taps < 2 {
		return nil
	}
	bm := min(roundUp(g.O, 16), 32)
	fm := bm / 16
	ct := min(g.C, 16)
	nf := divUp(g.KW*ct, 16)
	units := g.KH * nf
	unitGroups := divUp(units, wgradHaloTPW/fm)
	tpw := divUp(units, unitGroups)
	warps := divUp(units, tpw)
	if warps > 16 {
		return nil
	}
	groups := max(1, 8/warps) // warps of a block: as many as 8, register-limited residency in whole blocks
	rw := roundUp(divUp(g.WO, divUp(g.WO, 32)), 8)
	for _, r := range []int64{8, 4, 2, 1} {
		if r > 1 && r > g.HO {
			continue
		}
		h := wgradHalo{WGHalo: true, WHR: r, WHW: rw, WHCT: ct, WHNF: nf, WHTaps: taps, WHUnits: units, WHTPW: tpw, WHWarps: warps,
			WHLDC: wgradHaloLDC, WHGroups: groups, WHAllWarps: groups * warps}
		h.WHTilesW = divUp(g.WO, rw)
		h.WHRegions = divUp(g.HO, r) * h.WHTilesW
		h.WHNR = g.B * h.WHRegions
		h.WHHR = (r-1)*g.SH + g.KH
		h.WHHC = (rw-1)*g.SW + g.KW
		h.WHLDX = ld8(h.WHHR * rw)
		h.WHNP = r * rw
		h.WHLDD = ld8(h.WHNP)
		h.WHDsOff = 16 * nf * h.WHLDX
		h.WHBR = divUp(bm, h.WHAllWarps)
		h.WHTS = bm*wgradHaloLDC + 8
		h.WHCsFloats = units * h.WHTS
		shared := 4*max(h.WHDsOff+bm*h.WHLDD, h.WHCsFloats) + tcAlignSlack
		if shared > maxStaticShared {
			continue
		}
		tc, err := newTCConv(prec, bm, 16, 1)
		if err != nil {
			return nil
		}
		return &wgradHaloGeom{wgradHalo: h, tc: tc, shared: shared,
			tile: gemmTile{BM: bm, BN: ct * taps, T: 32 * h.WHAllWarps}}
	}
	return nil
}

// wgradHaloGeom is a staged-region layout with its tile (BN = 16·KH·KW:
// the grid's x dimension, divUp(K, BN), is the channel tiles) and shared
// bytes.
type wgradHaloGeom struct {
	wgradHalo
	tile   gemmTile
	tc     *tcConv
	shared int64
}

// wgradHaloSplits splits the regions so that the grid fills a GPU of sms
// SMs (fillBlocks over the channel and row tiles), at most one split per
// region (mnist's small maps: a split of 4 regions left 64 blocks, 8 warps
// per SM); with no GPU named, wgradLegacyBlocks blocks at most.
func wgradHaloSplits(g *convGeom, l *wgradHaloGeom, batch, sms int64) int64 {
	nr := batch * l.WHRegions
	tiles := divUp(g.C, l.WHCT) * divUp(g.O, l.tile.BM)
	blocks := fillBlocks(sms, l.tile.T)
	if sms <= 0 {
		blocks = wgradLegacyBlocks
	}
	return min(divUp(blocks, tiles), nr, 65535)
}

// wgradHaloPartials is the staged-region kernel's scratch (wgradPartials).
func wgradHaloPartials(g *convGeom, l *wgradHaloGeom, sms int64) ir.Type {
	we := g.O * g.K
	if g.Bias {
		we += g.O
	}
	return ir.F32Fixed(maxOver(g.B, func(b int64) int64 { return wgradHaloSplits(g, l, b, sms) }), we)
}

// convBlockGradWeightHaloRule emits the staged-region kernel laid out in l.
func convBlockGradWeightHaloRule(e *emitter, n *ir.Node, p ir.BlockParts, g *convGeom, l *wgradHaloGeom) error {
	d := &convData{convGeom: g, gemmTile: l.tile, TC: l.tc, wgradTC: wgradTC{wgradHalo: l.wgradHalo, DYLoadAll: true}}
	d.DPT, d.G = 1, 1                                 // conv_wgrad_dy: one channel (m0 + grp) per call
	d.MinBlocks = divUp(fillWarpsPerSM, l.WHAllWarps) // 16 warps resident: the registers' cap
	if g.Act != "" && d.MinBlocks > 1 {
		// a folded activation's f' in the dy staging (hardswish under a
		// pool) spills a few words at that cap: one block fewer
		d.MinBlocks--
	}
	d.Splits = wgradHaloSplits(g, l, g.B, e.sms)
	return emitWeightGrad(e, n, p, d, "conv_block_wgrad_halo_tc", l.shared, wgradHaloPartials(g, l, e.sms))
}
