package cpu_test

import (
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/native"
)

// Every CPU kernel family against the float64 reference (kernelcheck.Node: outputs poisoned
// with NaN before the launch, so an element left unwritten fails), on odd shapes, with every
// instruction set this machine runs: the baseline (SSE2) always, AVX2+FMA where the CPU has it.
// One program per batch size holds every case, so each compiles once.
//
// Tolerance: kernelcheck.Tolerance (1e-4 of the tensor's largest magnitude). The reductions here
// run over at most K = 70·3·3 = 630 (convs), 1000 (linear) or a batch of conv outputs (3·28·28 =
// 2352 terms) of products of values in [-1, 1): fp32 rounding leaves a relative error of at most
// about K·2^-24 ≈ 1.4e-4 of the sum of magnitudes in the worst case, and a random-walk 4·sqrt(K)·
// 2^-24 ≈ 1.2e-5 in practice — against a largest magnitude that is itself of the order of that
// sum's square root for random signs, so the worst case stays below 1e-4 of it by a factor of
// about 3 here; the measured worst is logged.

// isas are the instruction sets to test on this machine.
func isas(t *testing.T) []string {
	out := []string{"sse2"}
	if native.HasAVX2FMA() {
		out = append(out, "avx2")
	} else {
		t.Log("this CPU lacks AVX2+FMA: only the baseline kernels are tested")
	}
	return out
}

// checkCases generates every case's node into one program, runs each on the CPU target (every
// instruction set) with random inputs, compares with the reference and returns the worst error.
func checkCases(t *testing.T, batch int64, seed uint64, cases []kernelcases.Case) float64 {
	t.Helper()
	if only := os.Getenv("CNNC_TEST_CASE"); only != "" { // while debugging: the cases whose name has it
		var some []kernelcases.Case
		for _, c := range cases {
			if strings.Contains(c.Name, only) {
				some = append(some, c)
			}
		}
		cases = some
	}
	var nodes []*ir.Node
	seen := map[*ir.Node]bool{}
	for _, c := range cases {
		if !seen[c.N] {
			seen[c.N] = true
			nodes = append(nodes, c.N)
		}
	}
	prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
	require.NoError(t, err)
	worst := 0.0
	for _, isa := range isas(t) {
		dev := openDevice(t, prog, native.Options{ISA: isa})
		for i, c := range cases {
			rng := rand.New(rand.NewPCG(seed+uint64(i), uint64(batch)))
			ins := kernelcheck.RandomInputs(c.N, batch, rng)
			kernelcases.ValidArgmax(c.N, ins, rng)
			r, err := kernelcheck.Node(dev, prog, c.N, ins, kernelcheck.Scalars{LR: kernelcases.LR, Step: c.O.Step, Seed: c.O.Seed}, c.O)
			require.NoError(t, err, "%s %s", isa, c.Name)
			require.NotEmpty(t, r.Kernel, "no launch for %s", c.Name)
			require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s %s: %s", isa, c.Name, r)
			// fp32 and float64 can only pick different maxima when two window values are within
			// rounding of each other, which random data does not produce
			require.Zero(t, r.ArgmaxMismatches, "%s %s: %s", isa, c.Name, r)
			worst = max(worst, r.Worst)
		}
	}
	t.Logf("batch %d: %d cases, %d kernels; worst relative error %.2e", batch, len(cases), len(prog.Kernels), worst)
	return worst
}

// Every conv case at batch 3; at batch 1 (one sample: fewer tasks than units, a weight gradient
// of one partial sum) a third of them, which keeps the compile within reason.
func TestConvKernels(t *testing.T) {
	all := kernelcases.ConvChecks(t)
	checkCases(t, 3, 1, all)
	var some []kernelcases.Case
	for i, c := range all {
		if i/6%3 == 0 { // ConvChecks gives 6 checks per case
			some = append(some, c)
		}
	}
	checkCases(t, 1, 1, some)
}

// Conv blocks with each activation other than ReLU folded in (kernelcases.ConvActChecks): the
// forward applies f lane by lane before its store (and writes z where saved), the gradients f'
// as they form dy (form_dy), at batches 1 and 3 (with NaN-poisoned outputs, as every check).
// Tolerance: checkCases' — each sum runs over at most 360 products, f adds a few ulps per element.
func TestConvActKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		checkCases(t, batch, 17, kernelcases.ConvActChecks(t))
	}
}

// The pooled conv blocks of inference graphs (no argmax) at batches 1 and 3: the same pooled
// outputs as the training forward's, against the reference (cnnc build --infer).
func TestConvInferenceKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		checkCases(t, batch, 1, kernelcases.ConvInferChecks(t))
	}
}

// Batches 1 (every register tile's tail) and 67 (two sample tiles of the forward, a tail of each
// register tile).
func TestLinearKernels(t *testing.T) {
	for bi, batch := range []int64{1, 67} {
		checkCases(t, batch, 11, kernelcases.LinearChecks(t, bi, rand.New(rand.NewPCG(uint64(bi), 7))))
	}
}

// Linear blocks with each activation other than ReLU folded in (kernelcases.LinearActChecks): the
// forward applies f in its scalar pass over the outputs, the gradients f' as they load dy. Batch 67:
// two sample tiles of the forward, a tail of each register tile.
func TestLinearActKernels(t *testing.T) {
	checkCases(t, 67, 13, kernelcases.LinearActChecks(t))
}

// Global average pooling sums up to 9100 values in [-1, 1) in order: each addition rounds
// relative to a partial sum of size about sqrt(k/3), so the sum's error is about
// 2^-24·K/sqrt(18) ≈ 1.3e-4 (K = 9100), the mean's 1.4e-8, against a largest mean of about
// 3·sqrt(1/(3K)) ≈ 0.018 over the channels: ≈ 1e-6 of it, 100 times below the tolerance
// (measured: up to 2.5e-6, the worst of these cases).
func TestSmallKernels(t *testing.T) {
	for bi, batch := range []int64{1, 37} {
		cases := append(kernelcases.PoolChecks(t), kernelcases.ElementwiseChecks(t)...)
		checkCases(t, batch, 21, append(cases, kernelcases.LossUpdateDropoutChecks(t, bi)...))
	}
}

// Every kernel of every DSL op's examples (kernelcases.Examples: the ops' harness model, odd
// shapes, fused as trainers compile it) that the CPU target generates, on every instruction set,
// at batches 1 and 3, against the float64 reference with NaN-poisoned outputs — as codegen's
// TestEveryOpExampleKernels checks the CUDA kernels. The ops the target refuses are
// TestRegistryOpsHaveCPURulesOrAreRefused's list; their nodes are skipped here.
//
// Tolerance: kernelcheck.Tolerance (1e-4 of the tensor's largest magnitude). These kernels are
// elementwise or reduce over a few hundred terms at most: one to a few fp32 roundings per
// element (expf, erff, tanhf are within a few ulp, 2^-22 relative), far below it.
func TestEveryOpExampleKernels(t *testing.T) {
	var checks []kernelcases.Example
	var nodes []*ir.Node
	skipped := map[string]bool{}
	for _, c := range kernelcases.Examples(t) {
		if !cpu.Supported(c.N.Op) {
			skipped[c.N.Op.String()] = true
			continue
		}
		checks, nodes = append(checks, c), append(nodes, c.N)
	}
	t.Logf("%d nodes; skipped (refused by the CPU target): %v", len(nodes), skipped)
	for _, batch := range []int64{1, 3} {
		prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		for _, isa := range isas(t) {
			dev := openDevice(t, prog, native.Options{ISA: isa})
			for i, c := range checks {
				ins := c.Inputs(batch, rand.New(rand.NewPCG(uint64(i)+1, uint64(batch))))
				o := reference.NodeOptions{Training: true, Update: true, Seed: 7, Step: 3}
				r, err := kernelcheck.Node(dev, prog, c.N, ins, kernelcheck.Scalars{LR: c.LR, Step: o.Step, Seed: o.Seed}, o)
				require.NoError(t, err, "%s b%d %s", isa, batch, c.Name)
				require.NotEmpty(t, r.Kernel, "no launch for %s", c.Name)
				require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s b%d %s: %s", isa, batch, c.Name, r)
				t.Logf("%s b%d %s: %s", isa, batch, c.Name, r)
			}
		}
	}
}

// Batch norm in evaluation (Options.Eval): the statistics node reads the running statistics and
// changes nothing, the normalisation uses them — every batch norm example's forward nodes on
// every instruction set against the reference in evaluation mode (NodeOptions.Training false),
// NaN-poisoned outputs. Tolerance: kernelcheck.Tolerance; one sqrt, one division and a few
// roundings per element.
func TestBatchNormEvalKernels(t *testing.T) {
	var checks []kernelcases.Example
	var nodes []*ir.Node
	for _, c := range kernelcases.Examples(t) {
		if c.N.Op == ops.BatchNormStats || c.N.Op == ops.BatchNorm2D || c.N.Op == ops.BatchNorm1D {
			checks, nodes = append(checks, c), append(nodes, c.N)
		}
	}
	require.NotEmpty(t, checks)
	const batch = 3
	prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Eval: true})
	require.NoError(t, err)
	for _, isa := range isas(t) {
		dev := openDevice(t, prog, native.Options{ISA: isa})
		for i, c := range checks {
			ins := c.Inputs(batch, rand.New(rand.NewPCG(uint64(i)+1, 5)))
			if c.N.Op == ops.BatchNormStats {
				for j := range ins[2] { // running variances are positive
					ins[2][j] = math.Abs(ins[2][j]) + 0.1
				}
			}
			o := reference.NodeOptions{Training: false}
			r, err := kernelcheck.Node(dev, prog, c.N, ins, kernelcheck.Scalars{LR: c.LR}, o)
			require.NoError(t, err, "%s %s", isa, c.Name)
			require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s %s: %s", isa, c.Name, r)
			t.Logf("%s %s: %s", isa, c.Name, r)
		}
	}
}

// A padded last batch through batch norm on the CPU target (kernelcheck.PartialBatch): the
// statistics are the valid samples' (and so the running statistics' update), the gradient sums
// over them and gives the padding zero — codegen's TestBatchNormPartialBatch, on every
// instruction set.
func TestBatchNormPartialBatch(t *testing.T) {
	const batch, valid = 5, 3
	for _, call := range []string{"batchnorm2d(x)", "batchnorm1d(x, affine=false)"} {
		d := ops.ByDSLName(call[:len("batchnorm2d")])
		res, err := compiler.CompileSource("t.cnn", []byte(ops.ExampleModel(d, call)), compiler.Options{})
		require.NoError(t, err)
		var nodes []*ir.Node
		for _, n := range res.Graph.Nodes {
			if n.Op == ops.BatchNormStats || n.Op == ops.BatchNormGrad {
				nodes = append(nodes, n)
			}
		}
		require.Len(t, nodes, 2)
		prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		for _, isa := range isas(t) {
			dev := openDevice(t, prog, native.Options{ISA: isa})
			for _, n := range nodes {
				ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(5, 6)))
				require.NoError(t, kernelcheck.PartialBatch(dev, prog, n, ins, valid), "%s %s", isa, call)
			}
		}
	}
}

// The direct convolutions (grouped, depthwise, dilated: kernelcases.DirectConvCases) forward,
// input, weight and bias gradients at batches 1 and 3, and the loss with label smoothing.
//
// Tolerance: kernelcheck.Tolerance (1e-4 of the tensor's largest magnitude). The forward and
// input gradient sum at most 3·3·5 = 45 products per element in fp32 (a relative
// error of at most 45·2^-24 ≈ 2.7e-6 of the sum of magnitudes); the weight and bias gradients
// sum a row (≤ 33 products) in fp32 and the rows in double (≤ 3·33 rows): ≤ 33·2^-24 ≈ 2e-6 of
// the magnitudes' sum, far below it for values in [-1, 1). The smoothed loss: a few fp32
// roundings (expf, logf within a few ulp) per element and a sum over ≤ 3 rows.
func TestDirectConvAndSmoothedLossKernels(t *testing.T) {
	for bi, batch := range []int64{1, 3} {
		cases := append(kernelcases.DirectConvChecks(t), kernelcases.SmoothedLossChecks(t)...)
		worst := checkCases(t, batch, 31+uint64(bi), cases)
		assert.Less(t, worst, kernelcheck.Tolerance)
	}
}

// The last direct conv case splits into tasks of several planes, the last task short, at batch
// 3 (codegen/cpu's directGeom.split): the forward 105 planes 4 a task, the weight and bias
// gradients 35 rows 2 a task.
func TestDirectConvTasksOfSeveralPlanes(t *testing.T) {
	c := kernelcases.DirectConvCases[len(kernelcases.DirectConvCases)-1]
	nodes := kernelcases.DirectConvChecks(t)
	prog, err := cpu.GenerateNodes("T", []*ir.Node{nodes[len(nodes)-4].N, nodes[len(nodes)-2].N, nodes[len(nodes)-1].N}, codegen.Options{Batch: 3})
	require.NoError(t, err)
	require.Len(t, prog.Launches, 3, c.String())
	assert.Equal(t, []uint32{27, 18, 18}, []uint32{prog.Launches[0].Grid[0], prog.Launches[1].Grid[0], prog.Launches[2].Grid[0]})
}

// The classifier tail (kernelcases.LinearCrossEntropyChecks: logits, loss, correct count, input
// gradient with and without its mask, weight and bias gradients written or fed to each
// optimizer) at batches 1, 3 and 37. Tolerance: each sum runs in order in fp32 over at most
// K = 700 products of values in [-1, 1) (the logits; dW over ≤ 37 rows, dX over ≤ 33 classes):
// at most K·2^-24 ≈ 4.2e-5 of the magnitudes' sum, about 4·sqrt(K)·2^-24 ≈ 6.3e-6 of it for random
// signs; the loss adds a few ulp of expf and logf per row.
func TestLinearCrossEntropyKernels(t *testing.T) {
	for bi, batch := range []int64{1, 3, 37} {
		worst := checkCases(t, batch, 51+uint64(bi), kernelcases.LinearCrossEntropyChecks(t))
		assert.Less(t, worst, kernelcheck.Tolerance)
	}
}

// The conv2d -> tanh -> avgpool2d block's kernels (kernelcases.ConvPoolCases: forward with and
// without the saved tanh output, input gradient, weight gradient reading t or recomputing it),
// at batches 1 and 3.
func TestConvTanhPoolKernels(t *testing.T) {
	for bi, batch := range []int64{1, 3} {
		worst := checkCases(t, batch, 41+uint64(bi), kernelcases.ConvPoolChecks(t))
		assert.Less(t, worst, kernelcheck.Tolerance)
	}
}

// Batch norm's normalisation with the ReLU folded in (the fuse pass), and its mask's gradient,
// of ../testdata/bnrelu_odd.cnn (5 channels of 7x5 maps, 9 features; affine and not) on every
// instruction set against the reference with NaN-poisoned outputs, at batches 1 and 3 —
// codegen's TestBatchNormReLUKernels. Tolerance: kernelcheck.Tolerance — a subtract, two
// multiplies and an add per element, no reduction.
func TestBatchNormReLUKernels(t *testing.T) {
	src, err := os.ReadFile("../testdata/bnrelu_odd.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnrelu_odd.cnn", src, compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		if (n.Op == ops.BatchNorm2D || n.Op == ops.BatchNorm1D) && n.Attrs.ReLU || n.Op == ir.OpReLUGrad && n.Name == "bn" {
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 3, "bn and bf with their ReLUs, bn's mask")
	checkNodesAtBatches13(t, nodes)
}

// checkNodesAtBatches13 runs nodes' kernels at batches 1 and 3 on every
// instruction set against the reference (NaN-poisoned outputs), within
// kernelcheck.Tolerance and with every argmax matching (a pooled
// gradient's argmax names positions inside the map:
// kernelcases.ValidArgmax); at batch 3 a batch norm gradient also runs a
// padded batch (2 valid samples: their gradient, 0 for the padding).
func checkNodesAtBatches13(t *testing.T, nodes []*ir.Node) {
	t.Helper()
	for _, batch := range []int64{1, 3} {
		prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		for _, isa := range isas(t) {
			dev := openDevice(t, prog, native.Options{ISA: isa})
			for i, n := range nodes {
				rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(batch)))
				ins := kernelcheck.RandomInputs(n, batch, rng)
				kernelcases.ValidArgmax(n, ins, rng)
				o := reference.NodeOptions{Training: true, Update: true}
				r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{}, o)
				require.NoError(t, err, "%s %s", isa, n.Text())
				require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s %s: %s", isa, n.Text(), r)
				require.Zero(t, r.ArgmaxMismatches, "%s %s: %s", isa, n.Text(), r)
				t.Logf("b%d %s %s: %s", batch, isa, n.Text(), r)
				if n.Op == ops.BatchNormGrad && batch == 3 { // over 2 valid samples, 0 for the padding
					require.NoError(t, kernelcheck.PartialBatch(dev, prog, n, ins, 2), "%s %s", isa, n.Text())
				}
			}
		}
	}
}

// Batch norm's normalisation with each activation besides ReLU folded in (Attrs.Act), and the
// gradient that recomputes z and applies the activation's derivative (cnnc_cpu.h's BNApply and
// BNGrad on the activation's functor), of ../testdata/bnact_odd.cnn on every instruction set
// against the reference with NaN-poisoned outputs, at batches 1 and 3, and a padded batch —
// codegen's TestBatchNormActKernels. Tolerance: kernelcheck.Tolerance — the normalisation's four
// operations and the activation's formula per element; the gradient's sums (in double) over at
// most 3·35 values.
func TestBatchNormActKernels(t *testing.T) {
	src, err := os.ReadFile("../testdata/bnact_odd.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnact_odd.cnn", src, compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		if n.Attrs.Act != 0 {
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 12, "six normalisations with their activations, and their gradients")
	checkNodesAtBatches13(t, nodes)
}

// Batch norm with its activation and the max-pool after it folded in (Attrs.Pool: cnnc_cpu.h's
// BNApplyPool, and BNGrad routing the pooled dy through the argmax with PoolR) of
// ../testdata/bnpool_odd.cnn (an overlapping padded 3x3/2 window after ReLU, 2x2 after gelu, 2x1/1
// after tanh; affine and not) on every instruction set against the reference with NaN-poisoned
// outputs, at batches 1 and 3, and a padded batch for the gradients — codegen's
// TestBatchNormPoolKernels. A gradient's argmax names positions inside the map
// (kernelcases.ValidArgmax). Tolerance: kernelcheck.Tolerance — per value the normalisation's four
// operations and the activation's formula, the max exact; the routed dy sums at most 4 windows'
// values; the gradient's sums (in double) run over at most 3·63 values. The argmax must match.
func TestBatchNormPoolKernels(t *testing.T) {
	src, err := os.ReadFile("../testdata/bnpool_odd.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnpool_odd.cnn", src, compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		require.NotEqual(t, ir.OpMaxPool2D, n.Op, "%s: a max-pool after batch norm is not folded", n.Text())
		if (n.Op == ops.BatchNorm2D || n.Op == ops.BatchNormGrad) && n.Attrs.Pool != nil {
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 6, "three pooled normalisations and their gradients")
	checkNodesAtBatches13(t, nodes)
}

// The evaluation graph's pooled normalisations (kernelcases.BNPoolEvalModel: no argmax) on every
// instruction set against the reference with NaN-poisoned outputs, at batches 1 and 3 — codegen's
// TestBatchNormPoolEvalKernels. Tolerance: as TestBatchNormPoolKernels's forward.
func TestBatchNormPoolEvalKernels(t *testing.T) {
	res, err := compiler.CompileSource("bnpool_eval.cnn", []byte(kernelcases.BNPoolEvalModel), compiler.Options{Evaluation: true})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		if n.Op == ops.BatchNorm2D {
			require.True(t, n.Attrs.Pool != nil && n.Attrs.NoArgmax && len(n.Outs) == 1, n.Text())
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 2)
	for _, batch := range []int64{1, 3} {
		prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Eval: true})
		require.NoError(t, err)
		for _, isa := range isas(t) {
			dev := openDevice(t, prog, native.Options{ISA: isa})
			for i, n := range nodes {
				ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(uint64(i)+1, uint64(batch))))
				r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{}, reference.NodeOptions{})
				require.NoError(t, err, "%s %s", isa, n.Text())
				require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s %s: %s", isa, n.Text(), r)
				t.Logf("b%d %s %s: %s", batch, isa, n.Text(), r)
			}
		}
	}
}
