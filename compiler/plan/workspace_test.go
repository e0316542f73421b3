package plan_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
)

// Kernel scratch memory is planned: one workspace buffer per step that
// needs it, live during that step only, inside the arena (so the arena
// the trainer allocates is still the planned peak).
func TestWorkspaceBuffersAreLiveInTheirStepOnly(t *testing.T) {
	res := compileFile(t, "../../examples/simplecnn.cnn")
	const scratch = 1 << 20
	ws := func(n *ir.Node, samples int64) int64 {
		if n.Op == ir.OpLinearBlockGradInput || n.Op == ir.OpConvBlockGradWeight {
			return scratch
		}
		return 0
	}
	without := build(t, res.Graph, plan.Config{Batch: 32})
	with := build(t, res.Graph, plan.Config{Batch: 32, Workspace: ws})
	require.NoError(t, with.Check())
	steps := 0
	for _, s := range with.Steps {
		if s.Workspace < 0 {
			continue
		}
		steps++
		b := with.Buffers[s.Workspace]
		assert.Equal(t, plan.CatWorkspace, b.Category)
		assert.Equal(t, s.Index, b.FirstStep)
		assert.Equal(t, s.Index, b.LastStep)
		assert.GreaterOrEqual(t, b.Bytes, int64(scratch))
		assert.LessOrEqual(t, b.Offset+b.Bytes, with.ArenaBytes)
	}
	assert.Equal(t, 3, steps, "fc1 grad_input (fc2's is inside the classifier tail, linear_cross_entropy); conv1, conv2 grad_weight")
	assert.GreaterOrEqual(t, with.PeakBytes, without.PeakBytes)
	assert.Equal(t, with.PeakBytes, with.ArenaBytes)
}
