package codegen_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// bnPoolNodes compiles testdata/bnpool_odd.cnn and returns its batch norm
// normalisations with the max-pool folded in (Attrs.Pool) and their
// gradients: three of each, and no standalone max-pool left.
func bnPoolNodes(t *testing.T, path string) []*ir.Node {
	t.Helper()
	src, err := os.ReadFile(path)
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
	return nodes
}

// Batch norm with its activation and the max-pool after it folded in:
// the normalisation writing the pooled output and the packed argmax, and
// the gradient routing the pooled dy through the argmax, on the CPU
// emulator against the float64 reference with NaN-poisoned outputs, at
// batches 1 and 3 on odd shapes, and a padded batch (2 of 3 valid) for the
// gradients. Tolerance: kernelcheck.Tolerance — per value the
// normalisation's four operations and the activation's formula, the max
// exact; the routed dy sums at most 4 windows' values (k=3, s=2), and the
// gradient's sums run over at most 3·63 values. The argmax must match.
func TestBatchNormPoolKernels(t *testing.T) {
	checkBNKernels(t, bnPoolNodes(t, "testdata/bnpool_odd.cnn"), codegen.Options{}, reference.NodeOptions{Training: true, Update: true})
}

// bnPoolEvalNodes are kernelcases.BNPoolEvalModel's pooled normalisations
// compiled for evaluation: two, without argmax.
func bnPoolEvalNodes(t *testing.T) []*ir.Node {
	t.Helper()
	res, err := compiler.CompileSource("bnpool_eval.cnn", []byte(kernelcases.BNPoolEvalModel), compiler.Options{Evaluation: true})
	require.NoError(t, err)
	var nodes []*ir.Node
	for _, n := range res.Graph.Nodes {
		require.NotEqual(t, ir.OpMaxPool2D, n.Op, "%s: a max-pool after batch norm is not folded", n.Text())
		if n.Op == ops.BatchNorm2D {
			require.NotNil(t, n.Attrs.Pool, n.Text())
			require.True(t, n.Attrs.NoArgmax, n.Text())
			require.Len(t, n.Outs, 1, n.Text())
			nodes = append(nodes, n)
		}
	}
	require.Len(t, nodes, 2)
	return nodes
}

// The evaluation graph's pooled normalisations (no argmax) on the CPU
// emulator against the reference with NaN-poisoned outputs, at batches 1
// and 3. Tolerance: as TestBatchNormPoolKernels's forward.
func TestBatchNormPoolEvalKernels(t *testing.T) {
	checkBNKernels(t, bnPoolEvalNodes(t), codegen.Options{Eval: true}, reference.NodeOptions{})
}

// Whole training steps of testdata/bnpool_odd.cnn on the CPU emulator
// against the reference.
func TestBatchNormPoolSteps(t *testing.T) {
	src, err := os.ReadFile("testdata/bnpool_odd.cnn")
	require.NoError(t, err)
	checkSteps(t, "bnpool_odd.cnn", src, 3, 4, 3)
}

// The pooled normalisation's and its gradient's kernels compile with nvcc
// for every target without spills or local memory, at the examples' batch
// 32, and so do the forward-only ones (no argmax) and vgg_small's at its
// batch 128.
func TestPtxasBatchNormPool(t *testing.T) {
	nvcc.Require(t)
	prog, err := codegen.GenerateNodes("T", bnPoolNodes(t, "testdata/bnpool_odd.cnn"), codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "bnpool.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
	prog, err = codegen.GenerateNodes("T", bnPoolEvalNodes(t), codegen.Options{Batch: 32, Eval: true})
	require.NoError(t, err)
	ks, err = codegen.CompilePtxas(prog.Source, "bnpool_eval.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
	// vgg_small's own (bn2, bn4, bn5: ReLU, 2x2 windows) at its batch 128
	src, err := os.ReadFile("../examples/vgg_small.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("vgg_small.cnn", src, compiler.Options{})
	require.NoError(t, err)
	var vgg []*ir.Node
	for _, n := range res.Graph.Nodes {
		if (n.Op == ops.BatchNorm2D || n.Op == ops.BatchNormGrad) && n.Attrs.Pool != nil {
			vgg = append(vgg, n)
		}
	}
	require.Len(t, vgg, 6, "bn2, bn4, bn5 and their gradients")
	prog, err = codegen.GenerateNodes("T", vgg, codegen.Options{Batch: 128})
	require.NoError(t, err)
	ks, err = codegen.CompilePtxas(prog.Source, "bnpool_vgg.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}
