package codegen

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Convolution blocks (ir/fused.go): conv + bias + ReLU + max-pool forward,
// the input gradient and the weight gradient with the optimizer update
// fused, all as tiled implicit GEMMs (templates/conv.cu.tmpl).
//
//   - conv_block_fwd: y(o, p) = sum over r = (c, ky, kx) of w(o, r)·x(c, p·s - pad + (ky, kx)).
//     A block computes a BM (output channels) x BN (conv outputs) tile from
//     K slices of w and of the im2col view of x staged in shared memory
//     (the im2col view is never stored: each thread gathers one column, u8
//     HWC images converted as they load). With a pool epilogue the BN
//     columns are the conv outputs under a tile of pooled outputs (with the
//     overlap of overlapping windows), kept in shared memory; only the pooled
//     values and their packed argmax reach global memory (and, for an
//     activation whose gradient reads z, z at each argmax: SaveZ).
//   - conv_block_dgrad: dx(c, i) = sum over r = (o, ky, kx) of w(o, c, ky, kx)·dy(o, (i + pad - k)/s).
//     Pixels are split into stride phases (iy mod SH, ix mod SW), whose
//     pixels all use the same taps, so a block — BM input channels x a
//     TH x TW tile of one phase — runs a dense stride-1 conv (no per-tap
//     tests, no zero products). Per chunk of output channels it gathers the
//     dy region the tile needs into shared memory — from the pooled gradient
//     through the argmax bits and the ReLU mask, so the full-resolution
//     gradient never exists in global memory.
//   - conv_block_wgrad + conv_block_wgrad_reduce: dw(o, r) = sum over
//     positions q = (b, oy, ox) of dy(o, q)·x(r, q), a GEMM whose reduction
//     runs over batch x space. The reduction is split over blockIdx.z into
//     a scratch buffer of partial sums (Program.Scratch), then the reduce
//     kernel adds the splits in a fixed order and writes dw (and db) or
//     applies the optimizer step. No float atomics: every run is bit-exact.
//     The reduce is a launch of its own, not folded into the last split
//     block to arrive: that block's serial tail is predicted slower than
//     the launch (linear.go's split-K constants say why and by how much).

func init() {
	register(ir.OpConvBlock, convBlockForwardRule)
	register(ir.OpConvBlockGradInput, convBlockGradInputRule)
	register(ir.OpConvBlockGradWeight, convBlockGradWeightRule)
	registerScratch(ir.OpConvBlockGradWeight, convBlockGradWeightScratch)
}

// convGeom is the compile-time geometry of a conv block.
type convGeom struct {
	B                            int64
	C, H, W                      int64    // block input as f32 [C,H,W]
	U8                           bool     // the input is the u8 [H,W,C] image, converted in the loads
	Aug                          *augData // and augmented there (augment.go): then [H,W] is the model's input
	O, KH, KW, SH, SW, PH, PW    int64
	HO, WO                       int64 // conv output
	Pool                         bool
	NoArgmax                     bool // a pooled inference block: no argmax written
	PKH, PKW, PSH, PSW, PPH, PPW int64
	PHO, PWO                     int64 // pooled output
	Bits, Per, BitMask           int64 // argmax bits per element, elements per 32-bit word, (1<<Bits)-1
	Bias, ReLU, HasY, MaskOut    bool
	// Act is the block's folded activation other than ReLU (its kernel
	// family, templates/activations.cu.tmpl; Consts its constants, actName
	// its name suffix); HasY then means the saved y or z its gradient
	// reads, and SaveZ that the forward block writes z (pooled: z at each
	// pooled output's argmax, which the pool epilogue keeps).
	Act     string
	Consts  map[string]string
	actName string
	SaveZ   bool
	// BNStats: the forward also writes batch norm's statistics partials
	// (ir.Attrs.BNStats; BNCells cells of each channel, BNPartUsed of the
	// buffer's BNPartElems floats, the rest zeroed)
	BNStats                          bool
	BNCells, BNPartUsed, BNPartElems int64
	BNRot                            bool // the partials' rows are read rotated (CS even: rows would share banks)
	// derived sizes
	HW, HWO, KHKW, K, PHWO int64
	WElems, PooledTotal    int64  // O·K weights; B·O·PHO·PWO pooled outputs
	Idx                    string // C index type of flat offsets
}

// newConvGeom reads a block's geometry; x is the block input's type (u8
// HWC or f32 CHW).
func newConvGeom(n *ir.Node, x ir.Type, batch int64) (*convGeom, error) {
	a := n.Attrs
	g := &convGeom{B: batch, O: a.Out, KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1],
		Bias: a.Bias, ReLU: a.ReLU, HasY: a.ReLU && !a.DOutMasked, MaskOut: a.MaskOut, SaveZ: a.SaveAct,
		BNStats: a.BNStats && n.Op == ir.OpConvBlock}
	g.Act, g.Consts, g.actName = foldedAct(&a)
	if g.Act != "" {
		g.HasY = true
	}
	switch {
	case x.DType == ir.U8 && len(x.Dims) == 3:
		g.U8, g.H, g.W, g.C = true, x.Dims[0], x.Dims[1], x.Dims[2]
		if s := a.Aug; s != nil { // the conv sees the augmented input; the rule sets g.Aug
			g.H, g.W = s.OutH, s.OutW
		}
	case x.DType == ir.F32 && len(x.Dims) == 3:
		g.C, g.H, g.W = x.Dims[0], x.Dims[1], x.Dims[2]
	default:
		return nil, fmt.Errorf("codegen: %s: block input %s is neither f32 [C,H,W] nor u8 [H,W,C]", n.Text(), x)
	}
	var ok1, ok2 bool
	g.HO, ok1 = ir.ConvOut(g.H, g.KH, g.SH, g.PH)
	g.WO, ok2 = ir.ConvOut(g.W, g.KW, g.SW, g.PW)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("codegen: %s: the kernel does not fit the input", n.Text())
	}
	if g.KH > 32 || g.KW > 32 {
		return nil, fmt.Errorf("codegen: %s: kernels larger than 32x32 are not supported", n.Text())
	}
	if p := a.Pool; p != nil {
		g.Pool, g.NoArgmax = true, a.NoArgmax
		g.PKH, g.PKW, g.PSH, g.PSW, g.PPH, g.PPW = p.Kernel[0], p.Kernel[1], p.Stride[0], p.Stride[1], p.Pad[0], p.Pad[1]
		g.PHO, ok1 = ir.ConvOut(g.HO, g.PKH, g.PSH, g.PPH)
		g.PWO, ok2 = ir.ConvOut(g.WO, g.PKW, g.PSW, g.PPW)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("codegen: %s: the pool window does not fit the conv output", n.Text())
		}
		g.Bits = ir.ArgmaxType(g.PKH * g.PKW).Bits
		if g.Bits > 16 {
			return nil, fmt.Errorf("codegen: %s: pool windows over 65536 elements are not supported", n.Text())
		}
		g.Per, g.BitMask = 32/g.Bits, 1<<g.Bits-1
		g.PHWO = g.PHO * g.PWO
		g.PooledTotal = batch * g.O * g.PHWO
	}
	g.HW, g.HWO, g.KHKW = g.H*g.W, g.HO*g.WO, g.KH*g.KW
	g.K = g.C * g.KHKW
	g.WElems = g.O * g.K
	g.Idx = indexType(batch*g.C*g.HW, batch*g.O*g.HWO, g.O*g.K)
	if forceLongIndex {
		g.Idx = "long"
	}
	return g, nil
}

// forceLongIndex makes conv and pool kernels index with 64-bit integers
// whatever their size, so that tests run that variant on shapes small
// enough for the emulator (conv_export_test.go).
var forceLongIndex = false

// name describes every compile-time property of the geometry.
func (g *convGeom) name() string {
	var b strings.Builder
	fmt.Fprintf(&b, "x%dx%dx%d", g.C, g.H, g.W)
	if g.U8 {
		b.WriteString("u8")
	}
	fmt.Fprintf(&b, "_o%d_k%dx%ds%dx%dp%dx%d", g.O, g.KH, g.KW, g.SH, g.SW, g.PH, g.PW)
	if g.Bias {
		b.WriteString("_bias")
	}
	if g.ReLU {
		b.WriteString("_relu")
	}
	b.WriteString(g.actName)
	if g.Pool {
		fmt.Fprintf(&b, "_pool%dx%ds%dx%dp%dx%d", g.PKH, g.PKW, g.PSH, g.PSW, g.PPH, g.PPW)
		if g.NoArgmax {
			b.WriteString("_noargmax")
		}
	}
	if g.BNStats {
		b.WriteString("_bnstats")
	}
	if g.Idx == "long" {
		b.WriteString("_i64")
	}
	b.WriteString(augName(g.Aug))
	return b.String()
}

// doc is the geometry in words, for kernel comments.
func (g *convGeom) doc() string {
	in := fmt.Sprintf("f32 [B,%d,%d,%d]", g.C, g.H, g.W)
	if g.U8 {
		in = fmt.Sprintf("u8 [B,%d,%d,%d] (HWC, /255 in the loads)", g.H, g.W, g.C)
	}
	s := fmt.Sprintf("conv %dx%d stride %dx%d pad %dx%d of %s to [B,%d,%d,%d]", g.KH, g.KW, g.SH, g.SW, g.PH, g.PW, in, g.O, g.HO, g.WO)
	if g.Bias {
		s += " + bias"
	}
	if g.ReLU {
		s += ", ReLU"
	}
	if g.Act != "" {
		s += ", " + g.Act
	}
	if g.Pool {
		s += fmt.Sprintf(", max-pool %dx%d stride %dx%d pad %dx%d to [B,%d,%d,%d]", g.PKH, g.PKW, g.PSH, g.PSW, g.PPH, g.PPW, g.O, g.PHO, g.PWO)
	}
	return s
}

// gemmTile: a block of T = MT·NT threads computes a BM x BN output tile,
// each thread TM x TN of it in registers.
type gemmTile struct{ BM, TM, MT, BN, TN, NT, T int64 }

// tileFor picks the tile by the GEMM's M (channels) so that small layers
// do not waste most of a 64-row tile. Every tile has 64 threads and 64
// columns, so in the forward kernel each thread gathers one im2col column.
func tileFor(m int64) gemmTile {
	switch {
	case m <= 8:
		return gemmTile{BM: 8, TM: 2, MT: 4, BN: 64, TN: 4, NT: 16, T: 64}
	case m <= 16:
		return gemmTile{BM: 16, TM: 4, MT: 4, BN: 64, TN: 4, NT: 16, T: 64}
	case m <= 32:
		return gemmTile{BM: 32, TM: 8, MT: 4, BN: 64, TN: 4, NT: 16, T: 64}
	}
	return gemmTile{BM: 64, TM: 8, MT: 8, BN: 64, TN: 8, NT: 8, T: 64}
}

// fragLoad is C code that loads n consecutive floats of shared array arr
// at offset off (a multiple of n's vector width) into dst[0..n), with
// 16-byte (8-byte for n = 2) loads.
func fragLoad(dst, arr, off string, n int64) string {
	var b strings.Builder
	if n%4 != 0 {
		for i := int64(0); i < n; i += 2 {
			fmt.Fprintf(&b, "{ const float2 v = *reinterpret_cast<const float2*>(&%s[%s + %d]); %s[%d] = v.x; %s[%d] = v.y; } ", arr, off, i, dst, i, dst, i+1)
		}
		return b.String()
	}
	for i := int64(0); i < n; i += 4 {
		fmt.Fprintf(&b, "{ const float4 v = *reinterpret_cast<const float4*>(&%s[%s + %d]); %s[%d] = v.x; %s[%d] = v.y; %s[%d] = v.z; %s[%d] = v.w; } ",
			arr, off, i, dst, i, dst, i+1, dst, i+2, dst, i+3)
	}
	return b.String()
}

const maxStaticShared = 40 << 10 // bytes of shared memory a conv kernel may use (48 KiB without opt-in)

// convData is what the conv templates read.
type convData struct {
	*convGeom
	gemmTile
	Name, Doc, Params string
	// forward: K chunks of CB channels x KHC kernel rows (BK rows of the GEMM);
	// the weights' chunk loaded by WL threads per row (consecutive columns)
	// over WRows rows at a time, WMJ x WRJ = WPT weights per thread
	BK, CB, KHC, KYChunks, NCH, WL, WRows, WMJ, WRJ, WPT, WS int64
	NTotal                                                   int64 // unpooled: B·HO·WO columns
	// forward pool epilogue: a tile of TPH x TPW pooled outputs over a
	// region of RH x RW conv outputs
	TPH, TPW, RH, RW, TilesW, TilesPerSample int64
	FullRows                                 bool
	// CS is the row stride of the conv outputs the pool reads from shared
	// memory: not a multiple of 32 banks, so that the pool's items (a
	// channel's run each) do not all hit one bank
	CS             int64
	Segs, MaxWords int64
	// KsOff: where (floats from Cs) the pool's first pass leaves each pooled
	// output's window position for the argmax words, KsStride a channel's,
	// KsSeg a run's (a tile row's; the tile's with full rows)
	KsOff, KsStride, KsSeg int64
	// dgrad: a TH x TW tile of one stride phase's pixels, KHP x KWP taps
	// per phase, OC output channels per chunk, an RH x RW dy region
	TH, TW, OC, KHP, KWP, TilesPerPhase int64
	// tensor-core dgrad: the dy region copies' plane stride; the tap rows
	// whose weights are staged at once; the stride of a tap's weights
	// (OC·WS and 32 bytes, so that the in-order stores of a warp, a few
	// channels' taps, spread over the banks); whether some phase has taps
	// past the kernel (their weights are zeros)
	DP, KHA, TS int64
	TapPad      bool
	NRX         int64 // the region columns a thread forms: ceil(RW / TW)
	// wgrad: BQ positions per chunk, Chunks of them, Splits of at most
	// QPerSplit positions (whole chunks, balanced); the reduce: RedWarps
	// warps (RedThreads threads) per block of 32 elements
	BQ, G, XPT, DPT, XS, DS, Splits, QPerSplit, Q, WE, Chunks int64
	RedWarps, RedThreads                                      int64
	Accumulate                                                bool // the reduce adds to dw/db
	// conv_mma: Rows staged rows per chunk; RowSum: also sum A's rows (the bias gradient)
	Rows           int64
	RowSum         bool
	LoadA, LoadB   string
	SharedFloats   int64
	Site, BiasSite *optSite
	// tensor cores: the layout, the staged k rows (a multiple of the mma's
	// k), the A and B tiles (C expressions) and their leading dimensions,
	// and Cs's
	TC                  *tcConv
	TCRows              int64
	TCA, TCB            string
	TCLDA, TCLDB, TCLDC int64
	XLD                 int64 // tensor-core forward: the im2col tile's row stride (tcLD)
	WLD                 int64 // tensor-core forward: the weight tile's row stride (tcRowLD; w(m0 + m, chunk row r) at m*WLD + r)
	// PoolStages: the tensor-core pooled forward's pool pass applies the
	// scale, bias and activations to each accumulator it reads, instead of a
	// pass over Cs in place before it (a read and a write of every
	// accumulator in shared memory, and a barrier)
	PoolStages bool
	// PoolPairs: with PoolStages, 2-wide windows at stride 2 read each
	// window row's two positions as one float2 (even CS and RW: aligned)
	PoolPairs bool
	TCUnroll  int64 // tc_mma's unroll of the k steps (0: all)
	// tensor-core dgrad: where the dy region's copies lie (floats from the
	// aligned base)
	DsOff int64
	// MinBlocks is __launch_bounds__'s minimum of resident blocks per SM
	// (convMinBlocks): it caps the registers ptxas may use
	MinBlocks int64
	// tensor-core pooled forward (haloTile): each chunk's input halo — CB
	// channels of HR x HC input pixels, rows HS apart, planes HP apart —
	// staged by cp.async into one of two buffers of HsFloats at HsOff
	// (floats from the aligned base), HaloIters copies per thread
	Halo                                       bool
	HR, HC, HS, HP, HsOff, HsFloats, HaloIters int64
	// without a pool (regionTile): a block's columns are RH x RW regions of
	// NS consecutive samples (NS > 1: whole small maps), their halos staged
	// side by side (sample s's channel cc at plane s·CB + cc)
	NS int64
	// tensor-core weight gradient (conv_wgrad_tc.go)
	wgradTC
}

// convMinBlocks is the resident blocks per SM a conv kernel's
// __launch_bounds__ asks for, which caps its registers at 65536 /
// (threads x blocks): fillWarpsPerSM warps' worth (8 blocks of 64 threads:
// 128 registers) when each thread keeps at most 32 accumulators (FFMA
// tiles TM x TN; tensor-core tiles FM x FN fragments of 8 per thread) —
// ptxas then fits every conv kernel of the examples and tests without
// spills — except the TF32 forward kernel, which also holds its operand
// fragments rounded in registers and gets 6 (168 registers); a bigger tile
// (64 accumulators) asks for 4, no cap below the 255 registers a thread
// may have.
func convMinBlocks(tile gemmTile, tc *tcConv, tf32Forward bool) int64 {
	acc := tile.TM * tile.TN
	if tc != nil {
		acc = tc.FM * tc.FN * 8
	}
	switch {
	case acc > 32:
		return 4
	case tf32Forward:
		return 6
	}
	return max(1, fillWarpsPerSM*32/tile.T)
}

func convBlockForwardRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	g, err := newConvGeom(n, p.X.Type, e.batch)
	if err != nil {
		return err
	}
	g.Aug = newAugData(n.Attrs.Aug, e.eval)
	if g.BNStats && (e.batch != e.prog.Batch || e.eval) {
		// a micro-batch loop's step: the statistics compute the partials from the output after the loop; evaluation's
		// statistics are the running ones
		g.BNStats = false
	}
	d := &convData{convGeom: g, gemmTile: tileFor(g.O)}
	if e.prec.tensor() {
		d.gemmTile = tcTile(g.O)
	}
	// a tensor-core block without a pool tiles output regions of its
	// samples when it can stage their halo (outputHalo)
	regions := e.prec.tensor() && outputHalo(g, e.arch)
	if regions {
		d.regionTile()
		d.gemmTile = d.regionGemmTile(e.sms)
	}
	if d.T != d.BN || d.T%d.BM != 0 {
		return fmt.Errorf("codegen: %s: tile %+v: the forward kernel needs one thread per column and whole weight rows", n.Text(), d.gemmTile)
	}
	maxBK := int64(32)
	if d.BM == 64 {
		maxBK = 18 // the 8x8 register tile plus a prefetch of 2x18 values stays clear of spills
	}
	if g.KHKW <= maxBK {
		d.KHC, d.CB = g.KH, min(g.C, max(1, maxBK/g.KHKW))
	} else {
		d.KHC, d.CB = max(1, maxBK/g.KW), 1
	}
	d.BK = d.CB * d.KHC * g.KW
	d.KYChunks = (g.KH + d.KHC - 1) / d.KHC
	d.NCH = (g.C + d.CB - 1) / d.CB * d.KYChunks
	d.weightLoad()
	d.Rows = d.BK
	d.WS = d.BM + 4
	d.SharedFloats = d.BK * (d.WS + d.BN)
	grid := [3]uint32{0, uint32((g.O + d.BM - 1) / d.BM), 1}
	if g.Pool {
		if err := d.poolTile(); err != nil {
			return fmt.Errorf("codegen: %s: %v", n.Text(), err)
		}
		d.CS = d.BN + 1
		d.SharedFloats = max(d.SharedFloats, d.epilogueFloats())
		grid[0] = uint32(g.B * d.TilesPerSample)
	} else {
		d.NTotal = g.B * g.HWO
		grid[0] = uint32((d.NTotal + d.BN - 1) / d.BN)
		if g.BNStats {
			d.bnShared()
		}
	}
	d.NS = max(d.NS, 1)
	sharedBytes := d.SharedFloats * 4
	family := "conv_block_fwd"
	if e.prec.tensor() {
		tc, err := newTCConv(e.prec, d.BM, d.BN, d.T/32)
		if err != nil {
			return fmt.Errorf("codegen: %s: %v", n.Text(), err)
		}
		d.TC, family, d.PoolStages = tc, "conv_block_fwd_tc", g.Pool
		// Ws is row-major (w's own order: a thread's weight loads go to consecutive elements of a row), so that both
		// its stores (32/WL rows of a warp WLD apart) and the row-major A loads (4 rows of 32 bytes a phase) hit
		// distinct banks: a column-major Ws, WS = BM + Pad apart, takes 2 wavefronts a phase in the A loads, and at
		// tcLD's stride its stores conflict
		d.TCRows = roundUp(d.BK, tc.KS)
		d.WLD, d.XLD = tcRowLD(d.TCRows, tc.Elem, d.WL), tcLD(d.BN, tc.Elem)
		d.TCA, d.TCB, d.TCLDA, d.TCLDB, d.TCLDC = "Ws", "Xs", d.WLD, d.XLD, tcLD(d.BN, 4)
		d.CS = d.TCLDC
		d.PoolPairs = g.Pool && g.PKW == 2 && g.PSW == 2 && d.RW%2 == 0 && d.CS%2 == 0
		d.BNRot = g.BNStats && d.CS%2 == 0
		sharedBytes = max((d.BM*d.WLD+d.TCRows*d.XLD)*tc.Elem, d.epilogueFloats()*4) + tcAlignSlack
		if halo := d.haloTile(); halo > 0 && halo <= maxStaticShared && e.arch != "sm_80" {
			d.Halo, sharedBytes = true, halo
			if e.prec == TF32 {
				// rounded TF32 fragments of every k step at once would not fit the
				// 128 registers convMinBlocks leaves without the register prefetch
				d.TCUnroll = 2
			}
		}
	}
	switch {
	case d.Halo && !g.Pool:
		grid[0] = uint32(divUp(g.B, d.NS) * d.TilesPerSample)
	case regions: // the halo did not fit: the columns are gathered, B·HO·WO of them in order
		d.RH, d.RW, d.NS, d.TilesW, d.TilesPerSample = 0, 0, 1, 0, 0
	}
	if g.BNStats {
		d.bnPartials(n.Outs[1].Type, int64(grid[0]))
	}
	if sharedBytes > maxStaticShared {
		return fmt.Errorf("codegen: %s: the conv tile needs %d bytes of shared memory", n.Text(), sharedBytes)
	}
	d.MinBlocks = convMinBlocks(d.gemmTile, d.TC, e.prec == TF32 && !d.Halo)
	d.LoadA = fragLoad("a", "Ws", fmt.Sprintf("r * %d + tm * %d", d.WS, d.TM), d.TM)
	d.LoadB = fragLoad("bv", "Xs", fmt.Sprintf("r * %d + tn * %d", d.BN, d.TN), d.TN)
	d.Name = fmt.Sprintf("conv_block_fwd_%s%s_b%d%s", g.name(), flags("savez", g.SaveZ), g.B, precName(e.prec))
	d.Doc = g.doc()
	xt := "float"
	if g.U8 {
		xt = "unsigned char"
	}
	params := []string{"const " + xt + "* __restrict__ x", "const float* __restrict__ w"}
	args := []Arg{buf(p.X), buf(p.W)}
	if g.Bias {
		params = append(params, "const float* __restrict__ bias")
		args = append(args, buf(p.B))
	}
	params = append(params, "float* __restrict__ y")
	args = append(args, buf(n.Outs[0]))
	if g.SaveZ {
		params = append(params, "float* __restrict__ zout")
		args = append(args, buf(n.Outs[len(n.Outs)-1]))
	}
	if g.Pool && !g.NoArgmax {
		params = append(params, "unsigned int* __restrict__ argmax")
		args = append(args, buf(n.Outs[1]))
	}
	if g.BNStats {
		if e.bnParts == nil {
			e.bnParts = map[*ir.Value]bnPart{}
		}
		e.bnParts[n.Outs[1]] = bnPart{d.BNCells, d.bnTiling()}
		if d.bnTiling().RH > 0 {
			if e.prog.BNTiles == nil {
				e.prog.BNTiles = map[*ir.Value]ops.BNTiling{}
			}
			e.prog.BNTiles[n.Outs[1]] = d.bnTiling()
		}
		params = append(params, "float* __restrict__ bnpart")
		args = append(args, buf(n.Outs[1]))
		if g.Aug == nil || !g.Aug.Train { // the partials count the valid samples
			params = append(params, scalarsParam)
			args = append(args, scalarsArg)
		}
	}
	params, args = augParams(g.Aug, params, args)
	d.Params = strings.Join(params, ", ")
	if err := e.kernel(family, d.Name, d); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: d.Name, Grid: grid, Block: [3]uint32{uint32(d.T), 1, 1}, SharedBytes: int(sharedBytes),
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}

// bnShared makes room for an unpooled forward block's batch norm
// partials: the epilogue stages the tile's outputs in shared memory (rows
// CS apart) and reduces each channel's row there.
func (d *convData) bnShared() {
	if d.CS == 0 {
		d.CS = d.BN + 1 // rows on distinct banks
	}
	d.SharedFloats = max(d.SharedFloats, d.BM*d.CS)
}

// bnTiling is the block's tiles as the partials' cells (ops.BNTiling):
// output regions when it stages their halo, else flat column chunks.
func (d *convData) bnTiling() ops.BNTiling {
	if !d.Halo || d.RH == 0 {
		return ops.BNTiling{}
	}
	return ops.BNTiling{RH: d.RH, RW: d.RW, NS: d.NS, TilesW: d.TilesW, TilesPerSample: d.TilesPerSample}
}

// bnPartials lays out an unpooled forward block's batch norm partials
// (ops.BNPartialsType, part of type pt): one (count, mean, M2) cell per
// tile (the grid's tiles of them) and channel. A tile of more than
// ops.BNChunk columns, or more tiles than the buffer holds cells (the
// bound ops.BNCellsPerSample assumes of the tilings), writes none: the
// statistics then compute the cells from the output, as in a micro-batch
// loop.
func (d *convData) bnPartials(pt ir.Type, tiles int64) {
	elems, t := pt.Elems(d.B), d.bnTiling()
	if d.BN > ops.BNChunk || t.RH == 0 && d.BN != ops.BNChunk || t.Tiles(d.B, d.HWO) != tiles || tiles*d.O*ops.BNCell > elems {
		d.BNStats = false // not the tiles the layout names, or more than it holds
		return
	}
	d.BNCells, d.BNPartUsed, d.BNPartElems = tiles, tiles*d.O*ops.BNCell, elems
}

// weightLoad picks how a forward block's threads load a chunk of weights
// (BM rows of BK consecutive floats, K apart): WL consecutive threads take
// consecutive columns of a row, the widest WL (up to 8: 32 bytes, a
// sector) that keeps every thread busy and holds at most 2 weights more
// than T/BM threads along each row would (BM = 32, BK = 27: 16, not 14;
// ptxas checks the spills). A warp's load then touches
// 32/WL rows, not 32 (one sector each), and its stores Ws[r*WS + m] land
// in distinct banks when WS is 4 modulo 8 and WL is 8.
func (d *convData) weightLoad() {
	minWL := d.T / d.BM // every thread has a row
	budget := divUp(d.BK, minWL)
	for wl := max(8, minWL); wl >= minWL; wl /= 2 {
		rows := d.T / wl
		if n := divUp(d.BM, rows) * divUp(d.BK, wl); n <= budget+2 || wl == minWL {
			d.WL, d.WRows, d.WMJ, d.WRJ = wl, rows, divUp(d.BM, rows), divUp(d.BK, wl)
			break
		}
	}
	d.WPT = d.WMJ * d.WRJ
}

// outputHalo says whether a tensor-core forward block without a pool
// tiles regions of its samples' outputs and stages their input halo: f32
// inputs (u8 and augmented images are converted in the gathers), kernels of
// at most 32 taps (one chunk holds whole kernels: the tile's BK limit) and
// not on sm_80, as for the pooled blocks (haloTile).
func outputHalo(g *convGeom, arch string) bool {
	return !g.Pool && !g.U8 && g.Aug == nil && g.KHKW <= 32 && arch != "sm_80"
}

// regionTile picks the output region of a forward block without a pool:
// RH x RW conv outputs of each of NS samples within the 64 columns (the
// tiles' BN), NS > 1 only when a region is a whole output map (small maps,
// 8x8 and under: the block covers several samples). It wastes the fewest
// columns over the batch's grid, then reads the fewest halo pixels per
// output.
func (d *convData) regionTile() {
	g := d.convGeom
	const bn = 64
	bestCols, bestHalo := int64(-1), int64(0)
	for rw := min(g.WO, bn); rw >= 1; rw-- {
		rh := min(g.HO, bn/rw)
		ns := int64(1)
		if rh == g.HO && rw == g.WO {
			ns = min(g.B, bn/g.HWO)
		}
		perSample := divUp(g.HO, rh) * divUp(g.WO, rw)
		cols := divUp(g.B, ns) * perSample * bn
		halo := ((rh-1)*g.SH + g.KH) * ((rw-1)*g.SW + g.KW) * 1024 / (rh * rw) // per output, in 1/1024ths
		if bestCols < 0 || cols < bestCols || cols == bestCols && halo < bestHalo {
			bestCols, bestHalo = cols, halo
			d.RH, d.RW, d.NS, d.TilesW, d.TilesPerSample = rh, rw, ns, divUp(g.WO, rw), perSample
		}
	}
}

// regionGemmTile is the tile of a forward block over output regions: at
// most 32 rows (a 64-row tile keeps 64 accumulators a thread: 4 blocks and
// 8 warps an SM), halved down to 16 while the grid would not put
// fillWarpsPerSM warps on each of sms SMs (small maps at small batches:
// more row tiles, each staging the region's halo again from L2).
func (d *convData) regionGemmTile(sms int64) gemmTile {
	g := d.convGeom
	tile := tcTile(min(g.O, 32))
	if sms <= 0 {
		return tile
	}
	regions := divUp(g.B, d.NS) * d.TilesPerSample
	for tile.BM > 16 && regions*divUp(g.O, tile.BM) < fillBlocks(sms, tile.T) {
		tile = tcTile(tile.BM / 2)
	}
	return tile
}

// haloTile lays out the input halo of a tensor-core pooled forward block
// and returns the block's shared bytes with it, or 0 when the block
// gathers its im2col columns from global memory instead (u8 or augmented
// images, kernels split into row chunks, no pool: then the columns are not
// one region of one sample). A block's conv outputs are an RH x RW region,
// so a chunk of CB channels reads only HR x HC input pixels a channel:
// staged once (coalesced, by cp.async while the previous chunk is
// multiplied) instead of every pixel gathered about KH·KW times from L2.
// The rule leaves it out on sm_80 (an A100 named): there the model
// predicts the kernel bound by shared memory, which the staging adds to
// (BENCHMARKS.md: SimpleCNN's conv2 forward 49.1 -> 56.0 µs at TF32), while
// on the H100/H200 it is bound by L2 (46.2 -> 27.3 µs); with no GPU named
// it stages.
func (d *convData) haloTile() int64 {
	g := d.convGeom
	if d.RH == 0 || g.U8 || g.Aug != nil || d.KHC != g.KH || d.TC == nil {
		return 0
	}
	d.NS = max(d.NS, 1)
	d.HR, d.HC = (d.RH-1)*g.SH+g.KH, (d.RW-1)*g.SW+g.KW
	d.HS = haloStride(d.HC, d.RH*d.RW, d.RW, g.SH, g.SW)
	d.HP = d.HR * d.HS
	d.HsFloats = roundUp(d.NS*d.CB*d.HP, 4)
	d.HsOff = roundUp((d.BM*d.WLD+d.TCRows*d.XLD)*d.TC.Elem, 16) / 4
	d.HaloIters = divUp(d.NS*d.CB*d.HR*d.HC, d.T)
	return max(4*(d.HsOff+2*d.HsFloats), d.epilogueFloats()*4) + tcAlignSlack
}

// epilogueFloats is the shared memory (floats) a forward block's epilogue
// uses: the BM conv output rows (Cs; CS apart, TCLDC with tensor cores)
// and, for a pool's argmax, each pooled output's window position (Ks, at
// KsOff, which it sets).
func (d *convData) epilogueFloats() int64 {
	cs := d.CS
	if d.TC != nil {
		cs = d.TCLDC
	}
	d.KsOff = d.BM * cs
	if !d.Pool || d.NoArgmax {
		return d.KsOff
	}
	// a run's row holds its outputs from its first one's place in its first argmax word on; the argmax pass's lanes
	// read the rows of a channel's runs KsSeg apart (whole words) and the channels KsStride apart (odd), so that
	// they fall on distinct banks
	d.KsSeg = d.MaxWords * d.Per
	d.KsStride = d.Segs*d.KsSeg | 1
	return d.KsOff + d.BM*d.KsStride
}

// haloStride is the row stride (at least hc floats, under hc + 32) at
// which the im2col reads of a halo tile take the fewest shared-memory
// wavefronts: column n < cols of the region (rw wide) reads float
// (n/rw)·sh·stride + (n%rw)·sw, a warp's 32 columns at once; a wavefront
// serves one distinct word per bank.
func haloStride(hc, cols, rw, sh, sw int64) int64 {
	best, bestWF := hc, int64(-1)
	for s := hc; s < hc+32; s++ {
		wf := int64(0)
		for w := int64(0); w < cols; w += 32 {
			words := map[int64]bool{}
			perBank := map[int64]int64{}
			most := int64(0)
			for n := w; n < min(w+32, cols); n++ {
				a := n/rw*sh*s + n%rw*sw
				if !words[a] {
					words[a] = true
					perBank[a%32]++
					most = max(most, perBank[a%32])
				}
			}
			wf += most
		}
		if bestWF < 0 || wf < bestWF {
			best, bestWF = s, wf
		}
	}
	return best
}

// poolTile picks the pooled tile of a forward block: as many pooled
// outputs as possible whose conv region fits the BN columns, whole pooled
// rows when they fit (then a plane's outputs of the tile are one run of
// argmax words).
func (d *convData) poolTile() error {
	g := d.convGeom
	best := int64(0)
	for tpw := g.PWO; tpw >= 1; tpw-- {
		rw := (tpw-1)*g.PSW + g.PKW
		if rw*g.PKH > d.BN {
			continue
		}
		tph := min(g.PHO, (d.BN/rw-g.PKH)/g.PSH+1)
		if tph*tpw > best {
			best, d.TPH, d.TPW = tph*tpw, tph, tpw
		}
	}
	if best == 0 {
		return fmt.Errorf("pool window %dx%d is larger than a conv tile of %d", g.PKH, g.PKW, d.BN)
	}
	d.RH, d.RW = (d.TPH-1)*g.PSH+g.PKH, (d.TPW-1)*g.PSW+g.PKW
	d.TilesW = (g.PWO + d.TPW - 1) / d.TPW
	d.TilesPerSample = (g.PHO + d.TPH - 1) / d.TPH * d.TilesW
	d.FullRows = d.TPW == g.PWO
	segLen := d.TPW
	d.Segs = d.TPH
	if d.FullRows {
		segLen, d.Segs = d.TPH*g.PWO, 1
	}
	d.MaxWords = (segLen + 2*g.Per - 2) / g.Per
	return nil
}

func convBlockGradInputRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	g, err := newConvGeom(n, ir.F32Batched(n.Attrs.Dims...), e.batch)
	if err != nil {
		return err
	}
	d := &convData{convGeom: g, gemmTile: tileFor(g.C)}
	if e.prec.tensor() {
		d.gemmTile = tcTile(g.C)
	}
	// stride phases: pixels (phy + SH·u, phx + SW·v) use taps (ky0 + SH·a, kx0 + SW·b), KHP x KWP of them
	d.KHP, d.KWP = (g.KH+g.SH-1)/g.SH, (g.KW+g.SW-1)/g.SW
	hu, wu := (g.H+g.SH-1)/g.SH, (g.W+g.SW-1)/g.SW // the largest phase
	d.TW = min(wu, 8)
	d.TH = min(hu, d.BN/d.TW)
	d.RH, d.RW = d.TH+d.KHP-1, d.TW+d.KWP-1
	d.WS = d.BM + 4
	d.OC = min(g.O, max(1, 64/(d.KHP*d.KWP)))
	shared := func() int64 { return 4 * d.OC * (d.KHP*d.KWP*d.WS + d.RH*d.RW) }
	family := "conv_block_dgrad"
	if e.prec.tensor() {
		if err := d.dgradTCTile(e.prec, hu, wu, e.sms); err != nil {
			return fmt.Errorf("codegen: %s: %v", n.Text(), err)
		}
		family = "conv_block_dgrad_tc"
		shared = d.dgradTCShared
	}
	for d.OC > 1 && shared() > maxStaticShared && d.TC == nil {
		d.OC /= 2
	}
	sharedBytes := shared()
	if sharedBytes > maxStaticShared {
		return fmt.Errorf("codegen: %s: the input-gradient tile needs %d bytes of shared memory", n.Text(), sharedBytes)
	}
	d.MinBlocks = convMinBlocks(d.gemmTile, d.TC, false)
	d.TilesW = (wu + d.TW - 1) / d.TW
	d.TilesPerPhase = (hu + d.TH - 1) / d.TH * d.TilesW
	d.TilesPerSample = g.SH * g.SW * d.TilesPerPhase
	d.LoadA = fragLoad("a", "Ws", fmt.Sprintf("((oc * %d + ta) * %d + tb) * %d + tm * %d", d.KHP, d.KWP, d.WS, d.TM), d.TM)
	d.Name = fmt.Sprintf("conv_block_dgrad_%s%s_b%d%s", g.name(), gradName(g), g.B, precName(e.prec))
	d.Doc = "input gradient of " + g.doc() + gradDoc(g)
	params := []string{"const float* __restrict__ dout", "const float* __restrict__ w"}
	args := []Arg{buf(p.DOut), buf(p.W)}
	params, args = appendDYArgs(g, p, params, args)
	// with the maskout epilogue dx may be written over xmask (in place)
	if g.MaskOut {
		params = append(params, "const float* "+restrictIf(!aliasable(n, p.XMask))+"xmask")
		args = append(args, buf(p.XMask))
	}
	params = append(params, "float* "+restrictIf(!aliasable(n, n.Out()))+"dx")
	args = append(args, buf(n.Out()))
	d.Params = strings.Join(params, ", ")
	if err := e.kernel(family, d.Name, d); err != nil {
		return err
	}
	grid := [3]uint32{uint32(g.B * d.TilesPerSample), uint32((g.C + d.BM - 1) / d.BM), 1}
	e.launch(&Launch{Node: n, Kernel: d.Name, Grid: grid, Block: [3]uint32{uint32(d.T), 1, 1}, SharedBytes: int(sharedBytes),
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}

// dgradTCWarps is the warps of a tensor-core input-gradient block: they
// share its staged weights and dy region.
const dgradTCWarps = 4

// dgradTCSharedCap is the shared memory a tensor-core input-gradient block
// aims to stay under (8 of them fit an SM's 228 KiB), halving its chunk of
// output channels until it does.
const dgradTCSharedCap = 24 << 10

// conflictFreeStride is the smallest leading dimension of at least n
// elements of elem bytes at which the rows of a wmma tile 16 elements wide
// fall on distinct banks: the tile is read as 16-byte chunks, 128 bytes
// (one wavefront) at a time, so consecutive rows must start 16·elem bytes
// apart modulo 128 (TF32: 16 floats mod 32; BF16: 16 mod 64), which also
// keeps every row 32-byte aligned as wmma wants.
func conflictFreeStride(n, elem int64) int64 {
	period := 128 / elem
	s := n/period*period + 16
	if s < n {
		s += period
	}
	return s
}

// dgradTCTile lays out the tensor-core input-gradient kernel: K is ordered
// (tap a, tap b, output channel), so that a k-step of KS rows is one tap
// and KS output channels, and B — dy at the tile's pixels shifted by the
// tap — is read by load_matrix_sync straight from the staged dy region, no
// im2col copy: the region is staged once per horizontal tap offset b (KWP
// copies, each TW pixels wide — 32 bytes, so that every shift by a tap row
// stays aligned, or 16 pixels where the phase's wu pixels are wider: fewer
// global sectors per warp) with the output channels DP elements apart
// (conflict-free), and a fragment's 16 pixels are 16/TW rows of the tile.
// dgradTCWarps warps split the BN pixels, each FM x FN fragments (a
// 16-row tile with phases of at most 9 taps: 2 warps of 4 where the grid
// fills the sms SMs); BN
// shrinks while the tile would be twice as tall as the phase (hu rows).
// Past dgradTCSharedCap bytes of shared memory the chunk of output
// channels halves (down to KS); past maxStaticShared, the tap rows whose
// weights are staged at once (KHA), then the tile (its fragments per warp,
// then its warps).
func (d *convData) dgradTCTile(p Precision, hu, wu, sms int64) error {
	elem := int64(4)
	if p == BF16 {
		elem = 2
	}
	d.TW = 32 / elem
	if wu > d.TW {
		d.TW = 16
	}
	layout := func(warps, fn int64) error {
		d.T, d.BN = 32*warps, warps*16*fn
		tc, err := newTCConv(p, d.BM, d.BN, warps)
		if err != nil {
			return err
		}
		d.TC = tc
		d.TH = d.BN / d.TW
		d.RH, d.RW = d.TH+d.KHP-1, d.TW+d.KWP-1
		d.NRX = (d.RW + d.TW - 1) / d.TW
		d.WS = conflictFreeStride(d.BM, elem)
		d.DP = conflictFreeStride(d.RH*d.TW, elem)
		d.TCLDC = conflictFreeStride(d.BN, 4)
		return nil
	}
	fn, warps := max(1, 2/(d.BM/16)), int64(dgradTCWarps)
	if d.BM == 16 && sms > 0 && d.KHP*d.KWP <= 9 {
		// one fragment row: 2 warps of 4 fragments rather than 4 of 2 where the grid of 64-thread blocks still fills
		// the GPU named (fillBlocks), so that each A fragment is loaded by half as many warps; phases of at most 9
		// taps (a 7x7 stride-2 conv's 16 spill at the 128 registers of 8 blocks a SM on sm_80)
		g := d.convGeom
		if blocks := g.B * g.SH * g.SW * divUp(hu, 128/d.TW) * divUp(wu, d.TW) * divUp(g.C, d.BM); blocks >= fillBlocks(sms, 64) {
			fn, warps = 4, 2
		}
	}
	for fn > 1 && warps*16*fn/2/d.TW >= hu {
		fn /= 2
	}
	if err := layout(warps, fn); err != nil {
		return err
	}
	d.OC, d.KHA = roundUp(d.O, d.TC.KS), d.KHP
	d.TapPad = d.KH%d.SH != 0 || d.KW%d.SW != 0
	for d.OC > d.TC.KS && d.dgradTCShared() > dgradTCSharedCap {
		d.OC = roundUp(d.OC/2, d.TC.KS)
	}
	for d.dgradTCShared() > maxStaticShared {
		switch {
		case d.KHA > 1:
			d.KHA = (d.KHA + 1) / 2
		case fn > 1 || warps > 1:
			if fn > 1 {
				fn /= 2
			} else {
				warps /= 2
			}
			if err := layout(warps, fn); err != nil {
				return err
			}
		default:
			return nil // the caller reports it
		}
	}
	return nil
}

// dgradTCShared is the tensor-core input-gradient kernel's shared memory
// in bytes: the weights of KHA tap rows of the chunk (KHA·KWP taps TS
// apart), then its dy
// region copies (KWP·OC planes of DP) at DsOff floats; the accumulators
// (BM rows of TCLDC floats) reuse the space.
func (d *convData) dgradTCShared() int64 {
	d.TS = d.OC*d.WS + 32/d.TC.Elem
	d.DsOff = roundUp(d.KHA*d.KWP*d.TS*d.TC.Elem, 32) / 4
	return max(4*d.DsOff+d.KWP*d.OC*d.DP*d.TC.Elem, 4*d.BM*d.TCLDC) + tcAlignSlack
}

// gradName and gradDoc describe how a backward kernel forms dy.
func gradName(g *convGeom) string {
	s := ""
	if g.HasY && g.Act == "" {
		s += "_ymask"
	}
	if g.MaskOut {
		s += "_maskout"
	}
	return s
}

func gradDoc(g *convGeom) string {
	s := "; dy from the output gradient"
	if g.Act != "" {
		s += " times f'(·) of the block's " + g.Act + " (through the saved y or z)"
	} else if g.HasY {
		s += " masked by y > 0"
	}
	if g.Pool {
		s += " routed through the packed argmax"
	}
	if g.MaskOut {
		s += "; dx masked by the input's x > 0 (the producer's ReLU)"
	}
	return s
}

// appendDYArgs adds the argmax and saved output a backward kernel reads.
func appendDYArgs(g *convGeom, p ir.BlockParts, params []string, args []Arg) ([]string, []Arg) {
	if g.Pool {
		params = append(params, "const unsigned int* __restrict__ argmax")
		args = append(args, buf(p.Argmax))
	}
	if g.HasY {
		params = append(params, "const float* __restrict__ yout")
		args = append(args, buf(p.Y))
	}
	return params, args
}

// wgradBQ is how many output positions the weight-gradient kernel
// reduces per step of its loop.
const wgradBQ = 16

// wgradTile is the weight-gradient kernel's block tile at prec.
func wgradTile(o int64, prec Precision) gemmTile {
	if prec.tensor() {
		return tcTile(o)
	}
	return tileFor(o)
}

// wgradPartials is the type of the weight-gradient kernel's scratch: a
// partial weight gradient (and bias gradient) per split of the reduction,
// sized for the most splits any batch up to g.B takes, so that the
// workspace planned for a micro-batch also holds a smaller last one's.
func wgradPartials(g *convGeom, tile gemmTile, sms int64) ir.Type {
	we := g.O * g.K
	if g.Bias {
		we += g.O
	}
	splits := maxOver(g.B, func(b int64) int64 { s, _ := wgradSplits(g, tile, wgradBQ, b, sms); return s })
	return ir.F32Fixed(splits, we)
}

// convBlockGradWeightScratch is convBlockGradWeightRule's scratch.
func convBlockGradWeightScratch(n *ir.Node, b int64, sz sizing) (int64, error) {
	p, err := n.Parts()
	if err != nil {
		return 0, err
	}
	g, err := newConvGeom(n, p.X.Type, b)
	if err != nil {
		return 0, err
	}
	if sz.prec.tensor() {
		g.Aug = newAugData(n.Attrs.Aug, false) // augmented inputs keep the gathering kernel (wgradHaloLayout)
		return ScratchAligned(wgradTCPartials(g, sz.prec, sz.sms).Bytes(b)), nil
	}
	return ScratchAligned(wgradPartials(g, wgradTile(g.O, sz.prec), sz.sms).Bytes(b)), nil
}

func convBlockGradWeightRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	g, err := newConvGeom(n, p.X.Type, e.batch)
	if err != nil {
		return err
	}
	g.Aug = newAugData(n.Attrs.Aug, e.eval)
	if e.prec.tensor() {
		return convBlockGradWeightTCRule(e, n, p, g)
	}
	d := &convData{convGeom: g, gemmTile: wgradTile(g.O, e.prec)}
	d.BQ = wgradBQ
	d.G = d.T / d.BQ
	d.XPT, d.DPT = d.BN/d.G, d.BM/d.G
	d.XS, d.DS = d.BN+4, d.BM+4
	d.Rows, d.RowSum = d.BQ, g.Bias
	d.SharedFloats = d.BQ*(d.XS+d.DS) + 2*d.BN // + the column table (two ints per column)
	d.MinBlocks = convMinBlocks(d.gemmTile, d.TC, false)
	d.LoadA = fragLoad("a", "Ds", fmt.Sprintf("r * %d + tm * %d", d.DS, d.TM), d.TM)
	d.LoadB = fragLoad("bv", "Xs", fmt.Sprintf("r * %d + tn * %d", d.XS, d.TN), d.TN)
	d.Q = g.B * g.HWO
	d.Splits, d.QPerSplit = wgradSplits(g, d.gemmTile, d.BQ, g.B, e.sms)
	d.Chunks = wgradChunks(g, d.BQ, g.B)
	return emitWeightGrad(e, n, p, d, "conv_block_wgrad", d.SharedFloats*4, wgradPartials(g, d.gemmTile, e.sms))
}

// emitWeightGrad emits a weight-gradient kernel laid out in d (its tile,
// splits and shared bytes chosen), its launch over the column tiles,
// row tiles and splits, and the reduce kernel after it.
func emitWeightGrad(e *emitter, n *ir.Node, p ir.BlockParts, d *convData, family string, sharedBytes int64, partials ir.Type) error {
	g := d.convGeom
	d.WE = g.O * g.K
	if g.Bias {
		d.WE += g.O
	}
	if indexType(d.Splits*d.WE) == "long" {
		g.Idx = "long"
	}
	d.Name = fmt.Sprintf("conv_block_wgrad_%s%s_b%d_split%d%s", g.name(), gradName(g), g.B, d.Splits, precName(e.prec))
	if d.WGHalo {
		d.Name += "_halo"
	}
	d.Doc = "weight gradient of " + g.doc() + gradDoc(g)
	xt := "float"
	if g.U8 {
		xt = "unsigned char"
	}
	params := []string{"const float* __restrict__ dout", "const " + xt + "* __restrict__ x"}
	args := []Arg{buf(p.DOut), buf(p.X)}
	params, args = appendDYArgs(g, p, params, args)
	partial := e.scratch(n, "dw_partials", partials)
	params = append(params, "float* __restrict__ partial")
	args = append(args, buf(partial))
	params, args = augParams(g.Aug, params, args)
	d.Params = strings.Join(params, ", ")
	if err := e.kernel(family, d.Name, d); err != nil {
		return err
	}
	partialBytes := partial.Type.Bytes(e.batch)
	inBytes := partialBytes
	for _, v := range []*ir.Value{p.DOut, p.X, p.Argmax, p.Y} {
		if v != nil {
			inBytes += v.Type.Bytes(e.batch)
		}
	}
	grid := [3]uint32{uint32((g.K + d.BN - 1) / d.BN), uint32((g.O + d.BM - 1) / d.BM), uint32(d.Splits)}
	e.launch(&Launch{Node: n, Kernel: d.Name, Grid: grid, Block: [3]uint32{uint32(d.T), 1, 1}, SharedBytes: int(sharedBytes),
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: inBytes})
	return convWeightReduce(e, n, p, d, partial)
}

// wgradSplits splits the weight gradient's reduction over the positions of
// batch samples so that the grid fills a GPU of sms SMs: fillBlocks (16
// warps per SM; one full wave when 8 blocks are resident, as the kernel's
// __launch_bounds__ asks) rounded up to whole splits, with at least 4
// chunks of bq positions per split: the number of splits and the most
// positions one takes. The kernel divides the chunks between the splits
// evenly (split z takes chunks z·chunks/splits up to the next's), so no
// split is empty and a grid of exactly the wanted blocks leaves no tail.
//
// With no GPU named (sms 0) the grid aims for wgradLegacyBlocks, and the
// chunks per split round up (fewer splits, smaller partials).
func wgradSplits(g *convGeom, tile gemmTile, bq, batch, sms int64) (splits, perSplit int64) {
	chunks := wgradChunks(g, bq, batch)
	tiles := (g.O + tile.BM - 1) / tile.BM * ((g.K + tile.BN - 1) / tile.BN)
	if sms <= 0 {
		want := min(divUp(wgradLegacyBlocks, tiles), max(1, chunks/4), 65535)
		chunksPer := divUp(chunks, want)
		splits = divUp(chunks, chunksPer)
	} else {
		splits = min(divUp(fillBlocks(sms, tile.T), tiles), max(1, chunks/4), 65535)
	}
	return splits, divUp(chunks, splits) * bq
}

// wgradLegacyBlocks is the blocks the weight gradient's split aims for
// when no GPU is named: a few per SM of an A100/H100, about 8 warps per SM
// (Options.SMs).
const wgradLegacyBlocks = 512

// wgradChunks is how many chunks of bq positions batch samples have.
func wgradChunks(g *convGeom, bq, batch int64) int64 { return divUp(batch*g.HWO, bq) }

// maxOver is the largest f(s) over s = 1..n: a scratch buffer sized for it
// serves every batch up to n (a micro-batch loop's last iteration may be
// smaller, and split counts do not grow with the batch monotonically).
func maxOver(n int64, f func(s int64) int64) int64 {
	best := int64(0)
	for s := int64(1); s <= n; s++ {
		best = max(best, f(s))
	}
	return best
}

// convWeightReduce emits the kernel that adds the splits' partial sums in
// order and writes dw (and db) or applies the optimizer step to the
// weight (and bias) and their state.
func convWeightReduce(e *emitter, n *ir.Node, p ir.BlockParts, wd *convData, partial *ir.Value) error {
	g := wd.convGeom
	d := &convData{convGeom: g, Splits: wd.Splits, WE: wd.WE}
	// warps reading the splits of a block's 32 elements: about 8 splits
	// each, up to a block of 1024 threads (a small layer's few blocks)
	d.RedWarps = min(32, max(1, (d.Splits+7)/8))
	d.RedThreads = 32 * d.RedWarps
	params := []string{"const float* __restrict__ partial"}
	args := []Arg{buf(partial)}
	opt := n.Attrs.Opt
	what := "grads"
	moved := partial.Type.Bytes(e.batch)
	var flops int64 = (d.Splits - 1) * d.WE
	if opt == nil {
		if e.accumulate {
			d.Accumulate = true
			what = "grads_acc" // added to dw/db: a micro-batch's share
		}
		params = append(params, "float* __restrict__ dw")
		args = append(args, buf(n.Outs[0]))
		if g.Bias {
			params = append(params, "float* __restrict__ db")
			args = append(args, buf(n.Outs[1]))
		}
		for _, v := range n.Outs {
			moved += v.Type.Bytes(e.batch)
		}
	} else {
		what = optName(opt)
		// the node's layout: the parameters, then each one's state in order
		wStates, bStates := stateParams("w", opt), stateParams("bias", opt)
		names := []string{"w"}
		if g.Bias {
			names = append(names, "bias")
		}
		names = append(names, wStates...)
		if g.Bias {
			names = append(names, bStates...)
		}
		for _, s := range names {
			params = append(params, "float* __restrict__ "+s)
		}
		for _, v := range append(append([]*ir.Value{}, p.Params...), p.State...) {
			args = append(args, buf(v))
			moved += 2 * v.Type.Bytes(e.batch) // read and written
		}
		params = append(params, scalarsParam)
		args = append(args, scalarsArg)
		d.Site = newOptSite(opt, "gradSum", "w", wStates, "at")
		if g.Bias {
			d.BiasSite = newOptSite(opt, "gradSum", "bias", bStates, "at")
		}
		info, err := opt.Info()
		if err != nil {
			return fmt.Errorf("codegen: %s: %v", n.Text(), err)
		}
		flops += info.FLOPs(opt) * d.WE
	}
	d.Idx = indexType(d.Splits * d.WE)
	if forceLongIndex {
		d.Idx = "long"
		what += "_i64"
	}
	d.Params = strings.Join(params, ", ")
	bias := ""
	d.Doc = fmt.Sprintf("sums %d split partials of the %dx%d weight gradient", d.Splits, g.O, g.K)
	if g.Bias {
		bias = "_bias"
		d.Doc += " and the bias gradient"
	}
	d.Name = fmt.Sprintf("conv_block_wgrad_reduce_o%d_k%d%s_split%d_%s", g.O, g.K, bias, d.Splits, what)
	if opt != nil {
		d.Doc += ", then " + optDoc(opt)
	} else {
		d.Doc += " into the gradient outputs"
	}
	if err := e.kernel("conv_block_wgrad_reduce", d.Name, d); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: d.Name, Grid: [3]uint32{uint32((d.WE + 31) / 32), 1, 1}, Block: [3]uint32{uint32(d.RedThreads), 1, 1},
		Args: args, FLOPs: flops, MinBytes: moved})
	return nil
}
