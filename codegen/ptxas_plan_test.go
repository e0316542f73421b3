package codegen_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// The kernels of a micro-batched plan (micro-batch specialisations,
// accumulating weight gradients, the loss's accumulating variant, zero
// fills) compile for every target without spills or local memory.
func TestPtxasMicroBatchedPlan(t *testing.T) {
	nvcc.Require(t)
	res, _ := exampleProgram(t, "../examples/simplecnn.cnn", 32)
	for _, cfg := range []plan.Config{{Batch: 32, Budget: 40e6, Workspace: codegen.Workspace}, {Batch: 32, MicroBatch: 12, Workspace: codegen.Workspace}} {
		p, err := plan.Build(res.Graph, cfg)
		require.NoError(t, err)
		require.NotEmpty(t, p.Loops)
		prog, err := codegen.GenerateFromPlan(p, codegen.Options{Batch: 32, SourceName: "examples/simplecnn.cnn"})
		require.NoError(t, err)
		ks, err := codegen.CompilePtxas(prog.Source, "simplecnn.cu", nvcc.Targets)
		require.NoError(t, err)
		requireClean(t, prog, ks)
	}
}
