package emu

// Access traces: what the performance model (compiler/perf) counts instead of guessing — every
// shared and global memory access of a kernel, grouped per warp and access site, costed in
// shared-memory wavefronts and global 32-byte sectors (see cuda_emu.h, "Access traces"). The C
// calls of tracing live here, next to the rest of it.

/*
#include <stdint.h>
#include <stdlib.h>

typedef struct {
	uint64_t site;
	uint32_t width;
	uint8_t flags;
	uint8_t pad[3];
	double accesses, lanes, transactions, bytes;
} emu_trace_site;

static void* emu_trace_new(void* fn, const uint64_t* lo, const uint64_t* hi, size_t nspans, const uint64_t* blocks,
                           const double* weights, size_t nblocks) {
	return ((void* (*)(const uint64_t*, const uint64_t*, size_t, const uint64_t*, const double*, size_t))fn)(
		lo, hi, nspans, blocks, weights, nblocks);
}
static int emu_launch_set_trace(void* fn, void* launch, void* trace) { return ((int (*)(void*, void*))fn)(launch, trace); }
static long emu_trace_sites(void* fn, void* trace, emu_trace_site* out, size_t cap) {
	return ((long (*)(void*, emu_trace_site*, size_t))fn)(trace, out, cap);
}
static void emu_trace_free(void* fn, void* trace) { ((void (*)(void*))fn)(trace); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sort"
	"unsafe"
)

// TraceFlags are the compiler flags (Options.Flags) of a module whose launches Trace can record:
// every memory access becomes a call (GCC's kernel AddressSanitizer instrumentation, whose calls
// the emulation header implements as recorders), and the optimisations that would change the
// width of accesses — splitting aggregates (float4 loads) into scalars, or vectorising scalar
// ones — are off, so that each access keeps the width the kernel's source gives it, as nvcc
// does. Such a module runs far slower than a plain one; use it for tracing only.
var TraceFlags = []string{
	"-DCNNC_EMU_TRACE=1", "-fsanitize=kernel-address",
	"--param", "asan-instrumentation-with-call-threshold=0", "--param", "asan-stack=0", "--param", "asan-globals=0",
	"-fno-tree-sra", "-fno-tree-vectorize", "-fno-tree-slp-vectorize",
}

// Space is the memory an access reaches.
type Space uint8

const (
	Global Space = iota
	Shared
)

func (s Space) String() string {
	if s == Shared {
		return "shared"
	}
	return "global"
}

// AccessSite is what one load or store site of a kernel did over a launch (the sampled blocks,
// each weighted by the blocks it stands for).
type AccessSite struct {
	PC     uint64 // the access instruction's offset in the module (addr2line gives its line)
	Space  Space
	Store  bool
	Matrix bool // a wmma load or store of a whole tile
	Async  bool // cp.async: its global read or its shared write
	Width  int  // bytes per lane (matrix: per element)
	// Accesses is the number of warp-level accesses (instructions; a matrix call counts once),
	// Lanes the lanes taking part, summed over them.
	Accesses, Lanes float64
	// Transactions: shared-memory wavefronts (at least one per access; more with bank
	// conflicts) or global-memory 32-byte sectors.
	Transactions float64
	Bytes        float64 // bytes requested
}

// BlockSample is a block to trace (its linear index x + gx·(y + gy·z)) and how many blocks of the
// grid it stands for.
type BlockSample struct {
	Block  uint64
	Weight float64
}

// SampleBlocks chooses the blocks of grid to trace: in each dimension, the first and the last
// block and up to interior[d] evenly spaced ones between (which stand for the interior in equal
// shares), every combination of them, weighted so that the weights add up to the grid's size.
// Blocks at a grid's edges are where partial tiles differ; the interior repeats.
func SampleBlocks(grid Dim3, interior [3]int) []BlockSample {
	type pick struct {
		idx    uint32
		weight float64
	}
	dim := func(n uint32, k int) []pick {
		if n <= uint32(k)+2 {
			ps := make([]pick, n)
			for i := range ps {
				ps[i] = pick{uint32(i), 1}
			}
			return ps
		}
		ps := []pick{{0, 1}}
		inner := n - 2
		for j := 0; j < k; j++ {
			ps = append(ps, pick{1 + uint32((uint64(2*j+1)*uint64(inner))/uint64(2*k)), float64(inner) / float64(k)})
		}
		return append(ps, pick{n - 1, 1})
	}
	xs, ys, zs := dim(grid.X, interior[0]), dim(grid.Y, interior[1]), dim(grid.Z, interior[2])
	var out []BlockSample
	for _, z := range zs {
		for _, y := range ys {
			for _, x := range xs {
				out = append(out, BlockSample{
					Block:  uint64(x.idx) + uint64(grid.X)*(uint64(y.idx)+uint64(grid.Y)*uint64(z.idx)),
					Weight: x.weight * y.weight * z.weight,
				})
			}
		}
	}
	return out
}

// ErrNotTraceable: the module was not compiled with TraceFlags.
var ErrNotTraceable = errors.New("emu: module not compiled with emu.TraceFlags")

// Trace runs a kernel on the sampled blocks only (all of them when sample is nil) and returns
// what each of its access sites did, sorted by PC. Memory the blocks not run would have written
// is left as it was. Global memory is what Alloc handed out.
func (m *Module) Trace(kernelName string, grid, block Dim3, sharedBytes int, params []uint64, sample []BlockSample) ([]AccessSite, error) {
	fns := make([]unsafe.Pointer, 4)
	m.mu.RLock()
	if m.lib == nil {
		m.mu.RUnlock()
		return nil, ErrClosed
	}
	for i, name := range []string{"cnnc_emu_trace_new", "cnnc_emu_launch_set_trace", "cnnc_emu_trace_sites", "cnnc_emu_trace_free"} {
		p, err := m.lib.symbol(name)
		if err != nil {
			m.mu.RUnlock()
			return nil, ErrNotTraceable
		}
		fns[i] = p
	}
	m.mu.RUnlock()
	if sample == nil {
		sample = SampleBlocks(grid, [3]int{1 << 30, 1 << 30, 1 << 30})
	}
	allocs.Lock()
	lo, hi := make([]C.uint64_t, len(allocs.spans)), make([]C.uint64_t, len(allocs.spans))
	for i, s := range allocs.spans {
		lo[i], hi[i] = C.uint64_t(s.base), C.uint64_t(uint64(s.base)+uint64(s.size))
	}
	allocs.Unlock()
	blocks, weights := make([]C.uint64_t, len(sample)), make([]C.double, len(sample))
	for i, s := range sample {
		blocks[i], weights[i] = C.uint64_t(s.Block), C.double(s.Weight)
	}
	trace := C.emu_trace_new(fns[0], cptr(lo), cptr(hi), C.size_t(len(lo)), cptr(blocks), cptr(weights), C.size_t(len(blocks)))
	if trace == nil {
		return nil, errors.New("emu: out of memory for a trace")
	}
	defer C.emu_trace_free(fns[3], trace)
	err := m.launch(kernelName, grid, block, sharedBytes, params, func(launch unsafe.Pointer) error {
		if C.emu_launch_set_trace(fns[1], launch, trace) != 0 {
			return fmt.Errorf("a sampled block lies outside the grid %v", grid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	n := C.emu_trace_sites(fns[2], trace, nil, 0)
	if n < 0 {
		return nil, fmt.Errorf("emu: tracing %s: a warp made more than 16M accesses between two barriers", kernelName)
	}
	if n == 0 {
		return nil, nil
	}
	cs := make([]C.emu_trace_site, n)
	C.emu_trace_sites(fns[2], trace, &cs[0], C.size_t(n))
	out := make([]AccessSite, n)
	for i, c := range cs {
		out[i] = AccessSite{PC: uint64(c.site), Width: int(c.width), Space: Space((c.flags >> 1) & 1),
			Store: c.flags&1 != 0, Matrix: c.flags&4 != 0, Async: c.flags&16 != 0,
			Accesses: float64(c.accesses), Lanes: float64(c.lanes), Transactions: float64(c.transactions), Bytes: float64(c.bytes)}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PC != out[j].PC {
			return out[i].PC < out[j].PC
		}
		return out[i].Space < out[j].Space || out[i].Space == out[j].Space && !out[i].Store && out[j].Store
	})
	return out, nil
}

// cptr is the address of a slice's first element for C (nil when empty).
func cptr[T any](s []T) *T {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}
