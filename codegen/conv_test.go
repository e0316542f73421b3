package codegen_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// convCase is one conv block configuration.
// convCase is a conv block configuration (kernelcases.Conv, shared with
// codegen/cpu's kernel tests, as its node builders are).
type convCase = kernelcases.Conv

// kernelCheck is one node to run with its reference options.
type kernelCheck struct {
	name string
	n    *ir.Node
	o    reference.NodeOptions
}

// runKernelChecks generates every node into one program (one compile),
// runs each on the emulator with random inputs and compares with the
// reference; it returns the worst error.
func runKernelChecks(t *testing.T, batch int64, checks []kernelCheck) float64 {
	t.Helper()
	return runKernelChecksAt(t, codegen.FP32, batch, checks)
}

// runKernelChecksAt is runKernelChecks at a precision: on tensor cores the
// inputs are first rounded to it (kernelcheck.RoundInputs says why
// kernelcheck.Tolerance then still applies).
func runKernelChecksAt(t *testing.T, prec codegen.Precision, batch int64, checks []kernelCheck) float64 {
	t.Helper()
	return runKernelChecksSMs(t, prec, batch, testSMs(prec), checks, nil)
}

// runKernelChecksSMs is runKernelChecksAt for a GPU of sms SMs; check, when
// not nil, sees the program first (the geometry a test means to exercise).
func runKernelChecksSMs(t *testing.T, prec codegen.Precision, batch, sms int64, checks []kernelCheck, check func(*codegen.Program)) float64 {
	t.Helper()
	var nodes []*ir.Node
	seen := map[*ir.Node]bool{}
	for _, c := range checks {
		if !seen[c.n] {
			seen[c.n] = true
			nodes = append(nodes, c.n)
		}
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec, SMs: sms})
	require.NoError(t, err)
	if check != nil {
		check(prog)
	}
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	worst := 0.0
	for i, c := range checks {
		rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(batch)))
		ins := kernelcheck.RoundInputs(c.n, kernelcheck.RandomInputs(c.n, batch, rng), prec)
		kernelcases.ValidArgmax(c.n, ins, rng)
		r, err := kernelcheck.Node(dev, prog, c.n, ins, kernelcheck.Scalars{LR: 0.05, Step: c.o.Step, Seed: c.o.Seed}, c.o)
		require.NoError(t, err, c.name)
		require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s: %s", c.name, r)
		// Argmax ties: fp32 and float64 can only disagree when two window values
		// are within rounding of each other, which random data does not produce.
		require.Zero(t, r.ArgmaxMismatches, "%s: %s", c.name, r)
		t.Logf("%s b%d %s: %s", prec, batch, c.name, r)
		worst = max(worst, r.Worst)
	}
	return worst
}

// testSMs is the SM count the kernel tests generate for: the fill
// geometry of a named GPU (an H100's 132 SMs: balanced weight-gradient
// splits, narrowed tensor-core GEMM tiles, k slices down to 2 tiles) at the
// tensor-core precisions, the geometry of no GPU named at FP32, so that
// both are checked against the reference.
func testSMs(prec codegen.Precision) int64 {
	if prec == codegen.FP32 {
		return 0
	}
	return 132
}

// win is a pooling window (kernelcases.Window, shared with codegen/cpu).
var win = kernelcases.Window

var (
	k1  = [2]int64{1, 1}
	k2  = [2]int64{2, 2}
	k3  = [2]int64{3, 3}
	k5  = [2]int64{5, 5}
	p0  = [2]int64{0, 0}
	p1  = [2]int64{1, 1}
	s1  = [2]int64{1, 1}
	s2  = [2]int64{2, 2}
	sgd = func(mom float64, nesterov bool, wd float64) *ir.Optimizer {
		return &ir.Optimizer{Kind: ir.SGD, LR: 0.05, Momentum: mom, Nesterov: nesterov, WeightDecay: wd}
	}
	adam = func(kind ir.OptimizerKind, wd float64) *ir.Optimizer {
		return &ir.Optimizer{Kind: kind, LR: 0.05, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: wd}
	}
)

// forwardCases cover the tile configurations (8, 16, 32 and 64 output
// channel tiles), u8 images, odd sizes and channel counts, kernels 1, 2x3,
// 3, 5 and 7 (split into kernel-row chunks), strides, padding, and pools
// that overlap, are padded, rectangular, or leave conv rows unread.
var (
	// pooled rows wider than a tile: runs of argmax words shared between blocks
	wideRowsCase = convCase{C: 2, H: 9, W: 41, Out: 3, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: win(k2, s2, p0)}
	// a stride-2 5x5 conv without ReLU or pool
	stridedCase = convCase{C: 5, H: 13, W: 11, Out: 8, K: k5, S: s2, P: [2]int64{2, 2}, Bias: true}
	// 40 channels (a 64-row tile), stride 2, overlapping padded pool
	overlapCase = convCase{C: 5, H: 13, W: 11, Out: 40, K: k3, S: s2, P: p1, Bias: true, ReLU: true, Pool: win(k3, s2, p1)}
)

var forwardCases = []convCase{
	{C: 3, H: 13, W: 11, U8: true, Out: 5, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
	{C: 1, H: 28, W: 28, U8: true, Out: 8, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
	{C: 17, H: 7, W: 5, Out: 17, K: k3, S: s1, P: p1, ReLU: true, Pool: win(k3, s2, p1)},
	stridedCase,
	{C: 3, H: 9, W: 7, Out: 33, K: k1, S: s1, P: p0, Bias: true, ReLU: true},
	{C: 4, H: 11, W: 13, Out: 6, K: [2]int64{2, 3}, S: [2]int64{2, 1}, P: [2]int64{1, 0}, Bias: true, ReLU: true, Pool: win([2]int64{3, 2}, [2]int64{1, 2}, [2]int64{1, 0})},
	{C: 8, H: 14, W: 14, Out: 16, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
	{C: 2, H: 12, W: 10, Out: 3, K: [2]int64{7, 7}, S: s1, P: [2]int64{3, 3}, Bias: true, Pool: win(k2, s2, p0)},
	{C: 70, H: 5, W: 6, Out: 70, K: k3, S: s1, P: p1, ReLU: true},
	overlapCase,
	{C: 3, H: 7, W: 5, U8: true, Out: 4, K: k2, S: s1, P: p0, ReLU: true, Pool: win([2]int64{2, 1}, [2]int64{2, 1}, p0)},
	// a strided 1x1 (ResNet shortcut) and a stride larger than the kernel:
	// input pixels that reach no output, phases without taps
	{C: 6, H: 9, W: 10, Out: 5, K: k1, S: s2, P: p0, Bias: true},
	{C: 4, H: 11, W: 8, Out: 9, K: k2, S: [2]int64{3, 2}, P: p0, ReLU: true},
	wideRowsCase,
	{C: 1, H: 5, W: 45, Out: 2, K: k3, S: s1, P: p1, Pool: win(k3, s2, p1)},
}

func TestConvBlockForward(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			checks = append(checks, kernelCheck{name: c.String(), n: kernelcases.ConvForward(t, c)})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// The pooled forward cases as inference graphs have them (no argmax), at
// batches 1 and 3 (cnnc build --infer), and pooled blocks with each
// activation folded in (kernelcases.ConvInferChecks: no z saved).
func TestConvBlockForwardWithoutArgmax(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			if c.Pool != nil {
				c.NoArgmax = true
				checks = append(checks, kernelCheck{name: c.String(), n: kernelcases.ConvForward(t, c)})
			}
		}
		for _, c := range kernelcases.ConvInferChecks(t) {
			if c.N.Attrs.Act != 0 {
				checks = append(checks, kernelCheck{name: c.Name, n: c.N})
			}
		}
		require.NotEmpty(t, checks)
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// The forward cases on tensor cores, at batch 3.
func TestConvBlockForwardTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			checks = append(checks, kernelCheck{name: c.String(), n: kernelcases.ConvForward(t, c)})
		}
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

// regionCases are forward blocks without a pool that tile output regions
// and stage their input halo on tensor cores: odd maps, padding, stride 2,
// 1x1 kernels (plain and strided), channel counts that leave a partial
// chunk (C past a multiple of CB) and a partial row tile (O past 16 or
// 32), maps small enough that a block covers several samples (4x4 and 3x5:
// 4 samples, so that batch 5 leaves a block with one) and maps split into
// several regions (11x13, 20x19 strided).
var regionCases = []convCase{
	{C: 5, H: 9, W: 7, Out: 20, K: k3, S: s1, P: p1, Bias: true, ReLU: true},
	{C: 7, H: 11, W: 13, Out: 40, K: k3, S: s2, P: p1, Bias: true},
	{C: 33, H: 4, W: 4, Out: 16, K: k1, S: s1, P: p0, ReLU: true},
	{C: 6, H: 8, W: 8, Out: 24, K: k3, S: s1, P: p1, Bias: true, ReLU: true},
	{C: 3, H: 3, W: 5, Out: 17, K: k3, S: s1, P: p1},
	{C: 10, H: 20, W: 19, Out: 8, K: k1, S: s2, P: p0, Bias: true},
	{C: 9, H: 17, W: 15, Out: 12, K: k3, S: s1, P: p1, ReLU: true},
}

// The region-tiled tensor-core forward (regionCases) against the float64
// reference, its outputs poisoned with NaN (kernelcheck), at batches 1 and
// 5 (not a multiple of the samples a block covers), and staging the halo.
func TestConvForwardRegionsTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		for _, batch := range []int64{1, 5} {
			var checks []kernelCheck
			var nodes []*ir.Node
			for _, c := range regionCases {
				n := kernelcases.ConvForward(t, c)
				nodes = append(nodes, n)
				checks = append(checks, kernelCheck{name: c.String(), n: n})
			}
			prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec, SMs: testSMs(prec)})
			require.NoError(t, err)
			for _, k := range prog.Kernels {
				require.Contains(t, k.Text, "__pipeline_memcpy_async", "%s b%d: %s stages its halo", prec, batch, k.Name)
			}
			t.Logf("%s: worst relative error at batch %d: %.2e", prec, batch, runKernelChecksAt(t, prec, batch, checks))
		}
	}
}

func TestConvBlockGradInput(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			// as after a non-ReLU reader (y masks dOut), and after a maskout reader
			// (dOut arrives masked) with this block's own input masked too
			plain, masked := c.F32(), c.F32()
			masked.Masked, masked.MaskOut = c.ReLU, true
			for _, v := range []convCase{plain, masked} {
				checks = append(checks, kernelCheck{name: v.String(), n: kernelcases.ConvGradInput(t, v)})
			}
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// optimizers cycles through every fused update variant.
var optimizers = []*ir.Optimizer{
	sgd(0.9, true, 0.01), sgd(0, false, 0), adam(ir.Adam, 0.01), adam(ir.AdamW, 0.01), sgd(0.9, false, 0), adam(ir.Adam, 0),
}

func TestConvBlockGradWeight(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for i, c := range forwardCases {
			// the gradients out, then the update fused (at the first step, when
			// SGD's momentum buffer starts as the gradient, and a later one)
			plain := c
			plain.Masked = c.ReLU && i%2 == 1
			checks = append(checks, kernelCheck{name: plain.String(), n: kernelcases.ConvGradWeight(t, plain)})
			fused := c
			fused.Opt = optimizers[i%len(optimizers)]
			n := kernelcases.ConvGradWeight(t, fused)
			for _, step := range []int64{0, 3} {
				checks = append(checks, kernelCheck{name: fmt.Sprintf("%s step %d", fused, step), n: n, o: reference.NodeOptions{Update: true, Step: step}})
			}
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// realisticCases are layer shapes of real networks (too big for the
// emulator), for the ptxas check: a VGG block, a ResNet downsampling conv,
// a bottleneck 1x1 conv, an ImageNet stem with an overlapping pool.
var realisticCases = []convCase{
	{C: 64, H: 56, W: 56, Out: 128, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
	{C: 64, H: 56, W: 56, Out: 128, K: k3, S: s2, P: p1, ReLU: true},
	{C: 256, H: 14, W: 14, Out: 64, K: k1, S: s1, P: p0, Bias: true, ReLU: true},
	{C: 3, H: 224, W: 224, U8: true, Out: 64, K: [2]int64{7, 7}, S: s2, P: [2]int64{3, 3}, ReLU: true, Pool: win(k3, s2, p1)},
	// 2^31 input elements at batch 32: the 64-bit index variant
	{C: 256, H: 512, W: 512, Out: 32, K: k3, S: s1, P: p1, ReLU: true, Pool: win(k2, s2, p0)},
}

// The 64-bit index variants (for tensors of 2^31 elements or more) on
// shapes the emulator can run: pooled and unpooled, u8, strided, every
// backward kernel and the pools.
func TestConvPoolLongIndex(t *testing.T) {
	defer codegen.SetForceLongIndex(true)()
	var checks []kernelCheck
	for _, c := range []convCase{forwardCases[0], stridedCase, overlapCase, wideRowsCase} {
		d := c.F32()
		d.Masked, d.MaskOut = c.ReLU, true
		w := c
		w.Opt = sgd(0.9, false, 0.01)
		checks = append(checks, kernelCheck{name: c.String(), n: kernelcases.ConvForward(t, c)},
			kernelCheck{name: d.String(), n: kernelcases.ConvGradInput(t, d)},
			kernelCheck{name: w.String(), n: kernelcases.ConvGradWeight(t, w), o: reference.NodeOptions{Update: true, Step: 2}})
	}
	for _, c := range poolCases[1:3] {
		a := ir.Attrs{Kernel: c.k, Stride: c.s, Pad: c.p}
		x := ir.F32Batched(c.c, c.h, c.w)
		fwd := node(t, ir.OpMaxPool2D, a, x)
		ga := a
		ga.Dims = x.Dims
		checks = append(checks, kernelCheck{name: "maxpool2d", n: fwd}, kernelCheck{name: "avgpool2d", n: node(t, ir.OpAvgPool2D, a, x)},
			kernelCheck{name: "maxpool2d_grad", n: node(t, ir.OpMaxPool2DGrad, a, fwd.Out().Type, x)},
			kernelCheck{name: "avgpool2d_grad", n: node(t, ir.OpAvgPool2DGrad, ga, fwd.Out().Type)})
	}
	t.Logf("worst relative error: %.2e", runKernelChecks(t, 3, checks))
}

// Named, an A100 (sm_80) gets the forward that gathers from global memory
// (the model predicts the staging slower there), an H100/H200 (sm_90) the
// staging one.
func TestConvForwardHaloByArch(t *testing.T) {
	n := kernelcases.ConvForward(t, convCase{C: 16, H: 63, W: 63, Out: 32, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)})
	for arch, want := range map[string]bool{"sm_80": false, "sm_90": true, "": true} {
		prog, err := codegen.GenerateNodes("T", []*ir.Node{n}, codegen.Options{Batch: 32, Precision: codegen.TF32, SMs: 132, Arch: arch})
		require.NoError(t, err)
		require.Len(t, prog.Kernels, 1)
		require.Equal(t, want, strings.Contains(prog.Kernels[0].Text, "__pipeline_memcpy_async"), "arch %q", arch)
	}
}

// The 64-bit index variants of the tensor-core forward kernels, whose
// pooled cases stage their input halo (TestConvForwardTensorCoresPtxas).
func TestConvForwardLongIndexTensorCores(t *testing.T) {
	defer codegen.SetForceLongIndex(true)()
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range []convCase{forwardCases[0], stridedCase, overlapCase, wideRowsCase} {
			checks = append(checks, kernelCheck{name: c.String(), n: kernelcases.ConvForward(t, c)})
		}
		t.Logf("%s: worst relative error: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

// Every conv and pool kernel variant compiles for sm_80 and sm_90 with no
// register spill and no local-memory stack frame.
func TestConvPoolKernelsPtxas(t *testing.T) {
	nvcc.Require(t)
	var nodes []*ir.Node
	// one variant per case and family, alternating masks and the update, to
	// keep nvcc's time down; every optimizer, mask and tile occurs
	for i, c := range append(append([]convCase{}, forwardCases...), realisticCases...) {
		d := c.F32()
		d.Masked, d.MaskOut = c.ReLU && i%2 == 0, i%2 == 1
		wg := c
		wg.Masked = c.ReLU && i%4 == 1
		if i%4 != 3 {
			wg.Opt = optimizers[i%len(optimizers)]
		}
		nodes = append(nodes, kernelcases.ConvForward(t, c), kernelcases.ConvGradInput(t, d), kernelcases.ConvGradWeight(t, wg))
	}
	for _, c := range poolCases[:3] {
		a := ir.Attrs{Kernel: c.k, Stride: c.s, Pad: c.p}
		x := ir.F32Batched(c.c, c.h, c.w)
		fwd := node(t, ir.OpMaxPool2D, a, x)
		ga := a
		ga.Dims = x.Dims
		nodes = append(nodes, fwd, node(t, ir.OpAvgPool2D, a, x), node(t, ir.OpMaxPool2DGrad, a, fwd.Out().Type, x),
			node(t, ir.OpAvgPool2DGrad, ga, fwd.Out().Type))
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "conv.cu", nvcc.Targets)
	require.NoError(t, err)
	reported := map[string]int{}
	most := map[string]codegen.PtxasKernel{}
	for _, k := range ks {
		reported[k.Name]++
		require.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
		if k.Registers > most[k.Arch].Registers {
			most[k.Arch] = k
		}
		t.Log(k)
	}
	for _, name := range prog.KernelNames() {
		require.Equal(t, len(nvcc.Targets), reported[name], "ptxas reports on %s for every target", name)
	}
	for arch, k := range most {
		t.Logf("most registers on %s: %d (%s)", arch, k.Registers, k.Name)
	}
}

// At TF32 and BF16 the forward kernels of f32 inputs whose kernel fits one
// chunk (pooled, or tiling output regions) stage their input halo by cp.async (the emulator cases of
// TestConvBlockForwardTensorCores run that variant), the others gather
// their columns from global memory; every forward kernel of the forward
// and the realistic cases compiles for sm_80 and sm_90 without spills.
func TestConvForwardTensorCoresPtxas(t *testing.T) {
	nvcc.Require(t)
	cases := append(append(append([]convCase{}, forwardCases...), realisticCases...), regionCases...)
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var nodes []*ir.Node
		halo := map[string]bool{}
		for _, c := range cases {
			n := kernelcases.ConvForward(t, c)
			nodes = append(nodes, n)
			// pooled or not (output regions without a pool)
			halo[n.Text()] = !c.U8 && c.K[0]*c.K[1] <= 32
		}
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		kernels := map[string]*codegen.Kernel{}
		for _, k := range prog.Kernels {
			kernels[k.Name] = k
		}
		staged := 0
		for _, l := range prog.Launches {
			k := kernels[l.Kernel]
			require.NotNil(t, k, l.Kernel)
			require.Equal(t, halo[l.Node.Text()], strings.Contains(k.Text, "__pipeline_memcpy_async"), "%s: %s", prec, k.Name)
			if halo[l.Node.Text()] {
				staged++
			}
		}
		require.GreaterOrEqual(t, staged, 6, "%s: the cases stage halos", prec)
		ks, err := codegen.CompilePtxas(prog.Source, "conv_tc.cu", nvcc.Targets)
		require.NoError(t, err)
		for _, k := range ks {
			require.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
			t.Log(k)
		}
	}
}

// At TF32 and BF16 every input-gradient kernel of the forward and the
// realistic cases (plain and with both masks) compiles for sm_80 and sm_90
// without spills, and multiplies on tensor cores.
func TestConvGradInputTensorCoresPtxas(t *testing.T) {
	nvcc.Require(t)
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var nodes []*ir.Node
		for _, c := range append(append([]convCase{}, forwardCases...), realisticCases...) {
			plain, masked := c.F32(), c.F32()
			masked.Masked, masked.MaskOut = c.ReLU, true
			nodes = append(nodes, kernelcases.ConvGradInput(t, plain), kernelcases.ConvGradInput(t, masked))
		}
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		for _, k := range prog.Kernels {
			require.Contains(t, k.Text, "wmma::mma_sync", "%s: %s", prec, k.Name)
		}
		ks, err := codegen.CompilePtxas(prog.Source, "conv_dgrad_tc.cu", nvcc.Targets)
		require.NoError(t, err)
		require.Len(t, ks, len(prog.Kernels)*len(nvcc.Targets), "%s: ptxas reports on every kernel for every target", prec)
		for _, k := range ks {
			require.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
			t.Log(k)
		}
	}
}

// The 2-warp tensor-core input-gradient kernels (16-row tiles whose grid
// fills the GPU: SimpleCNN's convs at batch 256 on 132 SMs) compile for
// sm_80 and sm_90 without spills.
func TestConvGradInputTwoWarpsPtxas(t *testing.T) {
	nvcc.Require(t)
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var nodes []*ir.Node
		for _, c := range []convCase{
			{C: 16, H: 63, W: 63, Out: 32, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
			{C: 3, H: 128, W: 128, U8: true, Out: 16, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
		} {
			masked := c.F32()
			masked.Masked, masked.MaskOut = c.ReLU, true
			nodes = append(nodes, kernelcases.ConvGradInput(t, c.F32()), kernelcases.ConvGradInput(t, masked))
		}
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 256, Precision: prec, SMs: 132})
		require.NoError(t, err)
		for _, k := range prog.Kernels {
			require.Contains(t, k.Text, "__launch_bounds__(64,", "%s: %s takes 2 warps", prec, k.Name)
		}
		ks, err := codegen.CompilePtxas(prog.Source, "conv_dgrad_tc2.cu", nvcc.Targets)
		require.NoError(t, err)
		require.Len(t, ks, len(prog.Kernels)*len(nvcc.Targets), "%s: ptxas reports on every kernel for every target", prec)
		for _, k := range ks {
			require.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
			t.Log(k)
		}
	}
}

// tcBackwardCases are the forward cases whose pool windows do not overlap:
// there every conv output's gradient is one output gradient (or zero),
// representable when the inputs are rounded. Where windows overlap it is a
// sum of several, which the tensor-core kernels round once more when they
// stage it — an error of up to one TF32 (BF16) rounding of dy that
// rounded inputs cannot absorb, so those cases are checked in fp32 only.
func tcBackwardCases() []convCase {
	var out []convCase
	for _, c := range forwardCases {
		if p := c.Pool; p != nil && (p.Stride[0] < p.Kernel[0] || p.Stride[1] < p.Kernel[1]) {
			continue
		}
		out = append(out, c)
	}
	return out
}

func TestConvBlockGradInputTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range tcBackwardCases() {
			plain, masked := c.F32(), c.F32()
			masked.Masked, masked.MaskOut = c.ReLU, true
			for _, v := range []convCase{plain, masked} {
				checks = append(checks, kernelCheck{name: v.String(), n: kernelcases.ConvGradInput(t, v)})
			}
		}
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

// The tensor-core input-gradient kernels of 16-row tiles as 2 warps of 4
// fragments, the layout a grid that fills the GPU takes (one SM named here,
// so that batch 3 fills it): SimpleCNN's conv2 and conv1 shapes, smaller,
// a strided one (4 phases) and a wide one.
func TestConvBlockGradInputTensorCoresTwoWarps(t *testing.T) {
	cases := []convCase{
		{C: 16, H: 37, W: 35, Out: 32, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
		{C: 3, H: 34, W: 30, U8: true, Out: 16, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
		{C: 5, H: 40, W: 36, Out: 8, K: k5, S: s2, P: [2]int64{2, 2}, Bias: true},
		{C: 2, H: 20, W: 41, Out: 3, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
	}
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range cases {
			plain, masked := c.F32(), c.F32()
			masked.Masked, masked.MaskOut = c.ReLU, true
			for _, v := range []convCase{plain, masked} {
				checks = append(checks, kernelCheck{name: v.String(), n: kernelcases.ConvGradInput(t, v)})
			}
		}
		worst := runKernelChecksSMs(t, prec, 3, 1, checks, func(prog *codegen.Program) {
			for _, k := range prog.Kernels {
				require.Contains(t, k.Text, "__launch_bounds__(64,", "%s: %s takes 2 warps", prec, k.Name)
			}
		})
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, worst)
	}
}

func TestConvBlockGradWeightTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for i, c := range tcBackwardCases() {
			plain := c
			plain.Masked = c.ReLU && i%2 == 1
			checks = append(checks, kernelCheck{name: plain.String(), n: kernelcases.ConvGradWeight(t, plain)})
			fused := c
			fused.Opt = optimizers[i%len(optimizers)]
			checks = append(checks, kernelCheck{name: fused.String() + " step 3", n: kernelcases.ConvGradWeight(t, fused), o: reference.NodeOptions{Update: true, Step: 3}})
		}
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

// The 64-bit index variants of the tensor-core weight-gradient kernels:
// pooled and unpooled, u8, strided, the fused update.
func TestConvWeightGradLongIndexTensorCores(t *testing.T) {
	defer codegen.SetForceLongIndex(true)()
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range []convCase{forwardCases[0], stridedCase, wideRowsCase} {
			w := c
			w.Opt = sgd(0.9, false, 0.01)
			checks = append(checks, kernelCheck{name: c.String(), n: kernelcases.ConvGradWeight(t, c)},
				kernelCheck{name: w.String(), n: kernelcases.ConvGradWeight(t, w), o: reference.NodeOptions{Update: true, Step: 2}})
		}
		t.Logf("%s: worst relative error: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

// Every tensor-core weight-gradient kernel of the forward and the
// realistic cases (tiles of 16 and 32 rows, 16 to 48 columns, one to four
// warps' worth of shared memory, the 64-bit index variant) compiles for
// sm_80 and sm_90 without spills.
func TestConvWeightGradTensorCoresPtxas(t *testing.T) {
	nvcc.Require(t)
	cases := append(append([]convCase{}, forwardCases...), realisticCases...)
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var nodes []*ir.Node
		for i, c := range cases {
			wg := c
			wg.Masked = c.ReLU && i%2 == 1
			if i%3 != 2 {
				wg.Opt = optimizers[i%len(optimizers)]
			}
			nodes = append(nodes, kernelcases.ConvGradWeight(t, wg))
		}
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		ks, err := codegen.CompilePtxas(prog.Source, "conv_wgrad_tc.cu", nvcc.Targets)
		require.NoError(t, err)
		wgrads := 0
		for _, k := range ks {
			assert.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
			if strings.HasPrefix(k.Name, "conv_block_wgrad_x") {
				wgrads++
			}
			t.Log(k)
		}
		require.Equal(t, len(cases)*len(nvcc.Targets), wgrads, "%s: ptxas reports on every weight-gradient kernel", prec)
	}
}

// Every activation other than ReLU folded into an unpooled conv block
// (Attrs.Act; kernelcases.ConvActChecks): the forward's f (and z where the
// block saves it), the gradients' dz = dy·f'(s) through the saved y or z,
// on the emulator against the float64 reference with NaN-poisoned outputs,
// at batches 1 and 3. Tolerance: kernelcheck.Tolerance — the activation
// adds a few ulps (expf/erff/tanhf) per element to sums over at most
// C·KH·KW = 45 (forward), O·KH·KW = 360 (input gradient) or 3·HO·WO = 297
// (weight gradient) products.
func TestConvBlockActivationKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range kernelcases.ConvActChecks(t) {
			checks = append(checks, kernelCheck{name: c.Name, n: c.N, o: c.O})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// The same on tensor cores (TF32, BF16) at batch 3, gradients out. The
// forward's f runs on the fp32 accumulator, so Tolerance applies
// (RoundInputs). The gradients stage dz = dy·f'(s), computed in fp32 from
// the rounded inputs, rounded once more to the precision (as the unfused
// activation gradient's output would be): at most u·|dz| per staged value
// (pooled: a sum of at most P = ⌈PKH/PSH⌉·⌈PKW/PSW⌉ of them, the windows
// that can take their maximum at one conv output), u = 2^-11 (TF32) or
// 2^-8 (BF16), hence at most u·K·P·max|dz|·max|B| in an output summing K
// products (B the other operand: w for the input gradient, K = O·KH·KW; x
// for the weight gradient, K = B·HO·WO over the conv output), on top of
// Tolerance, relative to the largest reference magnitude (as
// TestLinearBlockActivationKernelsTensorCores).
func TestConvBlockActivationKernelsTensorCores(t *testing.T) {
	var nodes []*ir.Node
	for _, c := range kernelcases.ConvActChecks(t) {
		if !c.O.Update {
			nodes = append(nodes, c.N)
		}
	}
	const batch = 3
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		u := map[codegen.Precision]float64{codegen.TF32: 0x1p-11, codegen.BF16: 0x1p-8}[prec]
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(31, batch))
		for _, n := range nodes {
			ins := kernelcheck.RoundInputs(n, kernelcheck.RandomInputs(n, batch, rng), prec)
			kernelcases.ValidArgmax(n, ins, rng)
			r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{LR: 0.05}, reference.NodeOptions{})
			require.NoError(t, err, n.Text())
			require.NotEmpty(t, r.Kernel, "no launch for %s", n.Text())
			tol := kernelcheck.Tolerance
			if n.Op != ir.OpConvBlock {
				tol += u * convStagedBound(t, n, ins, batch)
			}
			require.LessOrEqual(t, r.Worst, tol, "%s\n%s", n.Text(), r)
			t.Logf("%s %s (allowed %.2e)", prec, r, tol)
		}
		dev.Close()
	}
}

// convStagedBound is K·max|dz|·max|B| / max|reference output| for a conv
// block gradient n on inputs ins (TestConvBlockActivationKernelsTensorCores).
func convStagedBound(t *testing.T, n *ir.Node, ins [][]float64, batch int64) float64 {
	t.Helper()
	p, at, dz := blockGradDz(t, n, ins, batch)
	a := n.Attrs
	var b float64
	var k int64
	if n.Op == ir.OpConvBlockGradWeight {
		x := p.X.Type
		h, w := x.Dims[1], x.Dims[2]
		if x.DType == ir.U8 { // [H,W,C], /255 in the loads
			h, w = x.Dims[0], x.Dims[1]
		}
		ho, _ := ir.ConvOut(h, a.Kernel[0], a.Stride[0], a.Pad[0])
		wo, _ := ir.ConvOut(w, a.Kernel[1], a.Stride[1], a.Pad[1])
		b, k = maxAbs(at(p.X)), batch*ho*wo
		if x.DType == ir.U8 {
			b /= 255
		}
	} else {
		b, k = maxAbs(at(p.W)), a.Out*a.Kernel[0]*a.Kernel[1]
	}
	if pw := a.Pool; pw != nil {
		k *= (pw.Kernel[0] + pw.Stride[0] - 1) / pw.Stride[0] * ((pw.Kernel[1] + pw.Stride[1] - 1) / pw.Stride[1])
	}
	return stagedRatio(t, n, ins, batch, float64(k)*maxAbs(dz)*b)
}

// The conv blocks with each activation folded in (kernelcases.ConvActChecks:
// forward with and without z, input gradients with and without maskout,
// weight gradients out and fused) compile with nvcc for every target
// (sm_80, sm_90) without spills or local memory, at the examples' batch 32,
// in fp32 and on tensor cores.
func TestPtxasConvAct(t *testing.T) {
	nvcc.Require(t)
	var nodes []*ir.Node
	for _, c := range kernelcases.ConvActChecks(t) {
		nodes = append(nodes, c.N)
	}
	for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32, codegen.BF16} {
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		ks, err := codegen.CompilePtxas(prog.Source, "convact.cu", nvcc.Targets)
		require.NoError(t, err)
		requireClean(t, prog, ks)
	}
}
