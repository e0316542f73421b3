package codegen_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// The conv2d -> tanh -> avgpool2d block's kernels (forward with and
// without the saved tanh output, input gradient, weight gradient reading
// t or recomputing it) against the reference on odd shapes, outputs
// NaN-poisoned, at batches 1 and 3.
func TestConvTanhPoolKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range kernelcases.ConvPoolChecks(t) {
			checks = append(checks, kernelCheck{name: c.Name, n: c.N, o: c.O})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// Every conv2d_tanh_avgpool kernel of the cases (with LeNet-5's two blocks
// and the longest weight row fused, at batch 64) compiles with ptxas for every target without spills or a
// stack frame.
func TestConvTanhPoolKernelsPtxas(t *testing.T) {
	nvcc.Require(t)
	var nodes []*ir.Node
	for _, c := range kernelcases.ConvTanhPoolPtxasCases() {
		nodes = append(nodes, kernelcases.ConvPoolNodes(t, c)...)
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 64})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "conv_pool.cu", nvcc.Targets)
	require.NoError(t, err)
	reported := map[string]int{}
	for _, k := range ks {
		reported[k.Name]++
		require.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
		t.Log(k)
	}
	for _, name := range prog.KernelNames() {
		require.Equal(t, len(nvcc.Targets), reported[name], "ptxas reports on %s for every target", name)
	}
}
