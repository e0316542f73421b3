package perf

import (
	"encoding/json"
	"github.com/cnnc/cnnc/driver"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/internal/nvcc"
)

func compileExample(t *testing.T, file string, batch int64, cfg plan.Config) *trainergen.Compiled {
	t.Helper()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	res, err := compiler.CompileSource(file, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	comp, err := driver.Compile(res, cfg, driver.CUDA)
	require.NoError(t, err)
	return comp
}

// Occupancy by the CUDA occupancy rules, worked by hand for H100/H200
// (65536 registers, 2048 threads, 32 blocks, 228 KiB shared per SM).
func TestOccupancy(t *testing.T) {
	h := GPUs["h200"]
	for _, c := range []struct {
		threads, regs, shared int
		blocks                int
		limiter               string
	}{
		{64, 127, 10800, 8, "registers"}, // 127 -> 128 regs x 32 lanes = 4096 per warp, 2 warps: 8192 per block
		{256, 32, 0, 8, "threads"},       // 2048 / 256
		{256, 40, 6272, 6, "registers"},  // 40 x 32 = 1280 per warp, 8 warps: 10240; 65536/10240 = 6
		{32, 16, 0, 32, "blocks"},        // 64 warps would fit; the 32-block limit binds
		{128, 32, 48 << 10, 4, "shared"}, // 228 KiB / (48 KiB + 1 KiB) = 4
		{1024, 64, 0, 1, "registers"},    // 64 x 32 x 32 warps = 65536: exactly one block
		{1024, 72, 0, 0, "registers"},    // 72 registers x 1024 threads do not fit at all
		{96, 24, 100 << 10, 2, "shared"}, // 228 / 101 = 2
	} {
		b, lim := occupancy(h, c.threads, c.regs, c.shared)
		assert.Equal(t, c.blocks, b, "%+v", c)
		assert.Equal(t, c.limiter, lim, "%+v", c)
	}
}

// A compute-bound kernel: one full wave takes its work at the full rate; one
// block more adds a second (nearly empty) wave, the tail; a grid of one
// block per SM leaves warps too few to hide latency.
func TestPredictLaunchWavesAndBounds(t *testing.T) {
	h := GPUs["h200"]
	res := KernelResources{Registers: 32}
	block := [3]uint32{256, 1, 1}
	perBlock := int64(1 << 24) // FLOPs per block
	wave := int64(8 * h.SMs)   // 8 blocks of 256 threads per SM
	one := predictLaunch(h, [3]uint32{uint32(wave), 1, 1}, block, 0, res, Accesses{}, perBlock*wave, 0, 0)
	assert.Equal(t, "compute", one.Bound)
	assert.InDelta(t, 1.0, one.Waves, 1e-12)
	// FLOPs/64 FFMA warp instructions per SM at 4 per clock
	want := float64(perBlock*8) / 64 / (4 * h.ClockGHz * 1e9)
	assert.InDelta(t, want, one.ComputeSeconds, 1e-12)
	assert.InDelta(t, want+KernelGapSeconds, one.Seconds, 1e-12)
	tail := predictLaunch(h, [3]uint32{uint32(wave + 1), 1, 1}, block, 0, res, Accesses{}, perBlock*(wave+1), 0, 0)
	assert.InDelta(t, want+float64(perBlock)/64/(4*h.ClockGHz*1e9)/0.5, tail.ComputeSeconds, 1e-12,
		"the tail: one block of 8 warps (efficiency 8/16) on one SM")
	small := predictLaunch(h, [3]uint32{uint32(h.SMs), 1, 1}, block, 0, res, Accesses{}, perBlock*int64(h.SMs), 0, 0)
	assert.Equal(t, "latency (compute)", small.Bound, "8 warps per SM")
	tiny := predictLaunch(h, [3]uint32{1, 1, 1}, block, 0, res, Accesses{}, 1000, 4000, 0)
	assert.Equal(t, "launch", tiny.Bound)
	// DRAM-bound: a stream of 1 GB
	stream := predictLaunch(h, [3]uint32{uint32(wave * 100), 1, 1}, block, 0, res, Accesses{GlobalSectors: 1e9 / 32}, 0, 1e9, 0)
	assert.Equal(t, "memory (DRAM)", stream.Bound)
	assert.InDelta(t, 1e9/(h.DRAMGBs*1e9), stream.DRAMSeconds, 1e-9)
	// registers that keep warps out: occupancy
	fat := predictLaunch(h, [3]uint32{uint32(wave * 10), 1, 1}, [3]uint32{64, 1, 1}, 0, KernelResources{Registers: 255}, Accesses{}, 1e12, 0, 0)
	assert.Equal(t, "occupancy (compute)", fat.Bound)
	// a kernel that cannot start
	none := predictLaunch(h, [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1}, 0, KernelResources{Registers: 128}, Accesses{}, 1, 1, 0)
	assert.True(t, math.IsInf(none.Seconds, 1))
}

// The examples' steps are predicted launch by launch from real counts.
func TestPredictExamples(t *testing.T) {
	nvcc.Require(t)
	for _, c := range []struct {
		file  string
		batch int64
		gpu   string
	}{
		{"../../examples/simplecnn.cnn", 32, "h200"},
		{"../../examples/mnist.cnn", 64, "a100"},
	} {
		comp := compileExample(t, c.file, c.batch, plan.Config{})
		p, err := Predict(comp, GPUs[c.gpu])
		require.NoError(t, err)
		require.Len(t, p.Launches, len(comp.Spec.Train.Launches))
		sum := 0.0
		for i, l := range p.Launches {
			spec := comp.Spec.Train.Launches[i]
			assert.Equal(t, spec.FLOPs, l.FLOPs)
			assert.Equal(t, spec.MinBytes, l.DRAMBytes)
			assert.Positive(t, l.Registers, l.Kernel)
			assert.Positive(t, l.BlocksPerSM, l.Kernel)
			assert.Greater(t, l.Seconds, KernelGapSeconds, l.Kernel)
			assert.Positive(t, l.L2Bytes, "%s: every kernel reads global memory", l.Kernel)
			assert.NotEmpty(t, l.Bound)
			sum += l.Seconds
		}
		assert.InDelta(t, sum+GraphLaunchSeconds, p.PredictedStepSeconds, 1e-12)
		data, err := json.Marshal(p)
		require.NoError(t, err)
		assert.Contains(t, string(data), `"predicted_step_seconds":`)
		t.Log(p.Summary())
	}
}

// Counting a sample of the blocks stands for counting them all: on a whole
// step of MNISTNet at batch 4, every launch's shared wavefronts, global
// sectors and accesses from the sample are within 5% of the full count.
func TestTraceSampleMatchesEveryBlock(t *testing.T) {
	comp := compileExample(t, "../../examples/mnist.cnn", 4, plan.Config{})
	sampled, err := traceStep(comp, sampleWith(traceSample), nil, nil, false)
	require.NoError(t, err)
	full, err := traceStep(comp, everyBlock, nil, nil, false)
	require.NoError(t, err)
	for i := range full {
		k := comp.Spec.Train.Launches[i].Kernel
		for _, q := range []struct {
			what       string
			got, exact float64
		}{
			{"shared wavefronts", sampled[i].SharedWavefronts, full[i].SharedWavefronts},
			{"global sectors", sampled[i].GlobalSectors, full[i].GlobalSectors},
			{"global accesses", sampled[i].GlobalAccesses, full[i].GlobalAccesses},
		} {
			assert.InEpsilon(t, q.exact+1, q.got+1, 0.05, "%s: %s", k, q.what)
		}
	}
}
