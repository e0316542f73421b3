package codegen

import "fmt"

// Tensor cores. At TF32 or BF16 precision (Options.Precision) the
// GEMM-shaped kernels — the linear blocks and the convolution blocks'
// implicit GEMMs — multiply with nvcuda::wmma fragments (m16n16k8 TF32,
// m16n16k16 BF16, fp32 accumulation) instead of FFMA register tiles. The
// fragments are touched only by fill/load/store/mma_sync and by rounding
// applied alike to every element, so no kernel depends on the hardware's
// fragment layout (the emulator's race orders permute it to check). Tiles
// are staged in shared memory as before; the accumulators reach the
// epilogues through shared memory.

// tcConv is a conv kernel's tensor-core layout: the warps split the BN
// columns, each warp keeps FM x FN 16x16 accumulators.
type tcConv struct {
	What      string // in words, for the kernel comment
	ST, Frag  string // shared storage type of the operand tiles; fragment element type
	Round     string // applied to each value staged (BF16: the conversion; TF32: none, fragments are rounded)
	FragRound bool   // round each loaded fragment to TF32
	KS        int64  // k per mma
	Pad       int64  // padding of a leading dimension (16 bytes, in elements)
	Elem      int64  // bytes per staged element
	FM, FN    int64
	WN        int64 // columns per warp
}

// newTCConv lays out a tile of bm rows (a multiple of 16) and bn columns
// split between warps warps.
func newTCConv(p Precision, bm, bn, warps int64) (*tcConv, error) {
	tc := &tcConv{What: "TF32 inputs, fp32 accumulation", ST: "float", Frag: "wmma::precision::tf32", FragRound: true, KS: 8, Pad: 4, Elem: 4}
	if p == BF16 {
		tc = &tcConv{What: "BF16 inputs, fp32 accumulation", ST: "__nv_bfloat16", Frag: "__nv_bfloat16", Round: "__float2bfloat16_rn",
			KS: 16, Pad: 8, Elem: 2}
	}
	if bm%16 != 0 || bn%(16*warps) != 0 {
		return nil, fmt.Errorf("codegen: a %dx%d tile does not split into 16x16 fragments over %d warps", bm, bn, warps)
	}
	tc.WN = bn / warps
	tc.FM, tc.FN = bm/16, tc.WN/16
	return tc, nil
}

// tcLD is the leading dimension (elements of elem bytes, at least n) of a
// shared tile that wmma loads or stores 16 elements a line from (the rows
// of a row-major tile, the columns of a column-major one): a multiple of 16
// bytes, as wmma wants, whose lines fall on the banks so that each phase of
// 8 16-byte chunks (the emulator's and the GPU's) takes one wavefront —
// consecutive lines 16 elements' worth of banks apart, modulo 32 banks (tf32
// and fp32: 16 banks, 2 lines a phase; bf16: 8 banks, 4 lines a phase).
func tcLD(n, elem int64) int64 {
	lineWords := 16 * elem / 4
	for ld := roundUp(n, 16/elem); ; ld += 16 / elem {
		if sh := ld * elem / 4 % 32; sh == lineWords || sh == 32-lineWords {
			return ld
		}
	}
}

// tcRowLD is the row stride (elements of elem bytes, at least n) of a
// row-major matrix_a tile whose wmma loads read ks elements a row (32
// bytes: tf32 k8, bf16 k16) and which a warp stores wl consecutive
// elements of a row at a time, 32/wl rows stride apart (the forward conv's
// weight staging): a multiple of 16 bytes whose 4 rows of a load phase
// fall on distinct banks (the stride 8 or 24 banks modulo 32) and, where
// one exists within a few steps, whose stores hit distinct banks too.
func tcRowLD(n, elem, wl int64) int64 {
	step := 16 / elem
	first := int64(0)
	for ld := roundUp(n, step); ld < roundUp(n, step)+64*step; ld += step {
		if sh := ld * elem / 4 % 32; sh != 8 && sh != 24 {
			continue
		}
		if first == 0 {
			first = ld
		}
		if storeBanksDistinct(ld, elem, wl) {
			return ld
		}
	}
	return first
}

// storeBanksDistinct says whether a warp whose lane l stores element
// (l/wl)*ld + l%wl of elem bytes touches each bank in one word at most.
func storeBanksDistinct(ld, elem, wl int64) bool {
	word := map[int64]int64{} // bank -> word
	for l := int64(0); l < 32; l++ {
		w := ((l/wl)*ld + l%wl) * elem / 4
		if prev, ok := word[w%32]; ok && prev != w {
			return false
		}
		word[w%32] = w
	}
	return true
}

// roundUp is n rounded up to a multiple of m.
func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// tcAlignSlack is the dynamic shared memory a tensor-core kernel adds to
// align its tiles' base to 128 bytes.
const tcAlignSlack = 128

// fragRound is the C statement that rounds fragment frag to TF32 when the
// layout says so (templates: {{fragRound .TC "a[i]"}}).
func fragRound(tc *tcConv, frag string) string {
	if tc == nil || !tc.FragRound {
		return ""
	}
	return fmt.Sprintf("for (int e = 0; e < %s.num_elements; e++) %s.x[e] = wmma::__float_to_tf32(%s.x[e]);", frag, frag, frag)
}

// tcTile is the conv tile at a tensor-core precision: at least 16 rows.
func tcTile(m int64) gemmTile {
	if m <= 16 {
		return gemmTile{BM: 16, TM: 4, MT: 4, BN: 64, TN: 4, NT: 16, T: 64}
	}
	return tileFor(m)
}

// precName is the kernel-name suffix of a precision ("" for FP32).
func precName(p Precision) string {
	if p.tensor() {
		return "_" + string(p)
	}
	return ""
}
