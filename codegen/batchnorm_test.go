package codegen_test

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
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
