// Package perf predicts, before anything runs, how long each kernel launch
// of a planned training step takes on a given GPU, and the step.
//
// In:  a compiled plan (trainergen.Compiled: the plan, the training
// program's kernels and launches, the launches' arena offsets) and a GPU
// from the spec table (gpus.go).
// Out: a Prediction — per launch the FLOPs, the bytes, registers and
// shared memory (ptxas), resident warps and waves, tensor cores or FFMA
// (the SASS), shared-memory wavefronts and global sectors (counted on the
// emulator), the time each resource needs, the bound and the predicted
// time; the step is their sum plus the CUDA graph's launch overhead.
//
// Why so: the review that started this package estimated the step by hand
// from ptxas, the SASS and a shared-memory model; a compiler should do that
// itself, on every plan, and count rather than guess. Nothing here is
// measured on a GPU: it is a roofline with occupancy, whose constants
// (below) gpu_check's measurements are to calibrate. Every figure it prints
// is labelled a prediction.
//
// The model, per launch (times in seconds, per resource r):
//
//   - work: FFMA issue (FLOPs/64 warp instructions, plus one issue slot per
//     warp-level memory access) at 4 warp instructions per clock per SM, or
//     the FLOPs at the tensor cores' rate when the kernel's SASS has HMMA;
//     shared wavefronts at one per clock per SM; global sectors × 32 bytes
//     at the L2's bandwidth; the launch's minimum bytes (each input and
//     output once: Launch.MinBytes) at DRAM bandwidth;
//   - residency: blocks per SM from threads, registers (ptxas, allocated
//     per warp in units of 256), shared memory (static + dynamic, plus the
//     1 KiB the driver reserves per block) and the block limit; the grid
//     runs in waves of blocks-per-SM × SMs, the last one partial;
//   - each wave takes, per SM, its blocks' share of the work at the SM's
//     share of the rate, divided by an efficiency that falls below 1 when
//     too few warps are resident to hide latency: warps / 16 for issue and
//     shared memory (4 per scheduler), warps / W for L2 and DRAM, W from
//     Little's law (per-SM bandwidth × latency / bytes in flight per warp);
//     the SMs a wave keeps busy share the L2 and DRAM bandwidth, each at
//     most through its 64-byte-per-clock port (so an underfilled grid gets
//     a fraction of it);
//   - the launch takes the slowest resource's time plus the gap between
//     dependent kernels in a graph; its bound is that resource — or
//     latency (too few warps because the grid is small), occupancy (too
//     few because of registers or shared memory) or launch (the gap
//     exceeds the work).
package perf

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/codegen/trainergen"
)

// Model constants: assumptions to calibrate against gpu_check's measurements.
const (
	// KernelGapSeconds is the time between dependent kernels in a CUDA
	// graph (launch and drain).
	KernelGapSeconds = 1.5e-6
	// GraphLaunchSeconds is cuGraphLaunch's overhead per step.
	GraphLaunchSeconds = 5e-6
	// issueWarps and the memory latencies set the efficiency curve.
	issueWarps         = 16.0
	dramLatencySeconds = 800e-9
	l2LatencySeconds   = 300e-9
	bytesInFlightWarp  = 1024.0 // e.g. 8 independent 128-byte loads per warp
	blockReservedBytes = 1024   // shared memory the driver reserves per block (sm_80+)
	// smPortBytesPerClock is what one SM can move to and from the L2 per
	// clock (a 64-byte port), the most a lone SM of an underfilled grid
	// gets of the memory bandwidth.
	smPortBytesPerClock = 64.0
)

// Launch is the model's account of one launch.
type Launch struct {
	Index  int       `json:"index"`
	Kernel string    `json:"kernel"`
	Layer  string    `json:"layer"`
	Grid   [3]uint32 `json:"grid"`
	Block  [3]uint32 `json:"block"`
	// Registers per thread (ptxas) and shared bytes per block (static +
	// dynamic).
	Registers   int  `json:"registers"`
	SharedBytes int  `json:"shared_bytes"`
	Spills      bool `json:"spills,omitempty"`
	// BlocksPerSM is the occupancy limit and Limiter what sets it
	// (threads, registers, shared, blocks).
	BlocksPerSM int    `json:"blocks_per_sm"`
	Limiter     string `json:"limiter"`
	// WarpsPerSM are resident in the first wave; Waves = blocks /
	// (BlocksPerSM × SMs).
	WarpsPerSM float64 `json:"warps_per_sm"`
	Waves      float64 `json:"waves"`
	FLOPs      int64   `json:"flops"`
	// Tensor is the tensor-core precision of the kernel's HMMA, or "".
	Tensor    string  `json:"tensor,omitempty"`
	DRAMBytes int64   `json:"dram_bytes"`
	L2Bytes   float64 `json:"l2_bytes"`
	// SharedWavefronts counted; SharedIdeal without bank conflicts.
	SharedWavefronts float64 `json:"shared_wavefronts"`
	SharedIdeal      float64 `json:"shared_ideal_wavefronts"`
	// Seconds each resource needs (residency and waves included).
	ComputeSeconds float64 `json:"compute_seconds"`
	SharedSeconds  float64 `json:"shared_seconds"`
	L2Seconds      float64 `json:"l2_seconds"`
	DRAMSeconds    float64 `json:"dram_seconds"`
	Bound          string  `json:"bound"`
	Seconds        float64 `json:"predicted_seconds"`
	// Fill is the fill rule's verdict (fill.go: ok, tiny, small or UNDER-FILLED)
	// and FillWhy its reason.
	Fill    string `json:"fill"`
	FillWhy string `json:"fill_why"`
}

// Prediction is a whole step's.
type Prediction struct {
	GPU      string   `json:"gpu"`
	Model    string   `json:"model"`
	Batch    int      `json:"batch"`
	Launches []Launch `json:"launches"`
	// LaunchSum is the launches' predicted times added up; the step adds
	// the graph's launch overhead.
	LaunchSum            float64 `json:"launch_sum_seconds"`
	GraphLaunchSeconds   float64 `json:"graph_launch_seconds"`
	PredictedStepSeconds float64 `json:"predicted_step_seconds"`
	Note                 string  `json:"note"`
}

// Predict predicts comp's training step on gpu: it compiles the kernels
// for gpu.Arch (nvcc: registers, shared memory, HMMA) and traces a step on
// the emulator (g++: wavefronts and sectors), both cached.
func Predict(comp *trainergen.Compiled, gpu GPU) (*Prediction, error) {
	res, err := Resources(comp.Train.Source, gpu.Arch)
	if err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	acc, err := TraceStep(comp)
	if err != nil {
		return nil, err
	}
	p := &Prediction{GPU: gpu.Name, Model: comp.Spec.Model, Batch: comp.Spec.Batch, GraphLaunchSeconds: GraphLaunchSeconds,
		Note: "a prediction of the performance model (compiler/perf), not a measurement"}
	for i, l := range comp.Spec.Train.Launches {
		r, ok := res[l.Kernel]
		if !ok {
			return nil, fmt.Errorf("perf: ptxas reported nothing about kernel %s", l.Kernel)
		}
		pl := predictLaunch(gpu, l.Grid, l.Block, l.SharedBytes, r, acc[i], l.FLOPs, l.MinBytes,
			launchOutputs(comp.Train.Launches[i].Node, comp.Train.Batch))
		pl.Index, pl.Kernel = i, l.Kernel
		if n := comp.Train.Launches[i].Node; n != nil {
			pl.Layer = n.Name
		}
		p.Launches = append(p.Launches, pl)
		p.LaunchSum += pl.Seconds
	}
	p.PredictedStepSeconds = p.LaunchSum + p.GraphLaunchSeconds
	return p, nil
}

// occupancy is how many blocks of threads threads, regs registers each and
// shared bytes fit on one SM, and what limits them.
func occupancy(gpu GPU, threads, regs, shared int) (int, string) {
	warps := (threads + 31) / 32
	best, limiter := gpu.BlocksPerSM, "blocks"
	limit := func(n int, what string) {
		if n < best {
			best, limiter = n, what
		}
	}
	limit(gpu.ThreadsPerSM/(warps*32), "threads")
	if regs > 0 {
		perWarp := (regs*32 + 255) / 256 * 256
		limit(gpu.RegistersPerSM/(perWarp*warps), "registers")
	}
	limit(gpu.SharedPerSM/(shared+blockReservedBytes), "shared")
	return max(best, 0), limiter
}

// efficiency is the fraction of a resource's rate warps resident warps per
// SM reach when need warps hide its latency.
func efficiency(warps, need float64) float64 {
	return math.Min(1, warps/need)
}

func predictLaunch(gpu GPU, grid, block [3]uint32, dynShared int, r KernelResources, a Accesses, flops, minBytes, outputs int64) Launch {
	threads := int(block[0] * block[1] * block[2])
	warpsPerBlock := float64((threads + 31) / 32)
	blocks := float64(grid[0]) * float64(grid[1]) * float64(grid[2])
	shared := r.StaticShared + dynShared
	l := Launch{Grid: grid, Block: block, Registers: r.Registers, SharedBytes: shared, Spills: r.Spills, FLOPs: flops,
		Tensor: r.TensorKind, DRAMBytes: minBytes, L2Bytes: a.GlobalSectors * 32, SharedWavefronts: a.SharedWavefronts,
		SharedIdeal: a.SharedIdeal}
	l.BlocksPerSM, l.Limiter = occupancy(gpu, threads, r.Registers, shared)
	if l.BlocksPerSM == 0 { // does not fit: the launch fails on the device
		l.Bound, l.Seconds, l.Fill = "does not fit", math.Inf(1), FillShort
		return l
	}
	_, _, fillWaves, avgWarps := residency(gpu, grid, block, dynShared, r)
	l.Fill, l.FillWhy = fillVerdict(gpu, fillWaves, avgWarps, flops, minBytes, outputs)
	sms := float64(gpu.SMs)
	clock := gpu.ClockGHz * 1e9
	perWave := float64(l.BlocksPerSM) * sms
	l.Waves = blocks / perWave
	// the waves: full ones, then a partial last one with fewer blocks per SM
	full := math.Floor(blocks / perWave)
	rest := blocks - full*perWave
	type wave struct{ n, blocksPerSM float64 }
	waves := []wave{{full, float64(l.BlocksPerSM)}}
	if rest > 0 {
		waves = append(waves, wave{1, math.Ceil(rest / sms)})
	}
	l.WarpsPerSM = math.Min(blocks/sms, float64(l.BlocksPerSM)) * warpsPerBlock
	if blocks < sms {
		l.WarpsPerSM = warpsPerBlock // one block on each busy SM
	}

	// per-SM rates (units per second) and the warps that hide each latency
	issue := flops/64 + int64(a.SharedAccesses+a.GlobalAccesses)
	issueRate := 4 * clock
	if r.TensorKind != "" {
		tf := gpu.TF32
		if r.TensorKind == "bf16" {
			tf = gpu.BF16
		}
		// tensor FLOPs at the tensor rate; the memory instructions' issue
		issue = int64(float64(flops) / (tf * 1e12 / sms) * issueRate)
		issue += int64(a.SharedAccesses + a.GlobalAccesses)
	}
	// memory: the SMs busy in a wave share the bandwidth, each at most
	// through its own port to the L2
	port := smPortBytesPerClock * clock
	memRate := func(total, busy float64) float64 { return math.Min(total/busy, port) }
	dramTotal, l2Total := gpu.DRAMGBs*1e9, gpu.L2GBs*1e9
	resources := []struct {
		total float64
		rate  func(busy float64) (perSM, needWarps float64)
		out   *float64
	}{
		{float64(issue), func(float64) (float64, float64) { return issueRate, issueWarps }, &l.ComputeSeconds},
		{a.SharedWavefronts, func(float64) (float64, float64) { return clock, issueWarps }, &l.SharedSeconds},
		{l.L2Bytes, func(busy float64) (float64, float64) {
			r := memRate(l2Total, busy)
			return r, r * l2LatencySeconds / bytesInFlightWarp
		}, &l.L2Seconds},
		{float64(minBytes), func(busy float64) (float64, float64) {
			r := memRate(dramTotal, busy)
			return r, r * dramLatencySeconds / bytesInFlightWarp
		}, &l.DRAMSeconds},
	}
	needs := make([]float64, len(resources)) // in the first wave
	for i, res := range resources {
		perBlock := res.total / blocks
		t := 0.0
		for j, w := range waves {
			if w.n == 0 {
				continue
			}
			busy := sms
			if j == len(waves)-1 && rest > 0 {
				busy = math.Min(sms, rest)
			}
			rate, need := res.rate(busy)
			if needs[i] == 0 {
				needs[i] = need
			}
			t += w.n * w.blocksPerSM * perBlock / (rate * efficiency(w.blocksPerSM*warpsPerBlock, need))
		}
		*res.out = t
	}
	names := []string{"compute", "shared", "memory (L2)", "memory (DRAM)"}
	if r.TensorKind != "" {
		names[0] = "compute (tensor)"
	}
	worst, bound, need := 0.0, names[0], needs[0]
	for i, res := range resources {
		if *res.out > worst {
			worst, bound, need = *res.out, names[i], needs[i]
		}
	}
	switch {
	case worst < KernelGapSeconds:
		bound = "launch"
	case efficiency(l.WarpsPerSM, need) < 0.75 && blocks < perWave:
		bound = "latency (" + bound + ")" // the grid is too small to fill the SMs
	case efficiency(l.WarpsPerSM, need) < 0.75:
		bound = "occupancy (" + bound + ")" // registers or shared memory keep warps out
	}
	l.Bound = bound
	l.Seconds = worst + KernelGapSeconds
	return l
}
