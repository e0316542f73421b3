package codegen_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// A padded last batch through batch norm: the statistics are the valid
// samples' (and so the running statistics' update), the gradient sums over
// them and gives the padding zero — what PyTorch computes on the smaller
// batch.
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
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err)
		for _, n := range nodes {
			ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(5, 6)))
			require.NoError(t, kernelcheck.PartialBatch(dev, prog, n, ins, valid), call)
		}
		dev.Close()
	}
}

// Whole training steps of a model with batch norm (maps and features,
// affine or not, a conv without bias before it, the fused blocks around
// it) on the CPU emulator against the reference: loss, parameters,
// optimizer state and running statistics after each step.
func TestBatchNormSteps(t *testing.T) {
	src, err := os.ReadFile("../compiler/plan/testdata/bn.cnn")
	require.NoError(t, err)
	checkSteps(t, "bn.cnn", src, 6, 3, 3)
}

// bnReLUNodes compiles testdata/bnrelu_odd.cnn and returns its batch norm
// normalisations with the ReLU folded in and the relu_grad nodes of their
// masks: both kinds of mask (relu_grad, and maskout in the linear block's
// input gradient) must be there.
func bnReLUNodes(t *testing.T, path string) (*compiler.Result, []*ir.Node) {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnrelu_odd.cnn", src, compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	var maskout bool
	for _, n := range res.Graph.Nodes {
		switch {
		case (n.Op == ops.BatchNorm2D || n.Op == ops.BatchNorm1D) && n.Attrs.ReLU:
			nodes = append(nodes, n)
		case n.Op == ir.OpReLUGrad && n.Name == "bn":
			nodes = append(nodes, n)
		case n.Op == ir.OpReLU:
			t.Fatalf("%s: a ReLU after batch norm is not folded", n.Text())
		}
		// the logits' input gradient: linear_cross_entropy's dX (the classifier tail) or a linear block's
		maskout = maskout || ((n.Op == ir.OpLinearBlockGradInput || n.Op == ops.LinearCrossEntropyOp) && n.Attrs.MaskOut)
	}
	require.Len(t, nodes, 3, "bn and bf with their ReLUs, bn's mask")
	require.True(t, maskout, "the logits' input gradient applies bf's ReLU mask")
	return res, nodes
}

// Batch norm's normalisation with the ReLU folded in, and its mask's
// gradient, on the CPU emulator against the float64 reference with
// NaN-poisoned outputs, at batches 1 and 3 on odd shapes (5 channels of
// 7x5 maps, 9 features). Tolerance: kernelcheck.Tolerance — a subtract,
// two multiplies and an add per element, no reduction.
func TestBatchNormReLUKernels(t *testing.T) {
	_, nodes := bnReLUNodes(t, "testdata/bnrelu_odd.cnn")
	checkBNKernels(t, nodes, codegen.Options{}, reference.NodeOptions{Training: true, Update: true})
}

// checkBNKernels runs the kernels of batch norm nodes (generated into one
// program with opts at batches 1 and 3) on the CPU emulator against the
// float64 reference with NaN-poisoned outputs, within
// kernelcheck.Tolerance and with every argmax matching; a pooled
// gradient's argmax names positions inside the map
// (kernelcases.ValidArgmax), and at batch 3 each gradient also runs a
// padded batch (2 valid samples: their gradient, 0 for the padding).
func checkBNKernels(t *testing.T, nodes []*ir.Node, opts codegen.Options, o reference.NodeOptions) {
	t.Helper()
	for _, batch := range []int64{1, 3} {
		opts.Batch = batch
		prog, err := codegen.GenerateNodes("T", nodes, opts)
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err)
		for i, n := range nodes {
			rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(batch)))
			ins := kernelcheck.RandomInputs(n, batch, rng)
			kernelcases.ValidArgmax(n, ins, rng)
			r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{}, o)
			require.NoError(t, err, n.Text())
			require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s: %s", n.Text(), r)
			require.Zero(t, r.ArgmaxMismatches, "%s: %s", n.Text(), r)
			t.Logf("b%d %s: %s", batch, n.Text(), r)
			if n.Op == ops.BatchNormGrad && batch == 3 {
				require.NoError(t, kernelcheck.PartialBatch(dev, prog, n, ins, 2), n.Text())
			}
		}
		dev.Close()
	}
}

// Whole training steps of testdata/bnrelu_odd.cnn (batch norms with their
// ReLUs folded in) on the CPU emulator against the reference.
func TestBatchNormReLUSteps(t *testing.T) {
	src, err := os.ReadFile("testdata/bnrelu_odd.cnn")
	require.NoError(t, err)
	checkSteps(t, "bnrelu_odd.cnn", src, 3, 4, 3)
}

// The training statistics' two passes and the gradient's three over more
// chunks than the per-channel blocks have threads (17 samples of 33x31
// maps: 272 chunks of 64 values a channel, the last one partial), against
// the reference with NaN-poisoned outputs, and a padded batch (9 valid: a
// chunk straddles the end of the valid values). Tolerance:
// kernelcheck.Tolerance — Chan's merges of chunk means and M2 (a Welford
// pass over 64 values, then 5 + 2 + 8 levels of pairwise merges), and the
// gradient's sums (64 values, then 2 in order, then 8 levels), keep the
// relative error near the depth times 2^-24, far below it.
func TestBatchNormManyChunks(t *testing.T) {
	const src = `model T(image: f32[3,33,31], label: class[4]) {
    c = conv2d(image, out=3, kernel=1, bias=false)
    bn = batchnorm2d(c)
    logits = linear(flatten(bn), out=4)
    loss = cross_entropy(logits, label)
}
`
	res, err := compiler.CompileSource("t.cnn", []byte(src), compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		if n.Op == ops.BatchNormStats || n.Op == ops.BatchNormGrad {
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 2)
	const batch = 17
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
	require.NoError(t, err)
	require.Len(t, prog.Launches, 5, "the statistics' cells and merge, the gradient's cells, sums and dx")
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	for i, n := range nodes {
		ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(8, uint64(i))))
		if n.Op == ops.BatchNormStats {
			for j := range ins[0] { // an offset the variance must not cancel against
				ins[0][j] = float64(float32(ins[0][j] + 3))
			}
			for j := range ins[2] { // running variances are positive
				ins[2][j] = math.Abs(ins[2][j]) + 0.1
			}
		}
		r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{}, reference.NodeOptions{Training: true, Update: true})
		require.NoError(t, err)
		require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, r.String())
		t.Logf("%s", r)
		require.NoError(t, kernelcheck.PartialBatch(dev, prog, n, ins, 9), n.Text())
	}
}

// bnConvSrc: four conv blocks whose outputs only a batch norm reads, so
// all write the statistics' partials in their epilogue (Attrs.BNStats): a
// u8 image into 6 channels of 13x11 maps (143 values a sample: flat
// chunks span samples), 40 channels of 13x11 maps from f32 (tensor cores:
// output regions of one sample), 8 channels of stride-2 7x6 maps (one
// whole map a region) and 8 of 4x3 maps (tensor cores: whole maps of
// several consecutive samples a tile, the last tile part padding), twice,
// the second with a gelu folded into the block: its partials are of the
// gelu's output, and z (save=true) stays the block's last output.
const bnConvSrc = `model T(image: f32[3,13,11], label: class[4]) {
    c1 = conv2d(image, out=6, kernel=3, padding=1, bias=false)
    r1 = relu(batchnorm2d(c1))
    c2 = conv2d(r1, out=40, kernel=3, padding=1)
    r2 = relu(batchnorm2d(c2))
    c3 = conv2d(r2, out=8, kernel=3, stride=2, padding=1)
    bn3 = batchnorm2d(c3)
    c4 = conv2d(bn3, out=8, kernel=3, stride=2, padding=1)
    bn4 = batchnorm2d(c4)
    g5 = gelu(conv2d(bn4, out=8, kernel=3, padding=1))
    bn5 = batchnorm2d(g5)
    logits = linear(flatten(bn5), out=4)
    loss = cross_entropy(logits, label)
}
`

// The conv blocks that write batch norm's partials and the statistics
// that merge them, on the CPU emulator against the float64 reference with
// NaN-poisoned outputs (the partials included, tiled as the target tiles
// each block: Program.BNTiles), FFMA and tensor-core paths, at batches 1,
// 3 and 17 (38 flat chunks a channel), and at a padded batch (9 of 17
// valid: a flat chunk and a several-sample tile straddle the valid end).
// The statistics node's partials input is the reference's partials of its
// x in its conv block's tiling, so the merge is checked against the
// statistics of x itself. Tolerance: kernelcheck.Tolerance — a cell's mean
// and M2 are sums of at most 64 values (relative error near 64·2^-24),
// Chan's merges add the tree's depth (at most 9 levels) times 2^-24; the
// conv's own error is the forward tests'. The cells are also checked
// field by field against the float64 partials of the kernel's own output
// (checkBNCells), also at the padded batch.
func TestBatchNormStatsInConvEpilogue(t *testing.T) {
	res, err := compiler.CompileSource("t.cnn", []byte(bnConvSrc), compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		switch {
		case n.Op == ir.OpConvBlock:
			require.True(t, n.Attrs.BNStats, n.Text())
			nodes = append(nodes, n)
		case n.Op == ops.BatchNormStats:
			require.Len(t, n.Ins, 5, "%s merges the conv's partials", n.Text())
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 10)
	last := nodes[len(nodes)-2]
	require.True(t, last.Attrs.SaveAct && last.Attrs.BNStats, last.Text())
	require.Len(t, last.Outs, 3, last.Text())
	for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32} {
		for _, batch := range []int64{1, 3, 17} {
			prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec, SMs: testSMs(prec)})
			require.NoError(t, err)
			for _, l := range prog.Launches {
				require.NotContains(t, l.Kernel, "batchnorm_stats_partial", "the conv blocks wrote the cells")
			}
			if prec == codegen.TF32 && batch > 1 { // the region tilings this test exists for
				var one, several bool
				for _, tl := range prog.BNTiles {
					one = one || tl.NS == 1 && tl.TilesPerSample > 1
					several = several || tl.NS > 1
				}
				require.True(t, one && several, "tilings %v", prog.BNTiles)
			}
			checkBNPartialNodes(t, prog, nodes, batch, prec)
		}
	}
}

// checkBNPartialNodes runs nodes — convs that write batch norm's partials
// (conv blocks or direct convs, Attrs.BNStats) and the statistics merging
// them — of prog (at batch, on prec) on the CPU emulator against the
// float64 reference with NaN-poisoned outputs, the partials tiled as
// prog.BNTiles says; a conv's cells also field by field against the
// float64 partials of its own output (checkBNCells), and at batch 17 at a
// padded batch of 9 valid samples. TestBatchNormStatsInConvEpilogue gives
// the tolerance's analysis.
func checkBNPartialNodes(t *testing.T, prog *codegen.Program, nodes []*ir.Node, batch int64, prec codegen.Precision) {
	t.Helper()
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err)
	for i, n := range nodes {
		ins := bnConvInputs(n, prog, batch, batch, prec, rand.New(rand.NewPCG(uint64(i)+1, uint64(batch))))
		opts := reference.NodeOptions{Training: true, Update: true, BNTiles: prog.BNTiles}
		r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{}, opts)
		require.NoError(t, err, n.Text())
		require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s b%d %s: %s", prec, batch, n.Text(), r)
		part := n.Ins[len(n.Ins)-1] // a statistics node's partials
		if writesBNPartials(n) {
			part = n.Outs[1]
		}
		t.Logf("%s b%d %s (tiling %+v): %s", prec, batch, n.Text(), prog.BNTiles[part], r)
		valids := []int64{batch}
		if batch == 17 {
			valids = append(valids, 9)
		}
		for _, valid := range valids {
			if writesBNPartials(n) {
				got, err := kernelcheck.Launch(dev, prog, n, ins, kernelcheck.Scalars{Valid: valid})
				require.NoError(t, err, n.Text())
				y := n.Outs[0].Type
				want := ops.BNPartials(got.Outs[0], int(batch), int(valid), y.Dims[0], y.Dims[1], y.Dims[2],
					prog.BNTiles[n.Outs[1]], len(got.Outs[1]))
				checkBNCells(t, got.Outs[0], got.Outs[1], want, "%s b%d valid %d %s", prec, batch, valid, n.Text())
			} else if valid < batch { // a conv leaves its padding's outputs as computed
				// the partials a conv writes at 9 valid samples: the valid values' cells
				ins = bnConvInputs(n, prog, batch, valid, prec, rand.New(rand.NewPCG(uint64(i)+1, uint64(batch))))
				require.NoError(t, kernelcheck.PartialBatch(dev, prog, n, ins, valid), "%s %s", prec, n.Text())
			}
		}
	}
	dev.Close()
}

// writesBNPartials: n is a conv that writes batch norm's partials as its
// second output.
func writesBNPartials(n *ir.Node) bool {
	return (n.Op == ir.OpConvBlock || n.Op == ir.OpConv2D) && n.Attrs.BNStats
}

// The conv blocks writing batch norm partials (flat and region tiles) and
// the merges reading them, at batch 32 on every precision, through ptxas:
// no spills, no local memory (requireClean).
func TestPtxasBNStatsInConvEpilogue(t *testing.T) {
	nvcc.Require(t)
	res, err := compiler.CompileSource("t.cnn", []byte(bnConvSrc), compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		if n.Attrs.BNStats || n.Op == ops.BatchNormStats {
			nodes = append(nodes, n)
		}
	}
	for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32, codegen.BF16} {
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		require.Contains(t, string(prog.Source), "_bnstats", "%s: the conv blocks write the partials", prec)
		ks, err := codegen.CompilePtxas(prog.Source, "bnconv.cu", nvcc.Targets)
		require.NoError(t, err)
		requireClean(t, prog, ks)
	}
}

// bnDirectSrc: convs the conv blocks do not take (the direct kernels)
// whose outputs only a batch norm reads, so each writes the statistics'
// partials (Attrs.BNStats): a grouped 3x3 conv of the image (3 groups of
// 2 outputs) into 13x11 maps (143 values a sample: flat chunks span
// samples), a depthwise 3x3 stride 2 with a bias into 7x6 maps, a
// dilated 3x3 (dilation 2) and a depthwise 3x3 stride 1 keeping them.
const bnDirectSrc = `model T(image: f32[3,13,11], label: class[4]) {
    d1 = conv2d(image, out=6, kernel=3, padding=1, groups=3, bias=false)
    b1 = batchnorm2d(d1)
    d2 = conv2d(b1, out=6, kernel=3, stride=2, padding=1, groups=6)
    b2 = batchnorm2d(d2)
    d3 = conv2d(b2, out=5, kernel=3, padding=2, dilation=2, bias=false)
    b3 = batchnorm2d(d3)
    d4 = conv2d(b3, out=5, kernel=3, padding=1, groups=5, bias=false)
    b4 = batchnorm2d(d4)
    logits = linear(flatten(b4), out=4)
    loss = cross_entropy(logits, label)
}
`

// bnDirectNodes compiles bnDirectSrc: its direct convs, each writing
// partials, and the statistics that merge them.
func bnDirectNodes(t *testing.T) []*ir.Node {
	t.Helper()
	res, err := compiler.CompileSource("t.cnn", []byte(bnDirectSrc), compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		switch n.Op {
		case ir.OpConv2D:
			require.True(t, n.Attrs.BNStats, n.Text())
			nodes = append(nodes, n)
		case ops.BatchNormStats:
			require.Len(t, n.Ins, 5, "%s merges the conv's partials", n.Text())
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 8)
	return nodes
}

// The direct convs (grouped, depthwise stride 2 and 1, dilated) that
// write batch norm's partials and the statistics that merge them, on the
// CPU emulator against the float64 reference with NaN-poisoned outputs
// (checkBNPartialNodes: the partials in the flat tiling the direct kernel
// declares, and at a padded batch of 9 of 17), at batches 1, 3 and 17.
// Tolerance: TestBatchNormStatsInConvEpilogue's — a cell's mean and M2
// come from at most 64 values (two per lane, then a 5-level butterfly of
// Chan merges), the conv's own error is the direct forward's.
func TestBatchNormStatsInDirectConv(t *testing.T) {
	nodes := bnDirectNodes(t)
	for _, batch := range []int64{1, 3, 17} {
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		var fused int
		for _, l := range prog.Launches {
			require.NotContains(t, l.Kernel, "batchnorm_stats_partial", "the direct convs wrote the cells")
			if strings.HasPrefix(l.Kernel, "direct_conv_fwd") && strings.HasSuffix(l.Kernel, "_bnstats") {
				fused++
			}
		}
		require.Equal(t, 4, fused, "the direct convs' forwards write the partials")
		require.Empty(t, prog.BNTiles, "flat cells")
		checkBNPartialNodes(t, prog, nodes, batch, codegen.FP32)
	}
}

// The direct convs writing batch norm partials and the merges reading
// them at batch 32 through ptxas: no spills, no local memory.
func TestPtxasBNStatsInDirectConv(t *testing.T) {
	nvcc.Require(t)
	prog, err := codegen.GenerateNodes("T", bnDirectNodes(t), codegen.Options{Batch: 32, SMs: 132})
	require.NoError(t, err)
	require.Contains(t, string(prog.Source), "_bnstats", "the direct convs write the partials")
	ks, err := codegen.CompilePtxas(prog.Source, "bndirect.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}

// checkBNCells compares a conv block's partials with the float64 ones of
// its output y, field by field: the means relative to the largest |y| (a
// mean of at most 64 values: error near 64·2^-24 of it), the M2s relative
// to the largest M2 (two-pass sums of at most 64 squares), so that a
// tile's cell is checked at its own scale, not the tensor's.
func checkBNCells(t *testing.T, y, got, want []float64, msg string, args ...any) {
	t.Helper()
	ys, qs := 0.0, 0.0
	for _, v := range y {
		ys = math.Max(ys, math.Abs(v))
	}
	for i := 1; i < len(want); i += ops.BNCell {
		qs = math.Max(qs, want[i])
	}
	require.Len(t, got, len(want))
	what := fmt.Sprintf(msg, args...)
	for i := 0; i < len(want); i += ops.BNCell {
		require.LessOrEqual(t, math.Abs(got[i]-want[i]), kernelcheck.Tolerance*ys, "mean of cell %d: %g vs %g: %s", i/ops.BNCell, got[i], want[i], what)
		require.LessOrEqual(t, math.Abs(got[i+1]-want[i+1]), kernelcheck.Tolerance*qs, "M2 of cell %d: %g vs %g: %s", i/ops.BNCell, got[i+1], want[i+1], what)
	}
}

// bnConvInputs are random inputs of n, rounded for prec; a statistics
// node's partials are those of its x's first valid samples, tiled as its
// conv block's in prog.
func bnConvInputs(n *ir.Node, prog *codegen.Program, batch, valid int64, prec codegen.Precision, rng *rand.Rand) [][]float64 {
	ins := kernelcheck.RoundInputs(n, kernelcheck.RandomInputs(n, batch, rng), prec)
	if n.Op == ops.BatchNormStats {
		x := n.Ins[0].Type
		ins[4] = ops.BNPartials(ins[0], int(batch), int(valid), x.Dims[0], x.Dims[1], x.Dims[2], prog.BNTiles[n.Ins[4]], len(ins[4]))
	}
	return ins
}
