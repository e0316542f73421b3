package codegen_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// The classifier tail's kernel (linear_cross_entropy: logits, loss, correct count, input gradient
// with and without its mask, weight and bias gradients written or fed to each optimizer) on the
// emulator against the float64 reference, outputs NaN-poisoned, at batches 1, 3 and 37 (37: more
// rows than a warp, and 700 inputs staged 5 rows at a time).
//
// Tolerance: kernelcheck.Tolerance (1e-4 of the tensor's largest magnitude). Each sum is a
// sequential FP32 FMA chain: the logits over at most 700 inputs, dW over at most 37 rows, dX over
// at most 33 classes, of products of values in [-1, 1): a relative error of at most K·2^-24 ≈
// 4.2e-5 of the magnitudes' sum (K = 700), and about 4·sqrt(K)·2^-24 ≈ 6.3e-6 of it for random
// signs; the loss adds a few ulp from expf and logf per row.
func TestLinearCrossEntropyKernels(t *testing.T) {
	for _, batch := range []int64{1, 3, 37} {
		var checks []kernelCheck
		for _, c := range kernelcases.LinearCrossEntropyChecks(t) {
			checks = append(checks, kernelCheck{name: c.Name, n: c.N, o: c.O})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// Every linear_cross_entropy kernel of the cases one block holds, and SimpleCNN's fc2 tail, at
// batches 32 and 256 compiles with ptxas for every target without spills or a stack frame.
func TestLinearCrossEntropyKernelsPtxas(t *testing.T) {
	nvcc.Require(t)
	for _, batch := range []int64{32, 256} {
		g := ir.NewGraph("T")
		var nodes []*ir.Node
		cases := append(kernelcases.LinearCrossEntropyCases(), kernelcases.LinearCrossEntropy{In: 128, Out: 10, Bias: true, InputGrad: true, MaskOut: true, Opt: kernelcases.Optimizers[1]})
		for i, c := range cases {
			if ops.LinearCrossEntropyXRows(batch, c.In, c.Out) == 0 {
				continue // one block's shared memory does not hold it
			}
			nodes = append(nodes, kernelcases.LinearCrossEntropyNode(t, g, "tail"+string(rune('a'+i)), c))
		}
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		ks, err := codegen.CompilePtxas(prog.Source, "linear_ce.cu", nvcc.Targets)
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
}
