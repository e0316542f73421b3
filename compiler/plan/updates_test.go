package plan_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/plan"
)

// Fused-first split updates (plan.UpdatesFusedFirst): within the budget
// the fewest updates are split out of their weight-gradient kernels; a
// budget that needs the splits keeps them; without a budget, under data
// parallelism and for a budget nothing meets, the plan is memory-first's.
func TestFusedFirstUpdates(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	minimal := build(t, g, plan.Config{Batch: 32})
	require.NotEmpty(t, minimal.Choices.SplitUpdates, "memory-first splits updates to write input gradients in place")
	allFused := len(minimal.Choices.SplitUpdates) + len(minimal.Choices.FusedUpdates)

	t.Run("a loose budget fuses every update", func(t *testing.T) {
		const budget = 64 << 20 // SimpleCNN's own
		mem := build(t, g, plan.Config{Batch: 32, Budget: budget})
		assert.Equal(t, minimal.PeakBytes, mem.PeakBytes, "memory-first: the minimal-memory plan, as without a budget")
		assert.Equal(t, minimal.Choices.SplitUpdates, mem.Choices.SplitUpdates)
		fused := build(t, g, plan.Config{Batch: 32, Budget: budget, Updates: plan.UpdatesFusedFirst})
		assert.Empty(t, fused.Choices.SplitUpdates)
		assert.Len(t, fused.Choices.FusedUpdates, allFused)
		assert.Equal(t, "fits", fused.Choices.Strategy)
		assert.LessOrEqual(t, fused.PeakBytes, int64(budget))
		assert.Greater(t, fused.PeakBytes, minimal.PeakBytes, "the fused updates cost the in-place input gradients' bytes")
		assert.Less(t, len(fused.Steps), len(mem.Steps), "each split update is a step of its own")
		minMem := build(t, g, plan.Config{Batch: 32, Budget: budget, Updates: plan.UpdatesMinMemory})
		assert.Equal(t, mem.PeakBytes, minMem.PeakBytes)
		assert.Equal(t, mem.Choices.SplitUpdates, minMem.Choices.SplitUpdates)
	})

	t.Run("a budget at the minimal peak keeps the splits", func(t *testing.T) {
		fused := build(t, g, plan.Config{Batch: 32, Budget: minimal.PeakBytes, Updates: plan.UpdatesFusedFirst})
		assert.Equal(t, "fits", fused.Choices.Strategy)
		assert.LessOrEqual(t, fused.PeakBytes, minimal.PeakBytes)
		assert.NotEmpty(t, fused.Choices.SplitUpdates)
		assert.Zero(t, fused.ExtraFLOPs, "no recomputation where splits alone meet the budget")
	})

	t.Run("between the two, the fewest splits that fit", func(t *testing.T) {
		loose := build(t, g, plan.Config{Batch: 32, Budget: 64 << 20, Updates: plan.UpdatesFusedFirst})
		budget := (minimal.PeakBytes + loose.PeakBytes) / 2
		fused := build(t, g, plan.Config{Batch: 32, Budget: budget, Updates: plan.UpdatesFusedFirst})
		assert.LessOrEqual(t, fused.PeakBytes, budget)
		assert.LessOrEqual(t, len(fused.Choices.SplitUpdates), len(minimal.Choices.SplitUpdates))
	})

	t.Run("a budget that needs recomputation still meets it", func(t *testing.T) {
		const budget = 40e6
		mem := build(t, g, plan.Config{Batch: 32, Budget: budget})
		fused := build(t, g, plan.Config{Batch: 32, Budget: budget, Updates: plan.UpdatesFusedFirst})
		assert.Equal(t, mem.Choices.Strategy, fused.Choices.Strategy)
		assert.LessOrEqual(t, fused.PeakBytes, int64(budget))
		assert.LessOrEqual(t, len(fused.Choices.SplitUpdates), len(mem.Choices.SplitUpdates))
	})

	t.Run("without a budget fused-first is memory-first", func(t *testing.T) {
		fused := build(t, g, plan.Config{Batch: 32, Updates: plan.UpdatesFusedFirst})
		assert.Equal(t, minimal.PeakBytes, fused.PeakBytes)
		assert.Equal(t, minimal.Choices.SplitUpdates, fused.Choices.SplitUpdates)
	})

	t.Run("data parallelism splits every update", func(t *testing.T) {
		p := build(t, g, plan.Config{Batch: 64, Ranks: 2, Budget: 1 << 30, Updates: plan.UpdatesFusedFirst})
		assert.Empty(t, p.Choices.FusedUpdates)
		assert.Len(t, p.Choices.SplitUpdates, allFused)
	})

	t.Run("a budget nothing meets fails as memory-first", func(t *testing.T) {
		_, errMem := plan.Build(g, plan.Config{Batch: 32, Budget: 1e6})
		_, errFused := plan.Build(g, plan.Config{Batch: 32, Budget: 1e6, Updates: plan.UpdatesFusedFirst})
		var be *plan.BudgetError
		require.True(t, errors.As(errMem, &be))
		require.Error(t, errFused)
		assert.Equal(t, errMem.Error(), errFused.Error())
	})
}
