package perf

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// fixupTailSeconds is the model's time for the serial tail of a "last block
// reduces" split-K fix-up: after the last split ends, one block of warps
// warps reads reads partial tiles of tileBytes from the L2 (the partials
// were just written) on an otherwise idle SM — its 64-byte port at the
// efficiency its warps give (Little's law, as predictLaunch) — and waits
// roundTrips dependent L2 round trips (a fence and a counter's atomic per
// level). The epilogue's own bytes (the update's weights and state) are
// left out: the tail is a lower bound.
func fixupTailSeconds(gpu GPU, warps, tileBytes float64, reads, roundTrips int) float64 {
	port := smPortBytesPerClock * gpu.ClockGHz * 1e9
	rate := port * efficiency(warps, port*l2LatencySeconds/bytesInFlightWarp)
	return float64(reads)*tileBytes/rate + float64(roundTrips)*l2LatencySeconds
}

// The split-K reduces stay launches of their own (codegen/linear.go's
// split-K constants): for SimpleCNN's three on the H200, at batches 32 and
// 256, every form of the fix-up's tail — one level (the last block adds all
// S splits), two (√S groups, the last of each group adds its group, the
// last group's adds the groups) or a tree of pairs (log2 S levels) — takes
// longer than a reduce launch whose work is under its gap can (two gaps),
// so folding the reduce in would add time, not save it. If calibration
// (gpu_check) moves these constants so that a tail fits, the comment in
// codegen/linear.go and this test are to be revisited.
func TestSplitKFixupTailIsSlowerThanTheReduceLaunch(t *testing.T) {
	gpu := GPUs["h200"]
	for _, c := range []struct {
		name              string
		splits, tileElems int
	}{
		{"fc1 b32 (4x1x225, 32x32 tiles)", 225, 1024},
		{"conv2 wgrad b32/b256 (3x1x176, 32x48 tiles)", 176, 1536},
		{"conv1 wgrad b32/b256 (1x1x528, a 16x32 tile)", 528, 512},
		{"fc1 b256 (4x8x33, 32x32 tiles)", 33, 1024},
	} {
		const warps = 4 // the tensor-core GEMM's and weight gradient's blocks
		tile := 4 * float64(c.tileElems)
		g := int(math.Ceil(math.Sqrt(float64(c.splits))))
		levels := int(math.Ceil(math.Log2(float64(c.splits))))
		for _, tail := range []struct {
			form string
			s    float64
		}{
			{"one level", fixupTailSeconds(gpu, warps, tile, c.splits, 1)},
			{"two levels", fixupTailSeconds(gpu, warps, tile, g+(c.splits+g-1)/g, 2)},
			{"a tree of pairs", fixupTailSeconds(gpu, warps, tile, 2*levels, 2*levels)},
		} {
			t.Logf("%s: the fix-up's tail in %s takes %.1f µs", c.name, tail.form, tail.s*1e6)
			assert.Greater(t, tail.s, 2*KernelGapSeconds, "%s, %s: the tail fits in a reduce launch's time", c.name, tail.form)
		}
	}
}
