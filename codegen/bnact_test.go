package codegen_test

import (
	"os"
	"strings"
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

// bnActNodes compiles testdata/bnact_odd.cnn and returns its batch norm
// normalisations and gradients with an activation folded in (Attrs.Act):
// every activation but ReLU, each twice, and no standalone one left.
func bnActNodes(t *testing.T, path string) []*ir.Node {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnact_odd.cnn", src, compiler.Options{})
	require.NoError(t, err)
	var nodes []*ir.Node
	acts := map[string]int{}
	for _, n := range res.Graph.Nodes {
		require.Nil(t, ops.PointwiseOf(n.Op), "%s: an activation after batch norm is not folded", n.Text())
		if n.Attrs.Act != 0 {
			nodes = append(nodes, n)
			acts[n.Attrs.Act.String()]++
		}
	}
	require.Equal(t, map[string]int{"leaky_relu": 2, "sigmoid": 2, "tanh": 2, "gelu": 2, "silu": 2, "hardswish": 2}, acts,
		"each activation's normalisation and gradient")
	return nodes
}

// Batch norm's normalisation with each activation folded in, and the
// gradient that recomputes z and applies the activation's derivative, on
// the CPU emulator against the float64 reference with NaN-poisoned
// outputs, at batches 1 and 3 on odd shapes (5 and 4 channels of 7x5
// maps, 9, 8 and 7 features; affine and not). Tolerance:
// kernelcheck.Tolerance — per element the normalisation's four operations
// and the activation's formula (a few ulps of expf/erff/tanhf); the
// gradient's sums run over at most 3·35 values.
func TestBatchNormActKernels(t *testing.T) {
	checkBNKernels(t, bnActNodes(t, "testdata/bnact_odd.cnn"), codegen.Options{}, reference.NodeOptions{Training: true, Update: true})
}

// Whole training steps with each activation folded into batch norm
// (kernelcases.BNActModel: bnrelu_odd.cnn's network with the activation
// in ReLU's place) on the CPU emulator against the reference.
func TestBatchNormActSteps(t *testing.T) {
	for _, act := range kernelcases.BNActs {
		name := strings.Split(act, "(")[0]
		t.Run(name, func(t *testing.T) {
			checkSteps(t, name+".cnn", []byte(kernelcases.BNActModel(act)), 3, 4, 3)
		})
	}
}

// The same kernels (the normalisation with each activation, and the
// gradient's three passes recomputing z) compile with nvcc for every
// target without spills or local memory, at the examples' batch 32.
func TestPtxasBatchNormAct(t *testing.T) {
	nvcc.Require(t)
	prog, err := codegen.GenerateNodes("T", bnActNodes(t, "testdata/bnact_odd.cnn"), codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "bnact.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}
