package perf

import (
	"fmt"
	"sort"
	"strings"
)

// GPU is what the model needs to know about a target.
type GPU struct {
	Name string
	Arch string // the SASS target ptxas compiles for (registers, HMMA)
	SMs  int
	// ClockGHz is the boost clock the throughput figures assume.
	ClockGHz float64
	// Peak throughputs, dense, in TFLOP/s: FP32 on the CUDA cores (FFMA),
	// TF32 and BF16 (FP32 accumulation) on the tensor cores.
	FP32, TF32, BF16 float64
	// DRAMGBs is the memory bandwidth; L2GBs the L2 cache's (NVIDIA does
	// not publish it: an estimate, see below); L2Bytes its size.
	DRAMGBs, L2GBs float64
	L2Bytes        int64
	// Per SM: shared memory (all of it, and what one block may opt into),
	// 32-bit registers, resident threads and blocks.
	SharedPerSM, SharedPerBlock int
	RegistersPerSM              int
	ThreadsPerSM, BlocksPerSM   int
}

// GPUs is the spec table. Sources: NVIDIA's datasheets and architecture
// whitepapers for SMs, clocks, peak rates and memory bandwidth (H100 and H200
// Tensor Core GPU datasheets: the SXM parts; "NVIDIA H100 Tensor Core GPU
// Architecture" whitepaper, table 3, for the per-precision dense rates; A100
// Tensor Core GPU datasheet and "NVIDIA A100 Tensor Core GPU Architecture"
// whitepaper, table 1: the 80 GB SXM4 part; NVIDIA L4 Tensor Core GPU
// datasheet; "NVIDIA Ada GPU Architecture" whitepaper, appendix A, for the
// GeForce RTX 4090 — its TF32 and FP32-accumulate BF16 rates are half of the
// professional Ada parts'). Datasheets quote tensor rates with 2:4 sparsity;
// the table holds the dense halves. Per-SM limits are the CUDA C++
// Programming Guide's "Technical Specifications per Compute Capability"
// (8.0: 164 KB shared per SM, 163 KB per block, 2048 threads, 32 blocks; 8.9:
// 100 KB, 99 KB, 1536 threads, 24 blocks; 9.0: 228 KB, 227 KB, 2048 threads,
// 32 blocks). L2 bandwidth is not published: the figures are estimates of
// 5120 bytes per clock for A100 (its whitepaper's 2.3x V100's L2 read
// bandwidth) and proportionally per SM and clock for the others, to be
// replaced by gpu_check's measurements.
var GPUs = map[string]GPU{
	"h200": {Name: "H200 SXM", Arch: "sm_90", SMs: 132, ClockGHz: 1.98, FP32: 66.9, TF32: 494.7, BF16: 989.4,
		DRAMGBs: 4800, L2GBs: 12000, L2Bytes: 50 << 20, SharedPerSM: 228 << 10, SharedPerBlock: 227 << 10,
		RegistersPerSM: 65536, ThreadsPerSM: 2048, BlocksPerSM: 32},
	"h100": {Name: "H100 SXM", Arch: "sm_90", SMs: 132, ClockGHz: 1.98, FP32: 66.9, TF32: 494.7, BF16: 989.4,
		DRAMGBs: 3350, L2GBs: 12000, L2Bytes: 50 << 20, SharedPerSM: 228 << 10, SharedPerBlock: 227 << 10,
		RegistersPerSM: 65536, ThreadsPerSM: 2048, BlocksPerSM: 32},
	"a100": {Name: "A100 SXM4 80GB", Arch: "sm_80", SMs: 108, ClockGHz: 1.41, FP32: 19.5, TF32: 156, BF16: 312,
		DRAMGBs: 2039, L2GBs: 7200, L2Bytes: 40 << 20, SharedPerSM: 164 << 10, SharedPerBlock: 163 << 10,
		RegistersPerSM: 65536, ThreadsPerSM: 2048, BlocksPerSM: 32},
	"l4": {Name: "L4", Arch: "sm_89", SMs: 58, ClockGHz: 2.04, FP32: 30.3, TF32: 60, BF16: 121,
		DRAMGBs: 300, L2GBs: 4000, L2Bytes: 48 << 20, SharedPerSM: 100 << 10, SharedPerBlock: 99 << 10,
		RegistersPerSM: 65536, ThreadsPerSM: 1536, BlocksPerSM: 24},
	"rtx4090": {Name: "GeForce RTX 4090", Arch: "sm_89", SMs: 128, ClockGHz: 2.52, FP32: 82.6, TF32: 82.6, BF16: 165.2,
		DRAMGBs: 1008, L2GBs: 11000, L2Bytes: 72 << 20, SharedPerSM: 100 << 10, SharedPerBlock: 99 << 10,
		RegistersPerSM: 65536, ThreadsPerSM: 1536, BlocksPerSM: 24},
}

// GPUNames lists the table's keys, sorted.
func GPUNames() []string {
	var names []string
	for k := range GPUs {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// LookupGPU finds a GPU by key (case-insensitive).
func LookupGPU(name string) (GPU, error) {
	g, ok := GPUs[strings.ToLower(name)]
	if !ok {
		return GPU{}, fmt.Errorf("unknown GPU %q (known: %s)", name, strings.Join(GPUNames(), ", "))
	}
	return g, nil
}
