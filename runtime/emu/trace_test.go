package emu

import (
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Access traces: counts on kernels whose wavefronts and sectors follow from the bank and sector
// rules by hand.

var traceShared struct {
	once sync.Once
	mod  *Module
	err  error
}

func traceModule(t *testing.T) *Module {
	t.Helper()
	if asanEnabled {
		t.Skip("trace builds use the kernel AddressSanitizer's instrumentation, which -asan's excludes")
	}
	traceShared.once.Do(func() {
		src, err := os.ReadFile("testdata/trace.cu")
		if err != nil {
			traceShared.err = err
			return
		}
		traceShared.mod, traceShared.err = Compile(src, "trace.cu", Options{Flags: TraceFlags})
	})
	require.NoError(t, traceShared.err)
	return traceShared.mod
}

// sites sums a trace's sites by space and direction.
func sites(ss []AccessSite, space Space, store bool) (accesses, transactions, bytes float64) {
	for _, s := range ss {
		if s.Space == space && s.Store == store {
			accesses += s.Accesses
			transactions += s.Transactions
			bytes += s.Bytes
		}
	}
	return
}

func trace(t *testing.T, m *Module, kernel string, grid, block Dim3, shared int, sample []BlockSample, args ...any) []AccessSite {
	t.Helper()
	ss, err := m.Trace(kernel, grid, block, shared, mustArgs(t, args...), sample)
	require.NoError(t, err)
	return ss
}

func TestTraceGlobalSectors(t *testing.T) {
	m, b := traceModule(t), buffers{t}
	const n = 1000 // 4 blocks of 256: the last warp has 8 lanes
	in, out := b.alloc(4*n*33), b.alloc(4*n)
	for _, c := range []struct {
		stride         int
		sectorsPerWarp float64
		lastWarp       float64 // 8 lanes
	}{{1, 4, 1}, {2, 8, 2}, {8, 32, 8}, {33, 32, 8}} {
		ss := trace(t, m, "strided_copy", Dim1(4), Dim1(256), 0, nil, in, out, c.stride, n)
		acc, sec, by := sites(ss, Global, false)
		warps := 31.0 + 1 // 31 full warps and one of 8 lanes (threads 992..999)
		assert.Equal(t, warps, acc, "stride %d: one load per warp", c.stride)
		assert.Equal(t, 31*c.sectorsPerWarp+c.lastWarp, sec, "stride %d: sectors", c.stride)
		assert.Equal(t, 4.0*n, by)
		acc, sec, _ = sites(ss, Global, true)
		assert.Equal(t, warps, acc)
		assert.Equal(t, 31*4+1.0, sec, "consecutive stores: 4 sectors per warp (the last warp's 32 bytes: 1)")
	}
}

func TestTraceSharedBankConflicts(t *testing.T) {
	m, b := traceModule(t), buffers{t}
	out := b.alloc(4 * 64)
	for _, c := range []struct {
		stride     int
		wavefronts float64 // per warp, for s[t*stride]
	}{{1, 1}, {2, 2}, {4, 4}, {32, 32}, {33, 1}, {0, 1}} {
		ss := trace(t, m, "bank_stride", Dim1(1), Dim1(64), 0, nil, out, c.stride, 0)
		acc, wf, _ := sites(ss, Shared, true)
		assert.Equal(t, 2.0, acc, "stride %d: one store per warp", c.stride)
		assert.Equal(t, 2*c.wavefronts, wf, "stride %d: store wavefronts", c.stride)
		acc, wf, _ = sites(ss, Shared, false)
		assert.Equal(t, 4.0, acc, "stride %d: two loads per warp", c.stride)
		assert.Equal(t, 2*(c.wavefronts+1), wf, "stride %d: load wavefronts (the broadcast of s[0] takes one)", c.stride)
	}
}

func TestTraceVectorAccessesKeepTheirWidth(t *testing.T) {
	m, b := traceModule(t), buffers{t}
	ss := trace(t, m, "vector_loads", Dim1(1), Dim1(32), 4*4*32, nil, b.alloc(4*32))
	var loads []AccessSite
	for _, s := range ss {
		if s.Space == Shared && !s.Store {
			loads = append(loads, s)
		}
	}
	require.Len(t, loads, 1, "one float4 load site: %+v", ss)
	assert.Equal(t, 16, loads[0].Width)
	assert.Equal(t, 1.0, loads[0].Accesses)
	assert.Equal(t, 4.0, loads[0].Transactions, "32 lanes x 16 bytes: 4 phases of 8 lanes, conflict-free")
}

func TestTraceWMMATiles(t *testing.T) {
	m, b := traceModule(t), buffers{t}
	in, out := b.alloc(4*16*64), b.alloc(4*256)
	for _, c := range []struct {
		ldm        int
		wavefronts float64
	}{{8, 4}, {24, 4}, {40, 4}, {12, 8}, {36, 8}, {32, 16}} {
		ss := trace(t, m, "wmma_tile", Dim1(1), Dim1(32), 0, nil, in, out, c.ldm)
		var tile, store *AccessSite
		for i, s := range ss {
			if s.Matrix && s.Space == Shared {
				tile = &ss[i]
			}
			if s.Matrix && s.Space == Global && s.Store {
				store = &ss[i]
			}
		}
		require.NotNil(t, tile, "ldm %d: %+v", c.ldm, ss)
		assert.Equal(t, 1.0, tile.Accesses)
		assert.Equal(t, 16.0*8*4, tile.Bytes)
		assert.Equal(t, c.wavefronts, tile.Transactions, "ldm %d: 32 chunks of 16 bytes, 8 (4 rows) per phase; rows whose banks overlap conflict", c.ldm)
		require.NotNil(t, store)
		assert.Equal(t, 32.0, store.Transactions, "a 16x16 float tile with ldm 16: 1 KiB, 32 sectors")
	}
}

func TestTraceCpAsync(t *testing.T) {
	m, b := traceModule(t), buffers{t}
	ss := trace(t, m, "async_copy", Dim1(1), Dim1(32), 0, nil, b.alloc(4*128), b.alloc(4*32))
	var g, s *AccessSite
	for i := range ss {
		if ss[i].Async && ss[i].Space == Global {
			g = &ss[i]
		}
		if ss[i].Async && ss[i].Space == Shared {
			s = &ss[i]
		}
	}
	require.NotNil(t, g)
	require.NotNil(t, s)
	assert.Equal(t, 16.0, g.Transactions, "512 contiguous bytes: 16 sectors")
	assert.Equal(t, 4.0, s.Transactions, "a 16-byte shared write per lane: 4 wavefronts")
	assert.True(t, s.Store)
}

func TestSampleBlocksWeights(t *testing.T) {
	for _, g := range []Dim3{{1, 1, 1}, {7, 1, 1}, {1000, 3, 1}, {13, 40, 9}} {
		ss := SampleBlocks(g, [3]int{4, 2, 2})
		total, seen := 0.0, map[uint64]bool{}
		for _, s := range ss {
			require.Less(t, s.Block, g.count())
			require.False(t, seen[s.Block], "block %d sampled twice", s.Block)
			seen[s.Block] = true
			total += s.Weight
		}
		assert.InDelta(t, float64(g.count()), total, 1e-9*float64(g.count()), "%v", g)
	}
}

// A sample stands for the grid: on blocks alike, the sampled trace equals the full one.
func TestTraceSampleEqualsFullTrace(t *testing.T) {
	m, b := traceModule(t), buffers{t}
	const blocks, n = 97, 97 * 128
	in, out := b.alloc(4*n*2), b.alloc(4*n)
	full := trace(t, m, "strided_copy", Dim1(blocks), Dim1(128), 0, nil, in, out, 2, n)
	part := trace(t, m, "strided_copy", Dim1(blocks), Dim1(128), 0, SampleBlocks(Dim1(blocks), [3]int{3, 1, 1}), in, out, 2, n)
	require.Equal(t, len(full), len(part))
	for i := range full {
		assert.InDelta(t, full[i].Accesses, part[i].Accesses, 1e-9)
		assert.InDelta(t, full[i].Transactions, part[i].Transactions, 1e-9)
	}
}

func TestTraceNeedsATraceBuild(t *testing.T) {
	m, b := testModule(t), buffers{t}
	_, err := m.Trace("saxpy", Dim1(1), Dim1(32), 0, mustArgs(t, float32(1), b.alloc(128), b.alloc(128), 32), nil)
	require.ErrorIs(t, err, ErrNotTraceable)
}
