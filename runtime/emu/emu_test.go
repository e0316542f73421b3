package emu

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The test kernels are compiled once (and cached across runs) and shared by the tests.
var shared struct {
	once sync.Once
	mod  *Module
	err  error
}

func testModule(t *testing.T) *Module {
	t.Helper()
	shared.once.Do(func() {
		src, err := os.ReadFile("testdata/kernels.cu")
		if err != nil {
			shared.err = err
			return
		}
		// CNNC_EMU_TEST_FLAGS (e.g. "-O3 -march=native") runs the suite on other compiler flags.
		shared.mod, shared.err = Compile(src, "kernels.cu", Options{Flags: strings.Fields(os.Getenv("CNNC_EMU_TEST_FLAGS"))})
	})
	require.NoError(t, shared.err)
	return shared.mod
}

func TestMain(m *testing.M) {
	if os.Getenv(asanChildEnv) != "" {
		asanChild() // never returns
	}
	code := m.Run()
	if shared.mod != nil {
		shared.mod.Close()
	}
	os.Exit(code)
}

// buffers allocates device memory for a test and frees it at the end.
type buffers struct{ t *testing.T }

func (b buffers) alloc(bytes int) Ptr {
	b.t.Helper()
	p, err := Alloc(bytes)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { assert.NoError(b.t, Free(p)) })
	return p
}

func allocCopy[T Scalar](b buffers, vals []T) Ptr {
	b.t.Helper()
	p, err := AllocCopy(vals)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { assert.NoError(b.t, Free(p)) })
	return p
}

func read[T Scalar](t *testing.T, p Ptr, n int) []T {
	t.Helper()
	out := make([]T, n)
	require.NoError(t, CopyOut(out, p))
	return out
}

func launch(t *testing.T, m *Module, kernel string, grid, block Dim3, shared int, args ...any) {
	t.Helper()
	params, err := Args(args...)
	require.NoError(t, err)
	require.NoError(t, m.Launch(kernel, grid, block, shared, params))
}

func TestBarrierReversal(t *testing.T) {
	m, b := testModule(t), buffers{t}
	for _, threads := range []int{256, 200, 1024, 1} {
		const blocks = 6
		in := make([]float32, blocks*threads)
		for i := range in {
			in[i] = float32(i)
		}
		x, y := allocCopy(b, in), b.alloc(4*len(in))
		launch(t, m, "reverse_sync", Dim1(blocks), Dim1(uint32(threads)), 0, x, y)
		got := read[float32](t, y, len(in))
		for blk := 0; blk < blocks; blk++ {
			for i := 0; i < threads; i++ {
				require.Equal(t, in[blk*threads+threads-1-i], got[blk*threads+i], "block %d thread %d of %d", blk, i, threads)
			}
		}
		if threads > 1 {
			// Without the barrier the first threads read slots not yet written in this block.
			launch(t, m, "reverse_nosync", Dim1(blocks), Dim1(uint32(threads)), 0, x, y)
			assert.NotEqual(t, got, read[float32](t, y, len(in)), "the barrier-free variant should be wrong")
		}
	}
}

func TestBarriersInLoop(t *testing.T) {
	m, b := testModule(t), buffers{t}
	for _, threads := range []int{512, 96, 33} {
		const blocks = 5
		in := make([]int32, blocks*threads)
		for i := range in {
			in[i] = int32(i%17 - 5)
		}
		out := b.alloc(4 * len(in))
		launch(t, m, "scan_block", Dim1(blocks), Dim1(uint32(threads)), 0, allocCopy(b, in), out)
		got := read[int32](t, out, len(in))
		for blk := 0; blk < blocks; blk++ {
			var sum int32
			for i := 0; i < threads; i++ {
				sum += in[blk*threads+i]
				require.Equal(t, sum, got[blk*threads+i], "threads %d block %d index %d", threads, blk, i)
			}
		}
	}
}

func TestSharedMemoryIsolatedBetweenParallelBlocks(t *testing.T) {
	m, b := testModule(t), buffers{t}
	m.SetWorkers(4)
	defer m.SetWorkers(0)
	const blocks = 64
	mismatches, osThreads := b.alloc(4), b.alloc(8*blocks)
	require.NoError(t, Memset(mismatches, 0, 4))
	launch(t, m, "isolation", Dim1(blocks), Dim1(256), 0, 100, mismatches, osThreads)
	assert.Equal(t, []int32{0}, read[int32](t, mismatches, 1))
	distinct := map[uint64]bool{}
	for _, id := range read[uint64](t, osThreads, blocks) {
		distinct[id] = true
	}
	assert.GreaterOrEqual(t, len(distinct), 2, "blocks should have run on several OS threads")
}

func TestDynamicSharedMemory(t *testing.T) {
	m, b := testModule(t), buffers{t}
	const blocks, threads = 7, 128
	in := make([]float32, blocks*threads)
	for i := range in {
		in[i] = float32(i % 10)
	}
	out, counts := b.alloc(4*blocks), b.alloc(4*blocks)
	launch(t, m, "dyn_sum", Dim1(blocks), Dim1(threads), threads*8, allocCopy(b, in), out, counts)
	sums, ns := read[float32](t, out, blocks), read[int32](t, counts, blocks)
	for blk := 0; blk < blocks; blk++ {
		var want float32
		for _, v := range in[blk*threads : (blk+1)*threads] {
			want += v
		}
		assert.Equal(t, want, sums[blk], "block %d", blk)
		assert.Equal(t, int32(threads), ns[blk], "block %d", blk)
	}
}

func TestDynamicSharedMemoryIsPoisoned(t *testing.T) {
	src, err := os.ReadFile("testdata/kernels.cu")
	require.NoError(t, err)
	m, err := Compile(src, "kernels.cu", Options{PoisonShared: true}) // same library, other flags
	require.NoError(t, err)
	defer m.Close()
	b := buffers{t}
	const blocks, threads = 5, 64
	out := b.alloc(4 * blocks * threads)
	launch(t, m, "dyn_uninit", Dim1(blocks), Dim1(threads), 4*threads, out)
	for i, v := range read[float32](t, out, blocks*threads) {
		require.True(t, math.IsNaN(float64(v)), "element %d = %v, want NaN in every block", i, v)
	}
}

// refWarpOps computes warp_ops's outputs from CUDA's documented semantics. A lane that reads
// from a lane outside the block gets its own value (the emulator's choice; undefined in CUDA).
func refWarpOps(in []int32) [][]int32 {
	n := len(in)
	var out [][]int32
	perLane := func(f func(w, l, lanes int) int32) {
		row := make([]int32, n)
		for t := range in {
			w, l := t/32*32, t%32
			row[t] = f(w, l, min(32, n-w))
		}
		out = append(out, row)
	}
	val := func(w, j, l, lanes int) int32 { // value of lane j, or own if j does not exist
		if j >= 0 && j < lanes {
			return in[w+j]
		}
		return in[w+l]
	}
	shfl := func(src, width int) func(w, l, lanes int) int32 {
		return func(w, l, lanes int) int32 { return val(w, l/width*width+src%width, l, lanes) }
	}
	up := func(d, width int) func(w, l, lanes int) int32 {
		return func(w, l, lanes int) int32 {
			if l%width >= d {
				return val(w, l-d, l, lanes)
			}
			return in[w+l]
		}
	}
	down := func(d, width int) func(w, l, lanes int) int32 {
		return func(w, l, lanes int) int32 {
			if l%width+d < width {
				return val(w, l+d, l, lanes)
			}
			return in[w+l]
		}
	}
	xor := func(mask, width int) func(w, l, lanes int) int32 {
		return func(w, l, lanes int) int32 {
			if j := l ^ mask; j < (l/width+1)*width {
				return val(w, j, l, lanes)
			}
			return in[w+l]
		}
	}
	ballot := func(lo, hi int, pred func(int32) bool) func(w, l, lanes int) int32 {
		return func(w, l, lanes int) int32 {
			var bits uint32
			for j := lo; j < min(hi, lanes); j++ {
				if pred(in[w+j]) {
					bits |= 1 << j
				}
			}
			return int32(bits)
		}
	}
	perLane(func(w, l, lanes int) int32 { return shfl((l*7+3)&31, 32)(w, l, lanes) })
	perLane(func(w, l, lanes int) int32 { return shfl(l*3, 8)(w, l, lanes) })
	perLane(up(3, 32))
	perLane(up(2, 16))
	perLane(down(5, 32))
	perLane(down(1, 4))
	perLane(xor(9, 32))
	perLane(xor(3, 4))
	perLane(ballot(0, 32, func(v int32) bool { return v%3 == 0 }))
	perLane(func(w, l, lanes int) int32 {
		return b2i(ballot(0, 32, func(v int32) bool { return v == 40 })(w, l, lanes) != 0)
	})
	perLane(func(w, l, lanes int) int32 {
		return b2i(ballot(0, 32, func(v int32) bool { return v >= 0 })(w, l, lanes) == int32(uint32(1<<lanes-1)))
	})
	perLane(func(w, l, lanes int) int32 {
		return b2i(ballot(0, 32, func(v int32) bool { return v%2 == 0 })(w, l, lanes) == int32(uint32(1<<lanes-1)))
	})
	// Butterfly sum: each step reads the partner's running sum (own value if it does not exist).
	sums := append([]int32(nil), in...)
	for o := 16; o > 0; o >>= 1 {
		next := make([]int32, n)
		for t := range sums {
			w, l := t/32*32, t%32
			j := l ^ o
			if j < min(32, n-w) {
				next[t] = sums[t] + sums[w+j]
			} else {
				next[t] = 2 * sums[t]
			}
		}
		sums = next
	}
	out = append(out, sums)
	perLane(func(w, _, lanes int) int32 {
		var s int32
		for j := 0; j < lanes; j++ {
			s += in[w+j]
		}
		return s
	})
	perLane(func(w, _, lanes int) int32 {
		m := in[w]
		for j := 0; j < lanes; j++ {
			m = max(m, in[w+j])
		}
		return m
	})
	perLane(down(1, 32)) // float shuffle of v/2, doubled again
	perLane(shfl(0, 16))
	perLane(func(w, l, lanes int) int32 {
		lo := l / 16 * 16
		return ballot(lo, lo+16, func(v int32) bool { return v&1 == 1 })(w, l, lanes)
	})
	count, anySeven := int32(0), int32(0)
	for _, v := range in {
		count += b2i(v%5 == 0)
		anySeven |= b2i(v == 7)
	}
	perLane(func(int, int, int) int32 { return count })
	perLane(func(int, int, int) int32 { return 1 })
	perLane(func(int, int, int) int32 { return anySeven })
	return out
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

func TestWarpShufflesAndVotes(t *testing.T) {
	m, b := testModule(t), buffers{t}
	names := []string{"shfl", "shfl width 8", "shfl_up", "shfl_up width 16", "shfl_down", "shfl_down width 4",
		"shfl_xor", "shfl_xor width 4", "ballot", "any", "all true", "all false", "butterfly sum", "reduce_add",
		"reduce_max", "float shfl_down", "half-warp shfl", "half-warp ballot", "syncthreads_count",
		"syncthreads_and", "syncthreads_or"}
	for _, threads := range []int{64, 48, 32, 7} {
		in := make([]int32, threads)
		for i := range in {
			in[i] = int32((i*37 + 11) % 101)
		}
		in[threads/2] = 7 // something for __syncthreads_or to find
		want := refWarpOps(in)
		require.Len(t, want, len(names))
		out := b.alloc(4 * threads * len(names))
		launch(t, m, "warp_ops", Dim1(1), Dim1(uint32(threads)), 0, allocCopy(b, in), out)
		got := read[int32](t, out, threads*len(names))
		for k, name := range names {
			assert.Equal(t, want[k], got[k*threads:(k+1)*threads], "%s with %d threads", name, threads)
		}
	}
}

func TestAtomicsUnderContention(t *testing.T) {
	m, b := testModule(t), buffers{t}
	m.SetWorkers(4)
	defer m.SetWorkers(0)
	const blocks, threads = 512, 256
	const n = blocks * threads
	icount, usum, fsum, dsum := b.alloc(4), b.alloc(8), b.alloc(4), b.alloc(8)
	imax, imin, cas2, exch := b.alloc(4), b.alloc(4), b.alloc(4), b.alloc(4)
	for _, p := range []Ptr{icount, fsum, cas2} {
		require.NoError(t, Memset(p, 0, 4))
	}
	require.NoError(t, Memset(usum, 0, 8))
	require.NoError(t, Memset(dsum, 0, 8))
	require.NoError(t, CopyIn(imax, []int32{math.MinInt32}))
	require.NoError(t, CopyIn(imin, []int32{math.MaxInt32}))
	launch(t, m, "atomics", Dim1(blocks), Dim1(threads), 0, icount, usum, fsum, dsum, imax, imin, cas2, exch)
	wantMax := int32(0)
	for g := 0; g < n; g++ {
		wantMax = max(wantMax, int32(g*7919%100003))
	}
	assert.Equal(t, []int32{n}, read[int32](t, icount, 1))
	assert.Equal(t, []uint64{n * (n - 1) / 2}, read[uint64](t, usum, 1))
	assert.Equal(t, []float32{n}, read[float32](t, fsum, 1))
	assert.Equal(t, []float64{n / 2}, read[float64](t, dsum, 1))
	assert.Equal(t, []int32{wantMax}, read[int32](t, imax, 1))
	assert.Equal(t, []int32{-wantMax}, read[int32](t, imin, 1))
	assert.Equal(t, []uint32{2 * n}, read[uint32](t, cas2, 1))
	e := read[int32](t, exch, 1)[0]
	assert.True(t, e >= 0 && e < n, "atomicExch left %d", e)
}

// matmul runs matmul_tiled on M x K times K x N inputs and checks it against float64.
func matmul(t *testing.T, m *Module, M, N, K int) time.Duration {
	b := buffers{t}
	a, bm := make([]float32, M*K), make([]float32, K*N)
	for i := range a {
		a[i] = float32((i*13)%29)/7 - 2
	}
	for i := range bm {
		bm[i] = float32((i*7)%31)/5 - 3
	}
	c := b.alloc(4 * M * N)
	const tile = 16
	grid := Dim2(uint32((N+tile-1)/tile), uint32((M+tile-1)/tile))
	start := time.Now()
	launch(t, m, "matmul_tiled", grid, Dim2(tile, tile), 0, allocCopy(b, a), allocCopy(b, bm), c, M, N, K)
	elapsed := time.Since(start)
	got := read[float32](t, c, M*N)
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			var want float64
			for k := 0; k < K; k++ {
				want += float64(a[i*K+k]) * float64(bm[k*N+j])
			}
			require.InDelta(t, want, float64(got[i*N+j]), 1e-3*(1+math.Abs(want)), "C[%d][%d]", i, j)
		}
	}
	return elapsed
}

func TestTiledMatmulOddSizes(t *testing.T) {
	m := testModule(t)
	matmul(t, m, 67, 33, 45)
	matmul(t, m, 1, 1, 1)
	matmul(t, m, 16, 16, 16)
}

func TestPerformance(t *testing.T) {
	m, b := testModule(t), buffers{t}
	matmul(t, m, 67, 67, 67) // warm up: fibers, TLS
	var best time.Duration
	for i := 0; i < 3; i++ {
		if d := matmul(t, m, 67, 67, 67); i == 0 || d < best {
			best = d
		}
	}
	t.Logf("67x67x67 tiled matmul (25 blocks x 256 threads, 10 barriers each): %v", best)

	const n = 1 << 20
	x, y := b.alloc(4*n), b.alloc(4*n)
	require.NoError(t, Memset(x, 0, 4*n))
	require.NoError(t, Memset(y, 0, 4*n))
	best = 0
	for i := 0; i < 3; i++ {
		start := time.Now()
		launch(t, m, "saxpy", Dim1(n/256), Dim1(256), 0, float32(2), x, y, n)
		if d := time.Since(start); i == 0 || d < best {
			best = d
		}
	}
	t.Logf("saxpy over 1M threads (4096 blocks x 256, no barrier): %v on %d workers", best, runtime.GOMAXPROCS(0))
}

func TestLaunchParameters(t *testing.T) {
	m, b := testModule(t), buffers{t}
	out, dout := b.alloc(8*7), b.alloc(8*2)
	p := allocCopy(b, []int32{424242})
	params := []uint64{ArgPtr(out), ArgPtr(dout), ArgPtr(p), ArgInt(-1 << 40), ArgInt(-7), ArgF32(2.75),
		ArgF64(math.Pi), ArgInt(200), ArgInt(-5), 1<<63 + 5}
	require.NoError(t, m.Launch("params", Dim1(1), Dim1(1), 0, params))
	assert.Equal(t, []int64{-1 << 40, -7, 11, 424242, 200, -5, math.MinInt64 + 5}, read[int64](t, out, 7))
	assert.Equal(t, []float64{math.Pi, 2.75}, read[float64](t, dout, 2))
	n, err := m.NumParams("params")
	require.NoError(t, err)
	assert.Equal(t, 10, n)
}

func TestThreadAndBlockIndices(t *testing.T) {
	m, b := testModule(t), buffers{t}
	grid, block := Dim3{3, 2, 2}, Dim3{5, 3, 4}
	nb, nt := int(grid.count()), int(block.count())
	out := b.alloc(16 * nb * nt)
	launch(t, m, "indices", grid, block, 0, out)
	got := read[int32](t, out, 4*nb*nt)
	pack := func(x, y, z uint32) int32 { return int32(x | y<<8 | z<<16) }
	for bz := uint32(0); bz < grid.Z; bz++ {
		for by := uint32(0); by < grid.Y; by++ {
			for bx := uint32(0); bx < grid.X; bx++ {
				for tz := uint32(0); tz < block.Z; tz++ {
					for ty := uint32(0); ty < block.Y; ty++ {
						for tx := uint32(0); tx < block.X; tx++ {
							bid := bx + grid.X*(by+grid.Y*bz)
							tid := tx + block.X*(ty+block.Y*tz)
							o := 4 * (int(bid)*nt + int(tid))
							require.Equal(t, []int32{pack(tx, ty, tz), pack(bx, by, bz), pack(block.X, block.Y, block.Z),
								pack(grid.X, grid.Y, grid.Z)}, got[o:o+4])
						}
					}
				}
			}
		}
	}
}

func TestIntrinsics(t *testing.T) {
	m, b := testModule(t), buffers{t}
	f, i := b.alloc(4*8), b.alloc(4*8)
	launch(t, m, "intrinsics", Dim1(1), Dim1(1), 0, f, i)
	assert.Equal(t, []float32{1, 0, 2.5, 1, 0.5, 0.125, 3.5, 10}, read[float32](t, f, 8))
	assert.Equal(t, []int32{2, 4, 8, 31, 4, math.MinInt32, -3, 32}, read[int32](t, i, 8))
}

func TestKernelFailuresAreErrors(t *testing.T) {
	m, b := testModule(t), buffers{t}
	x := b.alloc(4 * 64)
	cases := []struct {
		kernel string
		grid   Dim3
		block  Dim3
		args   []any
		msg    string
	}{
		{"trap_at", Dim1(8), Dim1(64), []any{5, 17}, "__trap() in block (5,0,0) thread (17,0,0)"},
		{"early_exit_barrier", Dim1(3), Dim1(64), []any{x}, "24 of 64 threads exited while 40 wait at __syncthreads()"},
		{"warp_deadlock", Dim1(1), Dim1(32), []any{x}, "deadlock"},
		{"device_assert", Dim1(2), Dim1(64), []any{60}, "assertion `threadIdx.x < (unsigned)limit' failed"},
	}
	for _, c := range cases {
		params, err := Args(c.args...)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- m.Launch(c.kernel, c.grid, c.block, 0, params) }()
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: launch hangs", c.kernel)
		}
		var kerr *KernelError
		require.ErrorAs(t, err, &kerr, c.kernel)
		assert.ErrorIs(t, err, ErrKernelFailed)
		assert.Equal(t, c.kernel, kerr.Kernel)
		assert.Contains(t, kerr.Msg, c.msg)
		// The module stays usable after a failed launch.
		TestBarriersInLoop(t)
	}
}

func TestInvalidLaunches(t *testing.T) {
	m, b := testModule(t), buffers{t}
	y := b.alloc(4)
	ok := []uint64{ArgF32(1), ArgPtr(y), ArgPtr(y), ArgInt(1)}
	cases := []struct {
		kernel        string
		grid, block   Dim3
		shared        int
		params        []uint64
		want          error
		msgContaining string
	}{
		{"no_such_kernel", Dim1(1), Dim1(1), 0, ok, ErrUnknownKernel, "no_such_kernel"},
		{"saxpy", Dim1(1), Dim1(1025), 0, ok, ErrInvalidLaunch, "at most 1024 threads"},
		{"saxpy", Dim1(1), Dim3{32, 32, 2}, 0, ok, ErrInvalidLaunch, "at most 1024 threads"},
		{"saxpy", Dim1(1), Dim3{1, 1, 65}, 0, ok, ErrInvalidLaunch, "z at most 64"},
		{"saxpy", Dim1(0), Dim1(32), 0, ok, ErrInvalidLaunch, "zero dimension"},
		{"saxpy", Dim1(1), Dim3{32, 0, 1}, 0, ok, ErrInvalidLaunch, "zero dimension"},
		{"saxpy", Dim3{1, 1 << 16, 1}, Dim1(32), 0, ok, ErrInvalidLaunch, "exceeds"},
		{"saxpy", Dim1(1), Dim1(32), -1, ok, ErrInvalidLaunch, "shared memory"},
		{"saxpy", Dim1(1), Dim1(32), MaxSharedBytes + 1, ok, ErrInvalidLaunch, "shared memory"},
		{"saxpy", Dim1(1), Dim1(32), 0, ok[:3], ErrInvalidLaunch, "3 parameters given, kernel takes 4"},
	}
	for _, c := range cases {
		err := m.Launch(c.kernel, c.grid, c.block, c.shared, c.params)
		require.ErrorIs(t, err, c.want, "%+v", c)
		assert.Contains(t, err.Error(), c.msgContaining)
	}
	_, err := Args("a string")
	assert.Error(t, err)
}

func TestConcurrentLaunches(t *testing.T) {
	m := testModule(t)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			b := buffers{t}
			const n = 3000
			x, y := make([]float32, n), make([]float32, n)
			for i := range x {
				x[i], y[i] = float32(i), float32(g)
			}
			px, py := allocCopy(b, x), allocCopy(b, y)
			for r := 0; r < 5; r++ {
				params, _ := Args(float32(1), px, py, n)
				if !assert.NoError(t, m.Launch("saxpy", Dim1((n+127)/128), Dim1(128), 0, params)) {
					return
				}
			}
			got := read[float32](t, py, n)
			for i := range got {
				if !assert.Equal(t, float32(g)+5*float32(i), got[i]) {
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestCompileErrorNamesFileAndLine(t *testing.T) {
	src := "extern \"C\" __global__ void broken(float* x) {\n" +
		"  int i = threadIdx.x;\n" +
		"  x[i] = undefined_variable;\n" +
		"}\n"
	_, err := Compile([]byte(src), "broken.cu", Options{})
	var cerr *CompileError
	require.ErrorAs(t, err, &cerr)
	assert.Contains(t, err.Error(), "broken.cu:3:")
	assert.Contains(t, err.Error(), "undefined_variable")

	_, err = Compile([]byte("__device__ float f(float x) { return x; }\n"), "nokernel.cu", Options{})
	assert.ErrorContains(t, err, "no __global__ kernel")

	_, err = Compile([]byte("struct Big { double a, b; };\n__global__ void by_value(Big b) {}\n"), "big.cu", Options{})
	require.ErrorAs(t, err, &cerr)
	assert.Contains(t, err.Error(), "pointers or scalars of at most 8 bytes")

	_, err = Compile([]byte("// dynamic\n__global__ void k(float* x) {\n  extern __shared__ float s[];\n}\n"), "ext.cu", Options{})
	assert.ErrorContains(t, err, "ext.cu:3: `extern __shared__` is not supported")
	_, err = Compile([]byte("__global__ void k(float* x) {\n  static __shared__ float s[4];\n}\n"), "st.cu", Options{})
	assert.ErrorContains(t, err, "st.cu:2: write `__shared__` without `static`")
}

func TestCompileIsCached(t *testing.T) {
	src := []byte("extern \"C\" __global__ void fill(int* x, int v) { x[threadIdx.x] = v; }\n")
	opts := Options{CacheDir: t.TempDir()}
	m1, err := Compile(src, "fill.cu", opts)
	require.NoError(t, err)
	defer m1.Close()
	info1, err := os.Stat(m1.Path())
	require.NoError(t, err)
	// The cached library is loaded, not rebuilt: same path, same mtime (no
	// wall-clock bound, which a loaded machine breaks).
	m2, err := Compile(src, "fill.cu", opts)
	require.NoError(t, err)
	defer m2.Close()
	info2, err := os.Stat(m2.Path())
	require.NoError(t, err)
	assert.Equal(t, m1.Path(), m2.Path())
	assert.Equal(t, info1.ModTime(), info2.ModTime())
	assert.Equal(t, []string{"fill"}, m2.Kernels())

	// Both modules work, and closing one leaves the other usable.
	b := buffers{t}
	x := b.alloc(4 * 8)
	launch(t, m1, "fill", Dim1(1), Dim1(8), 0, x, 3)
	require.NoError(t, m1.Close())
	launch(t, m2, "fill", Dim1(1), Dim1(8), 0, x, 4)
	assert.Equal(t, []int32{4, 4, 4, 4, 4, 4, 4, 4}, read[int32](t, x, 8))
	params, _ := Args(x, 1)
	assert.ErrorIs(t, m1.Launch("fill", Dim1(1), Dim1(8), 0, params), ErrClosed)
}

func TestMemory(t *testing.T) {
	_, err := Alloc(0)
	assert.Error(t, err)
	p, err := Alloc(100)
	require.NoError(t, err)
	assert.Zero(t, uintptr(p)%256, "256-byte alignment")
	require.NoError(t, CopyIn(p+40, []byte{1, 2, 3}))
	got := make([]byte, 5)
	require.NoError(t, CopyOut(got, p+39))
	assert.Equal(t, []byte{got[0], 1, 2, 3, got[4]}, got)
	assert.ErrorIs(t, CopyIn(p+98, []byte{1, 2, 3}), ErrBadPointer)
	assert.ErrorIs(t, CopyOut(make([]float32, 26), p), ErrBadPointer)
	assert.ErrorIs(t, CopyIn(p-1, []byte{1}), ErrBadPointer)
	assert.ErrorIs(t, Memset(p, 0, 101), ErrBadPointer)
	vals, err := ReadFloat32(p, 25)
	require.NoError(t, err)
	assert.Len(t, vals, 25)
	require.NoError(t, Free(p))
	assert.ErrorIs(t, Free(p), ErrBadPointer)
	assert.ErrorIs(t, CopyIn(p, []byte{1}), ErrBadPointer)
}

func TestFindKernels(t *testing.T) {
	src := `
// __global__ void commented_out(int* x) {}
/* __global__ void also_commented(int* x) {} */
#define STR "__global__ void in_a_string("
extern "C" __global__ void plain(float* x);
extern "C" __global__ void plain(float* x) {}
extern "C" __global__ void __launch_bounds__(256, 2) bounded(const float* __restrict__ x, int n) {}
__global__ __launch_bounds__(128) void bounds_first(int n) {}
template <int N> __global__ void templated(float* x) {}
extern "C"
__global__
void
multi_line
(int a) {}
__device__ void not_a_kernel(int) {}
int my__global__thing;
`
	assert.Equal(t, []string{"plain", "bounded", "bounds_first", "multi_line"}, findKernels(src))
}

// --- AddressSanitizer: an out-of-bounds kernel write must be reported. ---

const asanChildEnv = "CNNC_EMU_ASAN_CHILD"

const overflowSource = `extern "C" __global__ void write_past_end(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) x[i] = 1.0f;  // bug: i == n is one past the end
}
`

// asanChild runs the faulty kernel; AddressSanitizer should abort the process.
func asanChild() {
	m, err := Compile([]byte(overflowSource), "overflow.cu", Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "compile:", err)
		os.Exit(3)
	}
	const n = 100
	x, err := Alloc(4 * n)
	if err == nil {
		params, _ := Args(x, n)
		err = m.Launch("write_past_end", Dim1(1), Dim1(128), 0, params)
	}
	fmt.Fprintln(os.Stderr, "NO ASAN REPORT; launch error:", err)
	os.Exit(0)
}

// execSelf re-runs this test binary, running no tests: TestMain acts on the environment.
func execSelf(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

func TestASanReportsOutOfBoundsWrite(t *testing.T) {
	if !asanEnabled {
		t.Skip("needs a binary built with -asan")
	}
	m, err := Compile([]byte(overflowSource), "overflow.cu", Options{}) // warm the cache for the child
	require.NoError(t, err)
	require.NoError(t, m.Close())
	cmd := execSelf(t, asanChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the child should have been stopped by AddressSanitizer:\n%s", out)
	assert.Contains(t, string(out), "AddressSanitizer: heap-buffer-overflow")
	assert.Contains(t, string(out), "overflow.cu:3")
	assert.NotContains(t, string(out), "NO ASAN REPORT")
}

func TestHeaderStandalone(t *testing.T) {
	dir := t.TempDir()
	hdr := dir + "/cuda_emu.h"
	require.NoError(t, os.WriteFile(hdr, []byte(Header()), 0o644))
	bin := dir + "/standalone"
	out, err := exec.Command("g++", "-x", "c++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-include", hdr,
		"testdata/standalone.cu", "-o", bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Empty(t, string(out), "the header should compile without warnings")
	cmd := exec.Command(bin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	require.NoError(t, err, "stderr: %s", stderr.String())
	assert.Equal(t, "block_sum ok\ntraps rc=-1\n", string(stdout))
	assert.Regexp(t, `__trap\(\) in block \([01],0,0\) thread \(9,0,0\)`, stderr.String())
}

// The test kernels are ordinary CUDA: with the same header, nvcc accepts them (when installed).
func TestKernelsCompileWithNvcc(t *testing.T) {
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		t.Skip("nvcc not installed")
	}
	dir := t.TempDir()
	hdr := dir + "/cuda_emu.h"
	require.NoError(t, os.WriteFile(hdr, []byte(Header()), 0o644))
	out, err := exec.Command(nvcc, "-arch=sm_80", "-ptx", "-include", hdr, "-x", "cu", "testdata/kernels.cu",
		"-o", dir+"/kernels.ptx").CombinedOutput()
	require.NoError(t, err, "%s", out)
	ptx, err := os.ReadFile(dir + "/kernels.ptx")
	require.NoError(t, err)
	assert.Contains(t, string(ptx), ".entry matmul_tiled")
}

// Concurrent builds of one library (go test runs packages in parallel, and
// they share the cache) wait for the first and reuse its library: the
// compiler runs once. A wrapper counts the compiles.
func TestConcurrentBuildsCompileOnce(t *testing.T) {
	dir := t.TempDir()
	log := dir + "/compiles.log"
	wrapper := dir + "/cxx"
	require.NoError(t, os.WriteFile(wrapper, []byte(fmt.Sprintf(
		"#!/bin/sh\ncase \" $* \" in *' -o '*) echo compile >> %q;; esac\nexec g++ \"$@\"\n", log)), 0o755))
	src := []byte("extern \"C\" __global__ void fill(int* x, int v) { x[threadIdx.x] = v; }\n")
	opts := Options{CacheDir: dir + "/cache", Compiler: wrapper}
	const builders = 4
	paths := make([]string, builders)
	errs := make([]error, builders)
	var wg sync.WaitGroup
	for i := range builders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = Build(src, "fill.cu", opts)
		}()
	}
	wg.Wait()
	for i := range builders {
		require.NoError(t, errs[i])
		assert.Equal(t, paths[0], paths[i])
	}
	got, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Equal(t, "compile\n", string(got), "the compiler ran more than once for one library")
}
