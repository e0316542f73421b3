package emu

import (
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of the emulator's tensor cores (nvcuda::wmma), bfloat16 and cp.async against Go
// references computed another way: roundings from float64 distances to the two neighbouring
// representable values, GEMMs from float64 sums with error bounds derived below, and the
// emulator's documented accumulation (exact products, one fp32 rounding per mma_sync) bit for bit.

var tcShared struct {
	once sync.Once
	mod  *Module
	err  error
}

// tcModule compiles testdata/tensorcore.cu once; shared memory is poisoned at every block so that
// reads of cp.async destinations before the wait see 0xFF bytes.
func tcModule(t *testing.T) *Module {
	t.Helper()
	tcShared.once.Do(func() {
		src, err := os.ReadFile("testdata/tensorcore.cu")
		if err != nil {
			tcShared.err = err
			return
		}
		tcShared.mod, tcShared.err = Compile(src, "tensorcore.cu", Options{PoisonShared: true,
			Flags: strings.Fields(os.Getenv("CNNC_EMU_TEST_FLAGS"))})
	})
	require.NoError(t, tcShared.err)
	return tcShared.mod
}

// refTF32 rounds x to TF32 (10 mantissa bits) to nearest, ties away from zero, by comparing the
// float64 distances to the two neighbours; infinities and NaNs follow the GPU's code (low 13 bits
// cleared), which no distance defines.
func refTF32(x float32) uint32 {
	b := math.Float32bits(x)
	if b&0x7fffffff >= 0x7f800000 {
		return b & 0xffffe000
	}
	lo := b & 0xffffe000 // toward zero
	hi := lo + 0x2000    // away from zero (may be the infinity)
	dlo := math.Abs(float64(x) - float64(math.Float32frombits(lo)))
	dhi := math.Abs(magnitudeAt(hi) - math.Abs(float64(x)))
	if dhi <= dlo { // a tie goes away from zero
		return hi
	}
	return lo
}

// magnitudeAt is |value| of the float32 bits, with the infinity standing for 2^128 (the next power
// of two the format would have): rounding overflows to it past the halfway point.
func magnitudeAt(b uint32) float64 {
	if b&0x7fffffff == 0x7f800000 {
		return math.Ldexp(1, 128)
	}
	return math.Abs(float64(math.Float32frombits(b)))
}

// refBF16 rounds x to bfloat16 to nearest, ties to even (the even neighbour has a zero last
// mantissa bit), from float64 distances; any NaN becomes 0x7fff as in CUDA's implementation.
func refBF16(x float32) uint16 {
	b := math.Float32bits(x)
	if math.IsNaN(float64(x)) {
		return 0x7fff
	}
	if math.IsInf(float64(x), 0) {
		return uint16(b >> 16)
	}
	lo := b & 0xffff0000
	hi := lo + 0x10000
	dlo := math.Abs(float64(x) - float64(math.Float32frombits(lo)))
	dhi := math.Abs(magnitudeAt(hi) - math.Abs(float64(x)))
	switch {
	case dlo < dhi:
		return uint16(lo >> 16)
	case dhi < dlo:
		return uint16(hi >> 16)
	case (lo>>16)&1 == 0:
		return uint16(lo >> 16)
	}
	return uint16(hi >> 16)
}

// roundingEdgeCases are float32 bit patterns around every rule: ties (both directions, both signs),
// neighbours of ties, the largest values (rounding to infinity), subnormals (rounding into the
// normal range too), zeros, infinities and NaNs with payloads in the kept and in the dropped bits.
var roundingEdgeCases = []uint32{
	0x00000000, 0x80000000, 0x3f800000, 0xbf800000,
	0x3f801000, 0xbf801000, 0x3f803000, 0x3f800fff, 0x3f801001, 0x3f802fff, // TF32 ties and neighbours
	0x3f808000, 0x3f818000, 0xbf818000, 0x3f807fff, 0x3f808001, // BF16 ties (even below, odd below) and neighbours
	0x7f7fffff, 0xff7fffff, 0x7f7ff000, 0x7f7fefff, 0x7f7fe000, 0x7f7f8000, 0x7f7f7fff, 0x7f7fc000,
	0x00000001, 0x80000001, 0x00000fff, 0x00001000, 0x00003000, 0x00001fff, 0x00008000, 0x00018000,
	0x007ff000, 0x007fffff, 0x807fffff, 0x00800000, 0x00400000,
	0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7f801000, 0x7fa00000, 0xffc01234, 0x7fffffff,
}

func TestTF32AndBF16RoundingBitExact(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	rng := rand.New(rand.NewPCG(1, 2))
	in := make([]float32, 0, len(roundingEdgeCases)+100000)
	for _, c := range roundingEdgeCases {
		in = append(in, math.Float32frombits(c))
	}
	for len(in) < cap(in) {
		in = append(in, math.Float32frombits(rng.Uint32()))
	}
	n := len(in)
	out, bf := b.alloc(4*n), b.alloc(2*n)
	launch(t, m, "round_tf32_bf16", Dim1(uint32((n+255)/256)), Dim1(256), 0, allocCopy(b, in), out, bf, n)
	gotTF, gotBF := read[uint32](t, out, n), read[uint16](t, bf, n)
	for i, x := range in {
		require.Equal(t, refTF32(x), gotTF[i], "TF32 of %#08x (%g)", math.Float32bits(x), x)
		require.Equal(t, refBF16(x), gotBF[i], "BF16 of %#08x (%g)", math.Float32bits(x), x)
	}
	// the cases spelled out, as the rules say them
	tf := func(x uint32) uint32 { return refTF32(math.Float32frombits(x)) }
	assert.Equal(t, uint32(0x3f802000), tf(0x3f801000), "a tie rounds away from zero")
	assert.Equal(t, uint32(0xbf802000), tf(0xbf801000), "a negative tie rounds away from zero")
	assert.Equal(t, uint32(0x7f800000), tf(0x7f7ff000), "the tie past the largest TF32 overflows")
	assert.Equal(t, uint32(0x7f7fe000), tf(0x7f7fefff), "just below it does not")
	assert.Equal(t, uint32(0x00002000), tf(0x00001000), "subnormal ties round away too (no flush)")
	assert.Equal(t, uint32(0x00800000), tf(0x007ff000), "a subnormal rounds up into the normal range")
	assert.Equal(t, uint32(0x7f800000), tf(0x7f800001), "a NaN with only low payload bits becomes infinity, as ptxas's code does")
	bfr := func(x uint32) uint16 { return refBF16(math.Float32frombits(x)) }
	assert.Equal(t, uint16(0x3f80), bfr(0x3f808000), "a tie rounds to the even neighbour (down)")
	assert.Equal(t, uint16(0x3f82), bfr(0x3f818000), "a tie rounds to the even neighbour (up)")
	assert.Equal(t, uint16(0x7f80), bfr(0x7f7fffff), "the largest float rounds to infinity")
	assert.Equal(t, uint16(0x7fff), bfr(0xffc01234), "a NaN becomes the canonical 0x7fff")
}

// tf32Value and bf16Value are the operand values the reference multiplies.
func tf32Value(x float32) float64 { return float64(math.Float32frombits(refTF32(x))) }
func bf16Value(x float32) float64 {
	return float64(math.Float32frombits(uint32(refBF16(x)) << 16))
}

// mmaModel is the emulator's documented mma_sync: per k chunk, the accumulator plus the chunk's
// exact products summed in float64 in k order, rounded once to float32.
func mmaModel(a, b []float64, c []float32, M, N, K, chunk int) []float32 {
	out := append([]float32(nil), c...)
	for k0 := 0; k0 < K; k0 += chunk {
		for i := 0; i < M; i++ {
			for j := 0; j < N; j++ {
				s := float64(out[i*N+j])
				for k := k0; k < min(k0+chunk, K); k++ {
					s += a[i*K+k] * b[k*N+j]
				}
				out[i*N+j] = float32(s)
			}
		}
	}
	return out
}

// checkGemm compares got with the float64 product of the unrounded inputs, within
// (2u + u² + chunks·2⁻²⁴)·Σ|a||b| + 2⁻²⁴|c| per element: the inputs' rounding (unit roundoff u,
// relative error at most u per operand, so (1+u)² - 1 per product), then at most one fp32 rounding
// (2⁻²⁴ relative, bounded by the sum of magnitudes) per mma_sync; the float64 sums add far less.
func checkGemm(t *testing.T, name string, got []float32, a, b []float32, c []float32, M, N, K, chunk int, u float64) {
	t.Helper()
	chunks := float64((K + chunk - 1) / chunk)
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			var exact, mag float64
			cv := 0.0
			if c != nil {
				cv = float64(c[i*N+j])
			}
			exact, mag = cv, math.Abs(cv)
			for k := 0; k < K; k++ {
				p := float64(a[i*K+k]) * float64(b[k*N+j])
				exact += p
				mag += math.Abs(p)
			}
			bound := (2*u+u*u+chunks*math.Ldexp(1, -24))*mag + math.Ldexp(1, -24)*math.Abs(cv) + 1e-30
			g := float64(got[i*N+j])
			require.False(t, math.IsNaN(g), "%s: C[%d][%d] not written", name, i, j)
			require.LessOrEqual(t, math.Abs(g-exact), bound, "%s: C[%d][%d] = %g, float64 %g", name, i, j, g, exact)
		}
	}
}

func randomMatrix(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(2*rng.Float64() - 1)
	}
	return out
}

func nanFilled(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	return out
}

func TestWMMATF32GemmOddShapes(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []struct{ M, N, K, padA, padB, padC int }{
		{16, 16, 8, 0, 0, 0}, {17, 23, 9, 3, 1, 1}, {5, 40, 37, 3, 0, 4}, {33, 7, 64, 0, 1, 1}, {1, 1, 1, 3, 3, 3},
	} {
		lda, ldb, ldc := s.K+s.padA, s.N+s.padB, s.N+s.padC
		A, B := randomMatrix(rng, s.M*lda), randomMatrix(rng, s.K*ldb)
		// dense copies for the references
		a, bb := make([]float32, s.M*s.K), make([]float32, s.K*s.N)
		ra, rb := make([]float64, s.M*s.K), make([]float64, s.K*s.N)
		for i := 0; i < s.M; i++ {
			for k := 0; k < s.K; k++ {
				a[i*s.K+k], ra[i*s.K+k] = A[i*lda+k], tf32Value(A[i*lda+k])
			}
		}
		for k := 0; k < s.K; k++ {
			for j := 0; j < s.N; j++ {
				bb[k*s.N+j], rb[k*s.N+j] = B[k*ldb+j], tf32Value(B[k*ldb+j])
			}
		}
		model := mmaModel(ra, rb, make([]float32, s.M*s.N), s.M, s.N, s.K, 8)
		tiles := ((s.M + 15) / 16) * ((s.N + 15) / 16)
		for _, transposed := range []int{0, 1} {
			C := allocCopy(b, nanFilled(s.M*ldc))
			launch(t, m, "gemm_tf32", Dim1(uint32((tiles+3)/4)), Dim1(128), 0, allocCopy(b, A), allocCopy(b, B), C,
				s.M, s.N, s.K, lda, ldb, ldc, transposed)
			all := read[float32](t, C, s.M*ldc)
			got := make([]float32, s.M*s.N)
			for i := 0; i < s.M; i++ {
				copy(got[i*s.N:(i+1)*s.N], all[i*ldc:i*ldc+s.N])
				for j := s.N; j < ldc; j++ {
					require.True(t, math.IsNaN(float64(all[i*ldc+j])), "padding of C row %d written", i)
				}
			}
			name := strings.ReplaceAll(t.Name(), "/", "_")
			checkGemm(t, name, got, a, bb, nil, s.M, s.N, s.K, 8, math.Ldexp(1, -11))
			require.Equal(t, model, got, "%dx%dx%d (B col-major %d): the documented accumulation, bit for bit", s.M, s.N, s.K, transposed)
		}
	}
}

func TestWMMABF16GemmOddShapes(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, s := range []struct{ M, N, K int }{{16, 16, 16}, {19, 21, 35}, {3, 50, 17}} {
		A, B, Cin := randomMatrix(rng, s.M*s.K), randomMatrix(rng, s.K*s.N), randomMatrix(rng, s.M*s.N)
		ra, rb := make([]float64, len(A)), make([]float64, len(B))
		for i, v := range A {
			ra[i] = bf16Value(v)
		}
		for i, v := range B {
			rb[i] = bf16Value(v)
		}
		model := mmaModel(ra, rb, Cin, s.M, s.N, s.K, 16)
		tiles := ((s.M + 15) / 16) * ((s.N + 15) / 16)
		for _, layouts := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}} {
			C := allocCopy(b, nanFilled(s.M*s.N))
			launch(t, m, "gemm_bf16", Dim1(uint32(tiles)), Dim1(32), 0, allocCopy(b, A), allocCopy(b, B), allocCopy(b, Cin), C,
				s.M, s.N, s.K, layouts[0], layouts[1])
			got := read[float32](t, C, s.M*s.N)
			checkGemm(t, "bf16", got, A, B, Cin, s.M, s.N, s.K, 16, math.Ldexp(1, -8))
			require.Equal(t, model, got, "%dx%dx%d, accumulator layouts %v: bit for bit", s.M, s.N, s.K, layouts)
		}
	}
}

func TestWMMAFragmentsAreElementwise(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	in := randomMatrix(rand.New(rand.NewPCG(7, 8)), 256)
	out := b.alloc(4 * 256)
	launch(t, m, "frag_scale", Dim1(1), Dim1(32), 0, allocCopy(b, in), out)
	got := read[float32](t, out, 256)
	for i := range in {
		require.Equal(t, 2*in[i], got[i])
	}
}

func TestWMMAMisuseFailsLoudly(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	in, out := allocCopy(b, make([]float32, 16*40)), b.alloc(4*256)
	run := func(offset, ldm, exitLane int) error {
		params, err := Args(in, out, offset, ldm, exitLane)
		require.NoError(t, err)
		return m.Launch("wmma_misaligned", Dim1(1), Dim1(32), 0, params)
	}
	require.NoError(t, run(0, 16, -1))
	require.NoError(t, run(8, 20, -1), "32-byte aligned, ldm 80 bytes: legal")
	err := run(1, 16, -1)
	require.ErrorIs(t, err, ErrKernelFailed)
	assert.Contains(t, err.Error(), "wmma::load_matrix_sync: pointer")
	assert.Contains(t, err.Error(), "is not 256-bit (32-byte) aligned")
	err = run(4, 16, -1)
	require.ErrorIs(t, err, ErrKernelFailed, "16-byte aligned is not enough")
	err = run(0, 18, -1)
	require.ErrorIs(t, err, ErrKernelFailed)
	assert.Contains(t, err.Error(), "ldm 18 is not a multiple of 4 elements (16 bytes)")
	err = run(0, 16, 5)
	require.ErrorIs(t, err, ErrKernelFailed)
	assert.Contains(t, err.Error(), "wmma::mma_sync needs all 32 lanes of the warp")
	err = m.Launch("wmma_misaligned", Dim1(1), Dim1(48), 0, mustArgs(t, in, out, 0, 16, -1))
	require.ErrorIs(t, err, ErrKernelFailed, "a block of 48 threads has a warp of 16 lanes")
	assert.Contains(t, err.Error(), "needs all 32 lanes")
}

func mustArgs(t *testing.T, vals ...any) []uint64 {
	t.Helper()
	p, err := Args(vals...)
	require.NoError(t, err)
	return p
}

func TestCpAsyncPipeline(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	for _, n := range []int{4, 1020, 1024, 3*1024 + 8} {
		in := randomMatrix(rand.New(rand.NewPCG(9, uint64(n))), n)
		chunks := (n + 1023) / 1024
		out, tail := allocCopy(b, nanFilled(n)), allocCopy(b, nanFilled(chunks*1024-n+1))
		launch(t, m, "cp_async_pipeline", Dim1(1), Dim1(256), 0, allocCopy(b, in), out, n, tail)
		got := read[float32](t, out, n)
		for i := range in {
			require.Equal(t, 3*in[i], got[i], "n=%d element %d", n, i)
		}
		for i, v := range read[float32](t, tail, chunks*1024-n) {
			require.Zero(t, v, "n=%d: zero fill past the end, element %d", n, i)
		}
	}
}

func TestCpAsyncCopiesAtTheWait(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	in := randomMatrix(rand.New(rand.NewPCG(10, 11)), 64)
	out := b.alloc(4 * 128)
	launch(t, m, "cp_async_read_early", Dim1(1), Dim1(64), 4*64, allocCopy(b, in), out)
	got := read[uint32](t, out, 128)
	for i := 0; i < 64; i++ {
		require.Equal(t, uint32(0xffffffff), got[i], "read before the wait: still poison")
		require.Equal(t, math.Float32bits(in[i]), got[64+i], "read after the wait: the data")
	}
}

func TestCpAsyncMisuseFailsLoudly(t *testing.T) {
	m, b := tcModule(t), buffers{t}
	in, out := allocCopy(b, make([]float32, 64)), b.alloc(4*64)
	for which, want := range []string{
		"is not aligned to its size 16",
		"is not shared memory",
		"exited with 1 cp.async copies not waited for",
	} {
		err := m.Launch("cp_async_misuse", Dim1(1), Dim1(32), 0, mustArgs(t, in, out, which))
		require.ErrorIs(t, err, ErrKernelFailed, "misuse %d", which)
		assert.Contains(t, err.Error(), want)
	}
}

// The test kernels are CUDA as nvcc takes it, and their GEMMs run on tensor cores: the SASS of
// each holds HMMA instructions (TF32 and BF16 forms).
func TestTensorCoreKernelsCompileToHMMA(t *testing.T) {
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		if os.Getenv("CNNC_REQUIRE_NVCC") != "" {
			t.Fatal("nvcc not found and CNNC_REQUIRE_NVCC is set")
		}
		t.Skip("nvcc not installed")
	}
	dir := t.TempDir()
	hdr := dir + "/cuda_emu.h"
	require.NoError(t, os.WriteFile(hdr, []byte(Header()), 0o644))
	for _, arch := range []string{"sm_80", "sm_90"} {
		cubin := dir + "/" + arch + ".cubin"
		out, err := exec.Command(nvcc, "-arch="+arch, "-cubin", "-include", hdr, "-x", "cu", "testdata/tensorcore.cu",
			"-o", cubin).CombinedOutput()
		require.NoError(t, err, "%s", out)
		sass, err := exec.Command("cuobjdump", "-sass", cubin).CombinedOutput()
		require.NoError(t, err, "%s", sass)
		fns := splitSASS(string(sass))
		assert.Contains(t, fns["gemm_tf32"], "HMMA.1684.F32.TF32", arch)
		assert.Contains(t, fns["gemm_bf16"], "HMMA.16816.F32.BF16", arch)
		assert.NotContains(t, fns["cp_async_pipeline"], "HMMA", arch)
		assert.Contains(t, fns["cp_async_pipeline"], "LDGSTS", arch+": cp.async is LDGSTS")
	}
}

// splitSASS maps each function of a cuobjdump -sass listing to its text.
func splitSASS(sass string) map[string]string {
	out := map[string]string{}
	cur := ""
	for _, line := range strings.Split(sass, "\n") {
		if i := strings.Index(line, "Function : "); i >= 0 {
			cur = strings.TrimSpace(line[i+len("Function : "):])
			continue
		}
		if cur != "" {
			out[cur] += line + "\n"
		}
	}
	return out
}
