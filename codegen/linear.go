package codegen

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Linear blocks (ir/fused.go): three tiled GEMMs sharing one template
// (templates/linear.cu.tmpl), W being [out,in]:
//
//	linear_block             y  = x·Wᵀ (+ b) (ReLU)        M=B   N=out K=in
//	linear_block_grad_input  dX = dY'·W (· [xmask > 0])    M=B   N=in  K=out
//	linear_block_grad_weight dW = dY'ᵀ·x, dB = Σ_b dY'     M=out N=in  K=B
//
// where dY' is dOut with the block's ReLU mask (y > 0) applied while it is
// loaded, unless the gradient arrives already masked. The weight gradient
// is parallel over weight tiles (fc1 of SimpleCNN is 128x28800 at batches
// of 32..256) and sums over the batch inside each thread in batch order;
// its epilogue applies the optimizer update in place when the update is
// fused. No floating-point atomics anywhere: a step recomputed or resumed
// gives the same bits.

// GEMM tiling.
const (
	gemmThreads = 256 // a 16x16 grid of threads; each computes TMxTN outputs
	gemmBK      = 16  // k depth of the shared-memory tiles
	// Split-K (forward and input gradient only): when the output has fewer
	// tiles than fillBlocks asks of the target's SMs (16 warps per SM; on
	// tensor cores, fewer than the tcMinBlocks per SM that are resident at
	// once) and k has at least gemmSplitMinTiles tiles (a smaller GEMM is
	// not worth a second launch), the k range is split into slices of at
	// least gemmMinSliceTiles tiles, at most gemmMaxSplits of them, summed
	// by a reduce kernel in slice order. On tensor cores with the GPU
	// named, a k shallower than that (at least four slices of it: two
	// save less than their reduce costs — MobileNet-small's classifier,
	// k = 128, 5.2 µs against 3.5 + 1.8) splits too where the grid is at
	// most half the fill target: there the launch could not fill
	// otherwise and the split pays for its reduce
	// (VGG-small's fc1 input gradient at batch 128 on the H200: 256
	// blocks, 9.3 µs, split in 4: 4.5 + 2.8 µs), while nearer the
	// target it does not (the same at batch 256, 512 blocks: 9.3 µs
	// against 7.1 + 3.3; BENCHMARKS.md, "Filling the GPU on the CNN
	// examples (h/fill)").
	//
	// The reduce stays a launch of its own (here and for the conv weight
	// gradients, conv.go) rather than the "last block reduces" fix-up
	// (each split block stores its partial tile, fences, takes a ticket
	// from a per-tile counter, and the last to arrive adds the splits in
	// order and runs the epilogue): these GEMMs split because they have
	// few output tiles, so the fix-up's tail — S partial tiles read by
	// one 4-warp block after the last split ends — runs on a handful of
	// SMs where the reduce launch spreads the same bytes over the GPU. At
	// compiler/perf's rates (a lone block of 4 warps moves ~14 GB/s from
	// the L2: its 64-byte port times 4 of the 37 warps Little's law asks)
	// SimpleCNN's three reduces at batch 32 on the H200 (fc1 225 splits of
	// 4 tiles, conv2 176 of 3, conv1 528 of 1) cost 2.3, 2.8 and 3.2 µs
	// with their launch gap; the fix-up's tail would take 68, 80 and
	// 80 µs, split in two levels (√S groups, each's last block adding its
	// group) 9.6, 12.8 and 7.5 µs, as a tree of pairs 9.6, 12.0 and
	// 9.0 µs; at batch 256 fc1 (33 splits of 32 tiles) 10.2 / 4.2 / 7.2
	// µs against 2.5 (compiler/perf TestSplitKFixupTailIsSlowerThanTheReduceLaunch;
	// BENCHMARKS.md, "Split-K reduced by the last block").
	// The counters would also need bytes no other buffer reuses and that
	// are zero before the first step (the workspace is arena space, live
	// during its step only): reserved like the step's scalar block.
	gemmSplitMinTiles = 16
	gemmMinSliceTiles = 2
	gemmMaxSplits     = 512
	// With no GPU named (Options.SMs 0): split below gemmLegacyBlocks (two
	// waves of 132 SMs at 1 block each), slices of at least 8 tiles, at most
	// 128 of them, and no tile narrowing — the memory-first geometry.
	gemmLegacyBlocks     = 264
	gemmLegacySliceTiles = 8
	gemmLegacyMaxSplits  = 128
)

func init() {
	register(ir.OpLinearBlock, linearBlockRule)
	register(ir.OpLinearBlockGradInput, linearGradInputRule)
	register(ir.OpLinearBlockGradWeight, linearGradWeightRule)
	registerScratch(ir.OpLinearBlock, linearBlockScratch)
	registerScratch(ir.OpLinearBlockGradInput, linearGradInputScratch)
}

// linearBlockScratch is linearBlockRule's scratch: the split-K partial
// sums of y[b, out] = x[b, in]·Wᵀ.
func linearBlockScratch(n *ir.Node, b int64, sz sizing) (int64, error) {
	p, err := n.Parts()
	if err != nil {
		return 0, err
	}
	return splitKScratch(b, p.W.Type.Dims[0], p.W.Type.Dims[1], sz), nil
}

// linearGradInputScratch is linearGradInputRule's scratch: the split-K
// partial sums of dX[b, in] = dY[b, out]·W.
func linearGradInputScratch(n *ir.Node, b int64, sz sizing) (int64, error) {
	p, err := n.Parts()
	if err != nil {
		return 0, err
	}
	return splitKScratch(b, p.W.Type.Dims[1], p.W.Type.Dims[0], sz), nil
}

// splitKScratch is the workspace of an [m, n] = [m, k]·[k, n] GEMM that
// emitGemm splits along k (none when it does not split).
func splitKScratch(m, n, k int64, sz sizing) int64 {
	g := &gemmKernel{M: m, N: n, K: k}
	g.plan(true, sz)
	if g.Splits == 1 {
		return 0
	}
	return ScratchAligned(ir.F32Fixed(splitKRows(g, sz), n).Bytes(m))
}

// splitKRows is how many partial rows of k.N floats a split-K GEMM keeps:
// the most (splits x M) of any M up to k.M (M is the batch), so that the
// workspace planned for a micro-batch also holds a smaller last one's.
func splitKRows(k *gemmKernel, sz sizing) int64 {
	return maxOver(k.M, func(m int64) int64 {
		km := gemmKernel{M: m, N: k.N, K: k.K}
		km.plan(true, sz)
		return km.Splits * m
	})
}

// gemmKernel is the data of the linear templates.
type gemmKernel struct {
	Name, Doc, Params string
	Idx               string // index type: int or long
	M, N, K, MN       int64
	BM, BN, BK        int64 // block tile
	TM, TN            int64 // per-thread tile
	Splits, KPerSplit int64 // split-K slices (1: none) and their k length
	RW, RT            int64 // the split-K reduce: warps (threads) per block of 32 outputs
	AKM               bool  // A is stored [K][M] (else [M][K])
	BNK               bool  // B is stored [N][K] (else [K][N])
	A, B, AMask       string
	// Epilogue: forward (bias, ReLU), grad_input (maskout) or grad_weight
	// (write dW or update W, and the bias gradient with BiasGrad).
	Epilogue                      string
	Bias, ReLU, MaskOut, BiasGrad bool
	// Act is the block's folded activation other than ReLU (its kernel
	// family; "" for none) and Consts its constants: the forward epilogue
	// applies its f, the gradients its derivative through AMask (y or z);
	// SaveZ: the forward also writes z, the output before f.
	Act            string
	Consts         map[string]string
	SaveZ          bool
	Accumulate     bool     // grad_weight adds to dW/dB (micro-batch loops)
	Site, BiasSite *optSite // fused updates of W and b
	// Site4 is Site on 4 consecutive elements held in local arrays (the
	// vectorised epilogue, TC.Vec4): Site4Arrays are the pointers loaded
	// into them, NAME into NAMEv[4], and stored back.
	Site4       *optSite
	Site4Arrays []string
	TC          *tcGemm // tensor cores: the linear_gemm_tc template
}

// tcGemm is the tensor-core variant's data: 4 warps (2x2) over a BM x BN
// tile, each with FM x FN 16x16 accumulator fragments, operands staged in
// shared memory in their global layouts with leading dimensions padded by
// 16 bytes (wmma's ldm must be a multiple of 16 bytes; the padding also
// spreads rows over banks).
type tcGemm struct {
	What           string // in words, for the kernel comment
	ST, Frag       string // shared storage type; fragment element type
	Round          string // the rounding applied while staging
	KS             int64  // k per mma: 8 (TF32) or 16 (BF16)
	LDA, LDB, LDC  int64  // leading dimensions of As, Bs (elements) and Cs (floats)
	ASize          int64  // elements of As
	FM, FN, WM, WN int64
	Bytes          int64 // dynamic shared memory
	// MinBlocks is __launch_bounds__' minimum resident blocks per SM.
	MinBlocks int64
	// Vec4: the epilogue takes 4 consecutive columns a thread with 16-byte
	// loads and stores (N a multiple of 4, so every row starts aligned).
	Vec4 bool
}

// tcThreads is the block of the tensor-core GEMMs: 4 warps in a 2x2 grid.
const tcThreads = 128

// tcMinBlocks is the resident blocks per SM the tensor-core GEMMs ask
// __launch_bounds__ for: 8 blocks of 4 warps (64 registers) are the 32
// warps per SM that hide DRAM latency (compiler/perf: ~29 on the H200),
// which these GEMMs need — shallow in k (a weight gradient's k is the
// batch) or split along k, they are bound by their operands' and
// epilogue's bytes, not by the tensor cores.
const tcMinBlocks = 8

// tcBK is the k depth the tensor-core GEMMs stage per step.
const tcBK = 32

// newTCGemm lays out k's tile for tensor cores at precision p.
func newTCGemm(k *gemmKernel, p Precision) *tcGemm {
	tc := &tcGemm{What: "TF32 inputs, fp32 accumulation", ST: "float", Frag: "wmma::precision::tf32",
		Round: "wmma::__float_to_tf32", KS: 8}
	pad := int64(4) // 16 bytes
	elem := int64(4)
	if p == BF16 {
		tc.What, tc.ST, tc.Frag, tc.Round, tc.KS = "BF16 inputs, fp32 accumulation", "__nv_bfloat16", "__nv_bfloat16", "__float2bfloat16_rn", 16
		pad, elem = 8, 2
	}
	if k.AKM { // staged [BK][BM]
		tc.LDA = k.BM + pad
		tc.ASize = k.BK * tc.LDA
	} else { // [BM][BK]
		tc.LDA = k.BK + pad
		tc.ASize = k.BM * tc.LDA
	}
	bSize := k.BN * (k.BK + pad) // [BN][BK]
	tc.LDB = k.BK + pad
	if !k.BNK { // [BK][BN]
		tc.LDB = k.BN + pad
		bSize = k.BK * tc.LDB
	}
	tc.LDC = k.BN + 4
	tc.WM, tc.WN = k.BM/2, k.BN/2
	tc.FM, tc.FN = tc.WM/16, tc.WN/16
	tc.Bytes = max((tc.ASize+bSize)*elem, k.BM*tc.LDC*4)
	// More than one accumulator fragment a warp spills at 64 registers
	// through a k loop (64x32 on sm_80 at TF32, 64x64 on sm_90; capped at
	// 80 it still does) and even in one k step for the input gradient's
	// masked epilogue (the MNIST net's fc2 at batch 64); those keep no cap
	// (a 32x32 tile instead costs more shared-memory staging than the
	// residency gains). A weight gradient of one k step (k = a batch of
	// up to 32) fits 64 registers with its 64x64 tile.
	tc.MinBlocks = 1
	if tc.FM*tc.FN == 1 || k.Epilogue == "grad_weight" && k.K <= k.BK {
		tc.MinBlocks = tcMinBlocks
	}
	tc.Vec4 = k.N%4 == 0
	return tc
}

// linearTileEdge picks a block tile edge for a dimension: the smallest of 16, 32,
// 64 that covers it (so small batches and layers waste few threads), else 64.
func linearTileEdge(d int64) int64 {
	switch {
	case d <= 16:
		return 16
	case d <= 32:
		return 32
	}
	return 64
}

// divUp is a/b rounded up, for positive sizes.
func divUp(a, b int64) int64 { return (a + b - 1) / b }

// plan fills the tiling and, if split, the split-K slices; on tensor cores
// (precision sz.prec) the tile edges are 32 or 64 and the k depth tcBK;
// the splits fill sz.sms SMs.
func (k *gemmKernel) plan(split bool, sz sizing) {
	p := sz.prec
	k.MN = k.M * k.N
	k.BM, k.BN, k.BK = linearTileEdge(k.M), linearTileEdge(k.N), int64(gemmBK)
	k.TM, k.TN = k.BM/16, k.BN/16
	if p.tensor() {
		k.BM, k.BN, k.BK = max(k.BM, 32), max(k.BN, 32), tcBK
	}
	legacy := sz.sms <= 0
	target := fillBlocks(sz.sms, int64(gemmThreads))
	minSlice, maxSplits := int64(gemmMinSliceTiles), int64(gemmMaxSplits)
	if legacy {
		target, minSlice, maxSplits = gemmLegacyBlocks, gemmLegacySliceTiles, gemmLegacyMaxSplits
	}
	if p.tensor() && !legacy {
		target = fillBlocks(sz.sms, tcThreads)
		// a grid short of the fill target takes 32-wide tiles (4 warps of
		// 16x16 fragments) before it splits k
		for divUp(k.M, k.BM)*divUp(k.N, k.BN) < target && (k.BN > 32 || k.BM > 32) {
			if k.BN > 32 {
				k.BN = 32
			} else {
				k.BM = 32
			}
		}
	}
	kTiles := divUp(k.K, k.BK)
	k.Splits, k.KPerSplit = 1, kTiles*k.BK
	blocks := divUp(k.M, k.BM) * divUp(k.N, k.BN)
	shallow := kTiles < gemmSplitMinTiles // split only far from the fill, on tensor cores (above)
	switch {
	case !split || shallow && (legacy || !p.tensor() || 2*blocks > target || kTiles < 4*minSlice):
	case p.tensor() && !legacy:
		// memory-bound: split up to the blocks that are resident at once
		// (tcMinBlocks per SM, one wave: slices rounded up so the splits
		// never pass that), in slices of at least minSlice tiles
		resident := sz.sms * tcMinBlocks
		if blocks < resident {
			s := min(resident/blocks, maxSplits)
			k.KPerSplit = max(divUp(kTiles, s), minSlice) * k.BK
			k.Splits = divUp(k.K, k.KPerSplit) // no empty slice
		}
	case blocks < target:
		// slices round down, so the splits are at least s
		s := min(divUp(target, blocks), kTiles/minSlice, maxSplits)
		k.KPerSplit = max(1, kTiles/s) * k.BK
		if legacy {
			k.KPerSplit = divUp(kTiles, s) * k.BK
		}
		k.Splits = divUp(k.K, k.KPerSplit) // no empty slice
	}
	k.Idx = indexType(k.M*k.K, k.K*k.N, k.Splits*k.MN+k.MN)
	if p.tensor() {
		k.TC = newTCGemm(k, p)
	}
}

func (k *gemmKernel) grid() ([3]uint32, error) {
	gx, gy := divUp(k.N, k.BN), divUp(k.M, k.BM)
	if gx > 1<<31-1 || gy > 65535 || k.Splits > 65535 {
		return [3]uint32{}, fmt.Errorf("codegen: %s: a %dx%d GEMM needs a %dx%dx%d grid, more than CUDA allows", k.Name, k.M, k.N, gx, gy, k.Splits)
	}
	return [3]uint32{uint32(gx), uint32(gy), uint32(k.Splits)}, nil
}

func (k *gemmKernel) sharedBytes() int {
	if k.TC != nil {
		return int(k.TC.Bytes)
	}
	return int(k.BK*(k.BM+1+k.BN+1)) * 4
}

// family is the main template and threads is the block size.
func (k *gemmKernel) family() (string, uint32) {
	if k.TC != nil {
		return "linear_gemm_tc", tcThreads
	}
	return "linear_gemm", gemmThreads
}

// flags is a kernel-name suffix of the set flags: _bias_relu.
func flags(pairs ...any) string {
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1].(bool) {
			b.WriteString("_" + pairs[i].(string))
		}
	}
	return b.String()
}

func inParam(name string) string  { return "const float* __restrict__ " + name }
func outParam(name string) string { return "float* __restrict__ " + name }

// emitGemm renders and launches k. Without split-K that is one kernel
// with args; with split-K a partial-sum kernel (mainArgs + the scratch
// buffer) then the reduce kernel (the scratch buffer + reduceArgs),
// reduceParams being the reduce kernel's parameters after the partial sums.
func (e *emitter) emitGemm(n *ir.Node, k *gemmKernel, name, partialName string, mainParams []string, mainArgs []Arg,
	epilogueParams []string, epilogueArgs []Arg, mainBytes, epilogueBytes int64) error {
	grid, err := k.grid()
	if err != nil {
		return err
	}
	flops := n.FLOPs(e.batch)
	family, threads := k.family()
	if k.TC != nil {
		name += "_" + string(e.prec)
		if partialName != "" {
			partialName += "_" + string(e.prec)
		}
	}
	if k.Splits == 1 {
		k.Name = name
		k.Params = strings.Join(append(mainParams, epilogueParams...), ", ")
		if err := e.kernel(family, k.Name, k); err != nil {
			return err
		}
		e.launch(&Launch{Node: n, Kernel: k.Name, Grid: grid, Block: [3]uint32{threads, 1, 1}, SharedBytes: k.sharedBytes(),
			Args: append(mainArgs, epilogueArgs...), FLOPs: flops, MinBytes: mainBytes + epilogueBytes})
		return nil
	}
	scratch := e.scratch(n, k.Epilogue+"_splitk", ir.F32Fixed(splitKRows(k, e.sizing()), k.N))
	partial := *k
	partial.Name = partialName
	partial.Doc = "the partial sums of " + name + " per k slice."
	partial.Params = strings.Join(append(mainParams, outParam("partial")), ", ")
	if err := e.kernel(family, partial.Name, &partial); err != nil {
		return err
	}
	scratchBytes := scratch.Type.Bytes(e.batch)
	e.launch(&Launch{Node: n, Kernel: partial.Name, Grid: grid, Block: [3]uint32{threads, 1, 1}, SharedBytes: k.sharedBytes(),
		Args: append(mainArgs, buf(scratch)), FLOPs: 2 * k.M * k.N * k.K, MinBytes: mainBytes + scratchBytes})
	reduce := *k
	reduce.Name = name
	reduce.RW = min(32, max(1, (k.Splits+7)/8)) // about 8 slices per warp, up to 1024 threads
	reduce.RT = 32 * reduce.RW
	reduce.Params = strings.Join(append([]string{inParam("partial")}, epilogueParams...), ", ")
	if err := e.kernel("linear_splitk_reduce", reduce.Name, &reduce); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: reduce.Name, Grid: [3]uint32{uint32(divUp(k.MN, 32)), 1, 1}, Block: [3]uint32{uint32(reduce.RT), 1, 1},
		Args: append([]Arg{buf(scratch)}, epilogueArgs...), FLOPs: max(flops-2*k.M*k.N*k.K, 0) + (k.Splits-1)*k.MN,
		MinBytes: scratchBytes + epilogueBytes})
	return nil
}

func splitName(name string, k *gemmKernel) string {
	if k.Splits == 1 {
		return name
	}
	return fmt.Sprintf("%s_splitk%d", name, k.Splits)
}

// linearAct sets k's folded activation from block node n (Attrs.Act) and
// returns the kernel name's suffix for it.
func linearAct(n *ir.Node, k *gemmKernel) string {
	act, consts, suffix := foldedAct(&n.Attrs)
	k.Act, k.Consts = act, consts
	return suffix
}

// aMaskDoc says what the gradient kernel k does to dY as it loads it.
func aMaskDoc(k *gemmKernel) string {
	switch {
	case k.AMask == "":
		return ""
	case k.Act != "":
		return ", dY·f'(·) of the block's " + k.Act + " (through the saved y or z)"
	}
	return ", dY masked by the block's ReLU (y > 0)"
}

// linear_block(x, w, b?) -> y, z?
func linearBlockRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	a := n.Attrs
	in, outF, b := p.W.Type.Dims[1], p.W.Type.Dims[0], e.batch
	k := &gemmKernel{M: b, N: outF, K: in, A: "x", B: "w", BNK: true, Epilogue: "forward", Bias: a.Bias, ReLU: a.ReLU, SaveZ: a.SaveAct}
	act := linearAct(n, k)
	k.plan(true, e.sizing())
	shape := fmt.Sprintf("b%d_in%d_out%d", b, in, outF)
	k.Doc = fmt.Sprintf("linear block forward: y[%d,%d] = x[%d,%d]·Wᵀ", b, outF, b, in)
	if a.Bias {
		k.Doc += " + bias"
	}
	if a.ReLU {
		k.Doc += ", then ReLU"
	}
	if k.Act != "" {
		k.Doc += ", then " + k.Act
	}
	if k.SaveZ {
		k.Doc += " (z, the output before it, saved)"
	}
	k.Doc += "."
	mainParams, mainArgs := []string{inParam("x"), inParam("w")}, []Arg{buf(p.X), buf(p.W)}
	var epiParams []string
	var epiArgs []Arg
	if p.B != nil {
		epiParams, epiArgs = append(epiParams, inParam("bias")), append(epiArgs, buf(p.B))
	}
	epiParams, epiArgs = append(epiParams, outParam("y")), append(epiArgs, buf(n.Out()))
	zBytes := int64(0)
	if k.SaveZ {
		epiParams, epiArgs = append(epiParams, outParam("z")), append(epiArgs, buf(n.Outs[1]))
		zBytes = n.Outs[1].Type.Bytes(b)
	}
	name := splitName("linear_block_"+shape, k)
	if k.Splits > 1 {
		name = fmt.Sprintf("linear_block_reduce_b%d_out%d_splitk%d", b, outF, k.Splits)
	}
	name += flags("bias", a.Bias, "relu", a.ReLU) + act + flags("savez", k.SaveZ)
	return e.emitGemm(n, k, name, splitName("linear_block_partial_"+shape, k), mainParams, mainArgs, epiParams, epiArgs,
		p.X.Type.Bytes(b)+p.W.Type.Bytes(b), bytesOf(b, p.B)+n.Out().Type.Bytes(b)+zBytes)
}

// linear_block_grad_input(dOut, w, y?, xmask?) -> dX
func linearGradInputRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	in, outF, b := p.W.Type.Dims[1], p.W.Type.Dims[0], e.batch
	k := &gemmKernel{M: b, N: in, K: outF, A: "dy", B: "w", Epilogue: "grad_input", MaskOut: p.XMask != nil}
	act := linearAct(n, k)
	mainParams, mainArgs := []string{inParam("dy"), inParam("w")}, []Arg{buf(p.DOut), buf(p.W)}
	if p.Y != nil {
		k.AMask = "y"
		mainParams, mainArgs = append(mainParams, inParam("y")), append(mainArgs, buf(p.Y))
	}
	k.plan(true, e.sizing())
	k.Doc = fmt.Sprintf("linear block input gradient: dX[%d,%d] = dY[%d,%d]·W", b, in, b, outF)
	k.Doc += aMaskDoc(k)
	if p.XMask != nil {
		k.Doc += ", then masked by the producer's ReLU (x > 0)"
	}
	k.Doc += "."
	// with the maskout epilogue dx may be written over xmask (in place)
	var epiParams []string
	var epiArgs []Arg
	if p.XMask != nil {
		epiParams, epiArgs = append(epiParams, "const float* "+restrictIf(!aliasable(n, p.XMask))+"xmask"), append(epiArgs, buf(p.XMask))
	}
	epiParams, epiArgs = append(epiParams, "float* "+restrictIf(!aliasable(n, n.Out()))+"dx"), append(epiArgs, buf(n.Out()))
	shape := fmt.Sprintf("b%d_out%d_in%d", b, outF, in)
	mask := flags("relumask", p.Y != nil && k.Act == "") + act
	name := "linear_block_grad_input_" + shape + mask
	if k.Splits > 1 {
		name = fmt.Sprintf("linear_block_grad_input_reduce_b%d_in%d_splitk%d", b, in, k.Splits)
	}
	name += flags("maskout", p.XMask != nil)
	return e.emitGemm(n, k, name, splitName("linear_block_grad_input_partial_"+shape+mask, k), mainParams, mainArgs, epiParams, epiArgs,
		p.DOut.Type.Bytes(b)+p.W.Type.Bytes(b)+bytesOf(b, p.Y), bytesOf(b, p.XMask)+n.Out().Type.Bytes(b))
}

// linear_block_grad_weight(dOut, x, y?, [w, b?, state...]) -> dW, dB? (nothing when the update is fused)
func linearGradWeightRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	a := n.Attrs
	in, outF, b := p.X.Type.Dims[0], a.Out, e.batch
	k := &gemmKernel{M: outF, N: in, K: b, A: "dy", AKM: true, B: "x", Epilogue: "grad_weight", BiasGrad: a.Bias}
	act := linearAct(n, k)
	params, args := []string{inParam("dy"), inParam("x")}, []Arg{buf(p.DOut), buf(p.X)}
	if p.Y != nil {
		k.AMask = "y"
		params, args = append(params, inParam("y")), append(args, buf(p.Y))
	}
	k.plan(false, e.sizing())
	k.Doc = fmt.Sprintf("linear block weight gradient: dW[%d,%d] = dYᵀ·x over a batch of %d", outF, in, b)
	k.Doc += aMaskDoc(k)
	if a.Bias {
		k.Doc += "; dB = the batch sum of dY"
	}
	bytes := minBytes(n, b)
	name := fmt.Sprintf("linear_block_grad_weight_b%d_out%d_in%d", b, outF, in) + flags("relumask", p.Y != nil && k.Act == "") + act + flags("bias", a.Bias)
	if opt := a.Opt; opt != nil {
		k.Doc += "; then " + optDoc(opt) + ", updating W" + map[bool]string{true: " and b", false: ""}[a.Bias] + " in place."
		names := []string{"w", "b"}
		per := len(opt.StateNames())
		for i, v := range p.Params {
			params, args = append(params, outParam(names[i])), append(args, buf(v))
			bytes += v.Type.Bytes(b)
		}
		for i, v := range p.State {
			params, args = append(params, outParam(stateParams(names[i/per], opt)[i%per])), append(args, buf(v))
			bytes += v.Type.Bytes(b)
		}
		params, args = append(params, scalarsParam), append(args, scalarsArg)
		k.Site = newOptSite(opt, "v", "w", stateParams("w", opt), "at")
		if k.TC != nil && k.TC.Vec4 {
			k.Site4Arrays = append([]string{"w"}, stateParams("w", opt)...)
			var locals []string
			for _, a := range k.Site4Arrays[1:] {
				locals = append(locals, a+"v")
			}
			k.Site4 = newOptSite(opt, "v", "wv", locals, "q")
		}
		if a.Bias {
			k.BiasSite = newOptSite(opt, "v", "b", stateParams("b", opt), "m")
		}
		name += "_" + optName(opt)
	} else {
		if e.accumulate {
			k.Accumulate = true
			k.Doc += ", added to dW" + map[bool]string{true: " and dB", false: ""}[a.Bias] + " (a micro-batch's share)"
			name += "_acc"
		}
		k.Doc += "."
		params, args = append(params, outParam("dw")), append(args, buf(n.Outs[0]))
		if a.Bias {
			params, args = append(params, outParam("db")), append(args, buf(n.Outs[1]))
		}
	}
	return e.emitGemm(n, k, name, "", params, args, nil, nil, bytes, 0)
}

// bytesOf sums the sizes of the values that are present.
func bytesOf(batch int64, vs ...*ir.Value) int64 {
	var s int64
	for _, v := range vs {
		if v != nil {
			s += v.Type.Bytes(batch)
		}
	}
	return s
}
