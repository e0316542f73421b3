package codegen_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// The kernels of a micro-batched plan (micro-batch specialisations,
// accumulating weight gradients, the loss's accumulating variant, zero
// fills) compile for every target without spills or local memory.
func TestPtxasMicroBatchedPlan(t *testing.T) {
	nvcc.Require(t)
	res, _ := exampleProgram(t, "../examples/simplecnn.cnn", 32)
	for _, cfg := range []plan.Config{{Budget: 40e6}, {MicroBatch: 12}} {
		c, err := driver.Compile(res, cfg, driver.CUDA)
		require.NoError(t, err)
		require.NotEmpty(t, c.Plan.Loops)
		prog := c.Train
		ks, err := codegen.CompilePtxas(prog.Source, "simplecnn.cu", nvcc.Targets)
		require.NoError(t, err)
		requireClean(t, prog, ks)
	}
}
