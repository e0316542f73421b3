package codegen_test

import (
	"bytes"
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// nodeCase is one node to check, with the run-time state its reference needs.
type nodeCase struct {
	n *ir.Node
	o reference.NodeOptions
}

// checkNodes generates ONE program for all cases (compiling a .cu costs
// far more than running it), runs each node's kernels on the CPU emulator
// with random inputs and NaN-poisoned outputs, compares with the reference
// and returns the worst relative error.
func checkNodes(t *testing.T, batch int64, seed uint64, cases []nodeCase) float64 {
	t.Helper()
	return checkNodesAt(t, codegen.FP32, batch, seed, cases)
}

// checkNodesAt is checkNodes with the GEMM-shaped kernels at a precision:
// on tensor cores the inputs are first rounded to it (kernelcheck.RoundInputs
// says why Tolerance then still applies).
func checkNodesAt(t *testing.T, prec codegen.Precision, batch int64, seed uint64, cases []nodeCase) float64 {
	t.Helper()
	var nodes []*ir.Node
	for _, c := range cases {
		nodes = append(nodes, c.n)
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec, SMs: testSMs(prec)})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err, string(prog.Source))
	defer dev.Close()
	rng := rand.New(rand.NewPCG(seed, uint64(batch)))
	worst := kernelcheck.Report{}
	for _, c := range cases {
		ins := kernelcheck.RoundInputs(c.n, kernelcheck.RandomInputs(c.n, batch, rng), prec)
		r, err := kernelcheck.Node(dev, prog, c.n, ins, kernelcheck.Scalars{LR: testLR, Step: c.o.Step, Seed: c.o.Seed}, c.o)
		require.NoError(t, err, c.n.Text())
		require.NotEmpty(t, r.Kernel, "no launch for %s", c.n.Text())
		require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s\n%s", c.n.Text(), r)
		if r.Worst >= worst.Worst {
			worst = r
		}
	}
	t.Logf("%s, batch %d: %d nodes, %d kernels; worst %s", prec, batch, len(cases), len(prog.Kernels), worst)
	return worst.Worst
}

// The optimizers every fused and standalone update is checked with.
var testOptimizers = []*ir.Optimizer{
	{Kind: ir.SGD, LR: 0.05},
	{Kind: ir.SGD, LR: 0.05, Momentum: 0.9},
	{Kind: ir.SGD, LR: 0.05, Momentum: 0.8, Nesterov: true, WeightDecay: 0.01},
	{Kind: ir.Adam, LR: 0.05, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1},
	{Kind: ir.AdamW, LR: 0.05, Beta1: 0.85, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.01},
}

// LR in kernelcheck.Scalars must equal the optimizers' (the reference reads Opt.LR).
const testLR = 0.05

func TestLinearBlockKernels(t *testing.T) {
	checkLinearKernels(t, codegen.FP32, []int64{1, 5, 67}, 1)
}

// The same on tensor cores (TF32 and BF16): one batch, every third variant
// of each shape (the compile of the kernels dominates the test's time).
func TestLinearBlockKernelsTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		checkLinearKernels(t, prec, []int64{67}, 3)
	}
}

// Every activation folded into a linear block (Attrs.Act): the forward's
// f (and z where the block saves it), the gradients' f' through y or z, on
// odd, split-K and vectorised shapes (kernelcases.LinearActChecks).
func TestLinearBlockActivationKernels(t *testing.T) {
	var cases []nodeCase
	for _, c := range kernelcases.LinearActChecks(t) {
		cases = append(cases, nodeCase{n: c.N, o: c.O})
	}
	checkNodesAt(t, codegen.FP32, 67, 23, cases)
}

// The same on tensor cores (TF32, BF16), unfused weight gradients. The
// forward's f runs on the fp32 tile, so Tolerance applies (RoundInputs).
// The gradients stage dz = dy·f'(s), computed in fp32 from the rounded
// inputs, rounded once more to the precision (as the unfused activation
// gradient's output would be): an error of at most u·|dz| in each staged
// element, u = 2^-11 (TF32) or 2^-8 (BF16), hence at most
// u·Σ_k|dz_k||B_k| ≤ u·K·max|dz|·max|B| in each output over a reduction of
// K, on top of the fp32 accumulation's (Tolerance): the bound each
// gradient is held to, relative to its largest reference magnitude.
func TestLinearBlockActivationKernelsTensorCores(t *testing.T) {
	var nodes []*ir.Node
	for _, c := range kernelcases.LinearActChecks(t) {
		if c.O.Update {
			continue
		}
		nodes = append(nodes, c.N)
	}
	const batch = 67
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		u := map[codegen.Precision]float64{codegen.TF32: 0x1p-11, codegen.BF16: 0x1p-8}[prec]
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err, string(prog.Source))
		rng := rand.New(rand.NewPCG(29, batch))
		for _, n := range nodes {
			ins := kernelcheck.RoundInputs(n, kernelcheck.RandomInputs(n, batch, rng), prec)
			r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{LR: testLR}, reference.NodeOptions{})
			require.NoError(t, err, n.Text())
			require.NotEmpty(t, r.Kernel, "no launch for %s", n.Text())
			tol := kernelcheck.Tolerance
			if n.Op != ir.OpLinearBlock {
				tol += u * stagedBound(t, n, ins, batch)
			}
			require.LessOrEqual(t, r.Worst, tol, "%s\n%s", n.Text(), r)
			t.Logf("%s %s (allowed %.2e)", prec, r, tol)
		}
		dev.Close()
	}
}

// stagedBound is K·max|dz|·max|B| / max|reference output| for a linear
// block gradient n on inputs ins: dz = dy·f'(s) of its activation, B the
// other GEMM operand (W for the input gradient, x for the weight
// gradient), K the reduction's length (out, or the batch).
func stagedBound(t *testing.T, n *ir.Node, ins [][]float64, batch int64) float64 {
	t.Helper()
	p, at, dz := blockGradDz(t, n, ins, batch)
	var b []float64
	var k float64
	if n.Op == ir.OpLinearBlockGradWeight {
		b, k = at(p.X), float64(batch)
	} else {
		b, k = at(p.W), float64(p.W.Type.Dims[0])
	}
	return stagedRatio(t, n, ins, batch, k*maxAbs(dz)*maxAbs(b))
}

// blockGradDz gives a block gradient n's parts, its input by value (on
// inputs ins) and dz = dy·f'(s) of its folded activation.
func blockGradDz(t *testing.T, n *ir.Node, ins [][]float64, batch int64) (ir.BlockParts, func(*ir.Value) []float64, []float64) {
	t.Helper()
	p, err := n.Parts()
	require.NoError(t, err)
	at := func(v *ir.Value) []float64 {
		for i, in := range n.Ins {
			if in == v {
				return ins[i]
			}
		}
		t.Fatalf("%s does not read %s", n.Text(), v.Name)
		return nil
	}
	dz := ops.PointwiseOf(n.Attrs.Act).Grad.Ref(&ops.RefEnv{Batch: int(batch)}, n, [][]float64{at(p.DOut), at(p.Y)})[0]
	return p, at, dz
}

// stagedRatio is a staged-product bound over n's largest reference output.
func stagedRatio(t *testing.T, n *ir.Node, ins [][]float64, batch int64, bound float64) float64 {
	t.Helper()
	want, err := reference.RunNode(n, ins, int(batch), reference.NodeOptions{})
	require.NoError(t, err)
	return bound / maxAbs(want[0])
}

func maxAbs(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = math.Max(m, math.Abs(x))
	}
	return m
}

// checkLinearKernels checks linear blocks over edge and random shapes at
// each batch, keeping one variant (bias, relu, masked) in every.
func checkLinearKernels(t *testing.T, prec codegen.Precision, batches []int64, every int) {
	type shape struct{ in, out int64 }
	// edge shapes (single features, tile boundaries, split-K over in for the
	// forward and over out for the input gradient, a split forward whose
	// output rows are a multiple of 4 wide: the vectorised epilogues), then
	// random ones
	edges := []shape{{1, 1}, {3, 17}, {17, 3}, {130, 130}, {700, 3}, {5, 300}, {64, 64}, {600, 12}}
	for bi, batch := range batches {
		rng := rand.New(rand.NewPCG(uint64(bi), 7))
		shapes := append(edges[:len(edges):len(edges)], shape{1 + rng.Int64N(200), 1 + rng.Int64N(200)}, shape{1 + rng.Int64N(200), 1 + rng.Int64N(200)})
		g := ir.NewGraph("T")
		var cases []nodeCase
		for si, s := range shapes {
			// every combination of bias, relu, masked and maskout over the shapes
			for v := 0; v < 8; v++ {
				bias, relu, masked := v&1 != 0, v&2 != 0, v&4 != 0
				if masked && !relu || (v+si)%every != 0 {
					continue // masked only means something for a ReLU block
				}
				l := kernelcases.NewLinear(g, fmt.Sprintf("fc%d_%d", si, v), s.in, s.out, bias, relu)
				l.Masked = masked
				l.XMask = (v+si+bi)%2 == 0
				if v == 0 || v == 3 || si%2 == 0 {
					cases = append(cases, nodeCase{n: l.Forward(t)})
				}
				cases = append(cases, nodeCase{n: l.GradInput(t)})
				// unfused, then with each optimizer at step 0 and a later step
				k := (v + si + bi) % (len(testOptimizers) + 1)
				if k == len(testOptimizers) {
					cases = append(cases, nodeCase{n: l.GradWeight(t, nil)})
				} else {
					step := int64(0)
					if (v+si)%2 == 1 {
						step = 4
					}
					cases = append(cases, nodeCase{n: l.GradWeight(t, testOptimizers[k]), o: reference.NodeOptions{Step: step, Update: true}})
				}
			}
		}
		// each optimizer fused at both steps with a bias, on a tile-crossing shape
		for k, opt := range testOptimizers {
			for _, step := range []int64{0, 7} {
				l := kernelcases.NewLinear(g, fmt.Sprintf("opt%d_%d", k, step), 37, 19, true, true)
				cases = append(cases, nodeCase{n: l.GradWeight(t, opt), o: reference.NodeOptions{Step: step, Update: true}})
			}
		}
		checkNodesAt(t, prec, batch, 11+uint64(bi), cases)
	}
}

// The tiling and split-K choices the examples' layers get.
func TestGemmPlans(t *testing.T) {
	g := ir.NewGraph("T")
	fc1 := kernelcases.NewLinear(g, "fc1", 28800, 128, true, false)
	prog, err := codegen.GenerateNodes("T", []*ir.Node{fc1.Forward(t), fc1.GradInput(t), fc1.GradWeight(t, testOptimizers[1])}, codegen.Options{Batch: 32})
	require.NoError(t, err)
	var names []string
	for _, l := range prog.Launches {
		names = append(names, fmt.Sprintf("%s grid=%v block=%v shared=%d", l.Kernel, l.Grid, l.Block, l.SharedBytes))
	}
	require.Equal(t, []string{
		"linear_block_partial_b32_in28800_out128_splitk120 grid=[2 1 120] block=[256 1 1] shared=6272",
		"linear_block_reduce_b32_out128_splitk120_bias grid=[128 1 1] block=[480 1 1] shared=0", // 15 warps per 32 outputs
		"linear_block_grad_input_b32_out128_in28800 grid=[450 1 1] block=[256 1 1] shared=6272",
		"linear_block_grad_weight_b32_out128_in28800_bias_sgd_mom0p9 grid=[450 2 1] block=[256 1 1] shared=8320",
	}, names)
	require.Len(t, prog.Scratch, 1)
	// partial rows: the most splits x rows any batch up to 32 takes (here
	// batch 32's own 120 x 32), so a micro-batch loop's smaller last
	// iteration fits the workspace planned for it
	require.Equal(t, "f32[3840,128]", prog.Scratch[0].Type.String())
}

// Two runs of the same launches give the same bits, whatever order the
// emulator's two workers run the blocks in: no atomics, and every sum
// (split-K slices, the batch reduction of the weight gradient, the loss)
// runs in a fixed order.
func TestLinearAndLossDeterministic(t *testing.T) {
	g := ir.NewGraph("T")
	l := kernelcases.NewLinear(g, "fc", 2000, 70, true, true)
	logits := g.NewValue("logits", ir.F32Batched(70), ir.RoleActivation, dsl.Pos{})
	label := g.NewValue("label", ir.Type{DType: ir.Class, Batched: true, Classes: 70}, ir.RoleLabel, dsl.Pos{})
	nodes := []*ir.Node{l.Forward(t), l.GradInput(t), l.GradWeight(t, testOptimizers[3]),
		kernelcases.Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{}, []*ir.Value{logits, label}, "loss", "dlogits", "correct")}
	const batch = 45
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
	require.NoError(t, err)
	require.NotEmpty(t, prog.Scratch, "the forward is split over k")
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{Workers: 2})
	require.NoError(t, err)
	defer dev.Close()
	// step 3 and 3 real rows of the batch
	block, err := kernelcheck.ScalarBlock(dev, kernelcheck.Scalars{LR: testLR, Step: 3, Valid: 3}, batch)
	require.NoError(t, err)
	run := func() map[string][]byte {
		rng := rand.New(rand.NewPCG(1, 2))
		ptrs := map[*ir.Value]device.Ptr{}
		for _, n := range nodes {
			ins := kernelcheck.RandomInputs(n, batch, rng)
			for i, v := range n.Ins {
				if _, ok := ptrs[v]; !ok {
					p, err := dev.Alloc(v.Type.Bytes(batch))
					require.NoError(t, err)
					require.NoError(t, dev.CopyIn(p, kernelcheck.Encode(v.Type, ins[i], batch)))
					ptrs[v] = p
				}
			}
		}
		for _, l := range prog.Launches {
			var params []uint64
			for _, a := range l.Args {
				switch a.Kind {
				case kernelarg.Buffer:
					if _, ok := ptrs[a.Value]; !ok {
						p, err := dev.Alloc(a.Value.Type.Bytes(batch))
						require.NoError(t, err)
						ptrs[a.Value] = p
					}
					params = append(params, uint64(ptrs[a.Value]))
				case kernelarg.Scalars:
					params = append(params, uint64(block))
				default:
					params = append(params, uint64(a.Int))
				}
			}
			require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params))
		}
		out := map[string][]byte{}
		for v, p := range ptrs {
			b := make([]byte, v.Type.Bytes(batch))
			require.NoError(t, dev.CopyOut(b, p))
			out[v.Name] = b
			require.NoError(t, dev.Free(p))
		}
		return out
	}
	first := run()
	for i := 0; i < 2; i++ {
		again := run()
		for name, b := range first {
			require.True(t, bytes.Equal(b, again[name]), "%s differs between runs", name)
		}
	}
}

// On tensor cores a GEMM shallow in k (under 16 tiles) splits only where
// its grid is at most half the fill target (16 warps on each of 132
// SMs: 528 blocks of 4 warps), in slices of at least 2 tiles: VGG-small's
// fc1 input gradient (k = 256, 8 tiles of 32) at batch 128 has 256 blocks
// and splits in 4; at batch 256 its 512 blocks are nearly the target and
// a reduce launch would cost more than the fuller grid saves.
func TestShallowGemmSplitsOnlyFarFromTheFill(t *testing.T) {
	for _, c := range []struct {
		batch int64
		want  []string
	}{
		{128, []string{
			"linear_block_grad_input_partial_b128_out256_in2048_splitk4_tf32 grid=[64 4 4]",
			"linear_block_grad_input_reduce_b128_in2048_splitk4_tf32 grid=[8192 1 1]",
		}},
		{256, []string{"linear_block_grad_input_b256_out256_in2048_tf32 grid=[64 8 1]"}},
	} {
		g := ir.NewGraph("T")
		fc1 := kernelcases.NewLinear(g, "fc1", 2048, 256, true, false)
		prog, err := codegen.GenerateNodes("T", []*ir.Node{fc1.GradInput(t)}, codegen.Options{Batch: c.batch, Precision: codegen.TF32, SMs: 132})
		require.NoError(t, err)
		var names []string
		for _, l := range prog.Launches {
			names = append(names, fmt.Sprintf("%s grid=%v", l.Kernel, l.Grid))
		}
		require.Equal(t, c.want, names, "batch %d", c.batch)
	}
}
