package perf

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler/ir"
)

// The fill rule (issue 11): every launch of a step keeps the GPU busy —
// its grid runs at least FillWaves waves, or puts at least FillWarpsPerSM
// warps on every SM (averaged over all the GPU's SMs: a grid of fewer
// blocks than SMs leaves the rest idle) — unless it is tiny by nature:
// its whole work at the GPU's peak rates, the larger of its FLOPs at the
// FP32 rate (also for tensor-core kernels: the stricter reading, and one
// that needs no SASS) and its minimum bytes at DRAM bandwidth, takes under
// TinyLaunchSeconds, less than the gap between
// dependent kernels, so that no grid could save more than the launch
// costs anyway — or small by nature: its op's outputs, at one thread
// each, are fewer than FillWarpsPerSM warps on every SM (the fill itself
// asks more threads than there is work to give them), and each such
// thread's share of the FLOPs, at one FMA a clock, takes under
// TinyLaunchSeconds (so splitting the op's reductions into more threads
// could save less than the extra launch and partials cost; a deep
// reduction over few outputs — a weight gradient — is not small: it is
// split to fill). Residency is the model's (ptxas registers and shared
// memory, the grid): nothing here needs the emulator's trace.
const (
	FillWarpsPerSM    = 16.0
	FillWaves         = 2.0
	TinyLaunchSeconds = 1e-6
)

// FillOK, FillTiny, FillSmall and FillShort are Launch.Fill's verdicts.
const (
	FillOK    = "ok"
	FillTiny  = "tiny"
	FillSmall = "small"
	FillShort = "UNDER-FILLED"
)

// residency is a launch's blocks per SM (and what limits them), waves and
// warps per SM averaged over all the SMs in the first wave.
func residency(gpu GPU, grid, block [3]uint32, dynShared int, r KernelResources) (blocksPerSM int, limiter string, waves, avgWarps float64) {
	threads := int(block[0] * block[1] * block[2])
	blocks := float64(grid[0]) * float64(grid[1]) * float64(grid[2])
	blocksPerSM, limiter = occupancy(gpu, threads, r.Registers, r.StaticShared+dynShared)
	if blocksPerSM == 0 {
		return 0, limiter, math.Inf(1), 0
	}
	sms := float64(gpu.SMs)
	waves = blocks / (float64(blocksPerSM) * sms)
	avgWarps = math.Min(blocks/sms, float64(blocksPerSM)) * float64((threads+31)/32)
	return blocksPerSM, limiter, waves, avgWarps
}

// minimumSeconds is a launch's work at the whole GPU's peak rates (its
// FLOPs at the FP32 rate).
func minimumSeconds(gpu GPU, flops, minBytes int64) float64 {
	return math.Max(float64(flops)/(gpu.FP32*1e12), float64(minBytes)/(gpu.DRAMGBs*1e9))
}

// fillVerdict is the fill rule's verdict on a launch and why; outputs is
// how many elements the launch's op writes (launchOutputs; 0: unknown,
// never small).
func fillVerdict(gpu GPU, waves, avgWarps float64, flops, minBytes, outputs int64) (string, string) {
	if waves >= FillWaves || avgWarps >= FillWarpsPerSM {
		return FillOK, fmt.Sprintf("%.2f waves, %.1f warps/SM", waves, avgWarps)
	}
	if t := minimumSeconds(gpu, flops, minBytes); t < TinyLaunchSeconds {
		return FillTiny, fmt.Sprintf("%.2f µs of work at peak rates < %.1f µs", 1e6*t, 1e6*TinyLaunchSeconds)
	}
	if outputs > 0 {
		warps, need := (outputs+31)/32, int64(FillWarpsPerSM)*int64(gpu.SMs)
		perThread := float64(flops) / float64(outputs) / 2 / (gpu.ClockGHz * 1e9) // FMAs at one a clock
		if warps < need && perThread < TinyLaunchSeconds {
			return FillSmall, fmt.Sprintf("%d outputs: %d warps at one thread each < %d (%.0f per SM x %d SMs), %.2f µs of FMAs per thread < %.1f µs",
				outputs, warps, need, FillWarpsPerSM, gpu.SMs, 1e6*perThread, 1e6*TinyLaunchSeconds)
		}
	}
	return FillShort, fmt.Sprintf("%.2f waves, %.1f warps/SM: under %.0f waves and %.0f warps/SM", waves, avgWarps, FillWaves, FillWarpsPerSM)
}

// FillCheck is one launch's fill verdict.
type FillCheck struct {
	Index         int
	Kernel, Layer string
	Grid, Block   [3]uint32
	Registers     int
	BlocksPerSM   int
	Waves, Warps  float64
	Verdict, Why  string
}

// CheckFill applies the fill rule to every launch of comp's training step
// on gpu, from ptxas (nvcc) and the grids alone.
func CheckFill(comp *trainergen.Compiled, gpu GPU) ([]FillCheck, error) {
	res, err := PtxasResources(comp.Train.Source, gpu.Arch)
	if err != nil {
		return nil, err
	}
	return checkFill(comp, gpu, res)
}

// PtxasResources is what ptxas says of source's kernels built for arch:
// registers, static shared memory and spills (Resources without the SASS:
// no tensor-core count, no instructions).
func PtxasResources(source []byte, arch string) (map[string]KernelResources, error) {
	ks, err := codegen.CompilePtxas(source, "kernels.cu", []string{arch})
	if err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	out := map[string]KernelResources{}
	for _, k := range ks {
		out[k.Name] = KernelResources{Registers: k.Registers, StaticShared: k.SharedBytes, Spills: !k.Clean()}
	}
	return out, nil
}

// launchOutputs is how many elements node n's launch computes at batch:
// its outputs and the parameters it updates in place (a fused update:
// the thread that computes a weight's gradient updates it and its
// optimizer state, one output); 0 without a node.
func launchOutputs(n *ir.Node, batch int64) int64 {
	if n == nil {
		return 0
	}
	var out int64
	for _, v := range n.Outs {
		out += v.Type.Elems(batch)
	}
	for _, p := range n.UpdatedParams() {
		out += p.Value.Type.Elems(batch)
	}
	return out
}

// checkFill is CheckFill with the kernels' resources (for gpu.Arch) given.
func checkFill(comp *trainergen.Compiled, gpu GPU, res map[string]KernelResources) ([]FillCheck, error) {
	var out []FillCheck
	for i, l := range comp.Spec.Train.Launches {
		r, ok := res[l.Kernel]
		if !ok {
			return nil, fmt.Errorf("perf: ptxas reported nothing about kernel %s", l.Kernel)
		}
		c := FillCheck{Index: i, Kernel: l.Kernel, Grid: l.Grid, Block: l.Block, Registers: r.Registers}
		if n := comp.Train.Launches[i].Node; n != nil {
			c.Layer = n.Name
		}
		c.BlocksPerSM, _, c.Waves, c.Warps = residency(gpu, l.Grid, l.Block, l.SharedBytes, r)
		c.Verdict, c.Why = fillVerdict(gpu, c.Waves, c.Warps, l.FLOPs, l.MinBytes, launchOutputs(comp.Train.Launches[i].Node, comp.Train.Batch))
		out = append(out, c)
	}
	return out, nil
}
