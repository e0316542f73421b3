package emu

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Race mode (Module.SetSchedule): kernels that need a barrier they lack give other bits in the
// reverse or shuffled orders; correct ones, warp-synchronous ones and layout-free wmma ones give
// the same bits in every order.

// raceModule compiles testdata/race.cu into its own module (race mode changes a module's launches).
func raceModule(t *testing.T, file string) *Module {
	t.Helper()
	src, err := os.ReadFile("testdata/" + file)
	require.NoError(t, err)
	m, err := Compile(src, file, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

var raceSchedules = []Schedule{{Order: OrderReverse}, {Order: OrderShuffle, Seed: 1}, {Order: OrderShuffle, Seed: 2},
	{Order: OrderShuffle, Seed: 0xABCDEF}}

// runOrders runs a launch in the forward order and in every race schedule and returns the
// outputs (read by out) per schedule, forward first.
func runOrders(t *testing.T, m *Module, run func() []uint32) [][]uint32 {
	t.Helper()
	m.SetSchedule(Schedule{Order: OrderForward})
	results := [][]uint32{run()}
	for _, s := range raceSchedules {
		m.SetSchedule(s)
		results = append(results, run())
	}
	return results
}

func TestRaceModeCatchesAMissingBarrier(t *testing.T) {
	m, b := raceModule(t, "race.cu"), buffers{t}
	const blocks, threads = 3, 256
	in := randomMatrix(rand.New(rand.NewPCG(12, 13)), blocks*threads)
	x, y := allocCopy(b, in), b.alloc(4*blocks*threads)
	want := make([]uint32, blocks*threads)
	for i := range want {
		if i%threads > 0 {
			want[i] = math.Float32bits(in[i-1])
		}
	}
	for _, kernel := range []string{"neighbour_nosync", "neighbour_sync"} {
		res := runOrders(t, m, func() []uint32 {
			launch(t, m, kernel, Dim1(blocks), Dim1(threads), 0, x, y)
			return read[uint32](t, y, blocks*threads)
		})
		require.Equal(t, want, res[0], "%s: the forward order gives the right answer", kernel)
		for i, s := range raceSchedules {
			if kernel == "neighbour_sync" {
				require.Equal(t, res[0], res[i+1], "%s under %v", kernel, s)
			} else {
				require.NotEqual(t, res[0], res[i+1], "%s under %v: the race must show", kernel, s)
			}
		}
	}
}

func TestRaceModeWarpSynchronousCodeAgrees(t *testing.T) {
	m, b := raceModule(t, "race.cu"), buffers{t}
	const blocks, threads = 2, 96
	x, y := allocCopy(b, randomMatrix(rand.New(rand.NewPCG(14, 15)), blocks*threads)), b.alloc(4*blocks*threads)
	res := runOrders(t, m, func() []uint32 {
		launch(t, m, "warp_exchange", Dim1(blocks), Dim1(threads), 4*threads, x, y)
		return read[uint32](t, y, blocks*threads)
	})
	for i := range raceSchedules {
		require.Equal(t, res[0], res[i+1], "under %v", raceSchedules[i])
	}
}

func TestRaceModePoisonsStaticSharedMemory(t *testing.T) {
	m, b := raceModule(t, "race.cu"), buffers{t}
	y := b.alloc(4 * 64)
	for _, r := range runOrders(t, m, func() []uint32 {
		launch(t, m, "read_unwritten", Dim1(1), Dim1(64), 0, y, 0)
		return read[uint32](t, y, 64)
	}) {
		for _, v := range r {
			require.Equal(t, uint32(0xffffffff), v)
		}
	}
}

// Fragments may only be touched elementwise: such kernels give the same bits in every order (the
// race orders permute the element layout), and one that assumes a layout does not.
func TestRaceModePermutesFragmentLayouts(t *testing.T) {
	src, err := os.ReadFile("testdata/tensorcore.cu")
	require.NoError(t, err)
	m, err := Compile(src, "tensorcore.cu", Options{})
	require.NoError(t, err)
	defer m.Close()
	b := buffers{t}
	rng := rand.New(rand.NewPCG(16, 17))
	in := allocCopy(b, randomMatrix(rng, 256))
	out := b.alloc(4 * 256)
	for _, kernel := range []string{"frag_scale", "frag_layout_dependent"} {
		res := runOrders(t, m, func() []uint32 {
			launch(t, m, kernel, Dim1(1), Dim1(32), 0, in, out)
			return read[uint32](t, out, 256)
		})
		for i, s := range raceSchedules {
			if kernel == "frag_scale" {
				require.Equal(t, res[0], res[i+1], "%s under %v", kernel, s)
			} else {
				require.NotEqual(t, res[0], res[i+1], "%s under %v: the layout dependence must show", kernel, s)
			}
		}
	}
	const M, N, K = 37, 29, 45
	A, B := allocCopy(b, randomMatrix(rng, M*K)), allocCopy(b, randomMatrix(rng, K*N))
	C := b.alloc(4 * M * N)
	tiles := ((M + 15) / 16) * ((N + 15) / 16)
	for _, transposed := range []int{0, 1} {
		res := runOrders(t, m, func() []uint32 {
			launch(t, m, "gemm_tf32", Dim1(uint32((tiles+3)/4)), Dim1(128), 0, A, B, C, M, N, K, K, N, N, transposed)
			return read[uint32](t, C, M*N)
		})
		for i := range raceSchedules {
			require.Equal(t, res[0], res[i+1], "gemm_tf32 under %v", raceSchedules[i])
		}
	}
}

// The race-mode orders also change the order of a grid's blocks, so which block of a "last block
// reduces" kernel arrives last changes with the schedule: a sum in a fixed order gives the same bits
// in every order, one that starts at the last block does not; the counter is back at 0 after each.
func TestRaceModeChangesWhichBlockIsLast(t *testing.T) {
	m, b := raceModule(t, "race.cu"), buffers{t}
	m.SetWorkers(1) // the block order is then exactly the schedule's
	const blocks = 61
	in := randomMatrix(rand.New(rand.NewPCG(16, 17)), blocks*32)
	for i := range in {
		in[i] *= float32(math.Ldexp(1, i%23-11)) // magnitudes far apart: the order of the sum shows
	}
	x, partial, counter := allocCopy(b, in), b.alloc(4*blocks*32), allocCopy(b, []uint32{0})
	out, last := b.alloc(4*32), b.alloc(4)
	for _, ordered := range []int32{1, 0} {
		var lasts []uint32
		res := runOrders(t, m, func() []uint32 {
			launch(t, m, "last_block_sum", Dim1(blocks), Dim1(32), 0, x, partial, counter, out, last, ordered)
			require.Equal(t, []uint32{0}, read[uint32](t, counter, 1), "the last block resets the counter")
			lasts = append(lasts, read[uint32](t, last, 1)[0])
			return read[uint32](t, out, 32)
		})
		require.Equal(t, uint32(blocks-1), lasts[0], "forward: the last block of the grid is last")
		require.Equal(t, uint32(0), lasts[1], "reverse: block 0 is last")
		for i, s := range raceSchedules[1:] {
			require.NotEqual(t, lasts[0], lasts[i+2], "under %v another block is last", s)
		}
		for i, s := range raceSchedules {
			if ordered == 1 {
				require.Equal(t, res[0], res[i+1], "the sum in block order under %v", s)
			} else {
				require.NotEqual(t, res[0], res[i+1], "the sum from the last block under %v: the race must show", s)
			}
		}
	}
}
