package planexec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
)

// The guide's model and budget, full size: SimpleCNN at batch 32 within
// 40 MB micro-batches its conv trunk, and one step of that plan on the
// float64 store gives the unplanned full-batch step's update; on an fp32
// arena of exactly the planned size it gives it within rounding. (About
// half a minute of float64 convolutions: skipped with -short.)
func TestSimpleCNN40MBStepEqualsFullBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("full-size SimpleCNN on the float64 reference")
	}
	res := compileFile(t, "../../../examples/simplecnn.cnn", compiler.Options{})
	p, err := plan.Build(res.Graph, plan.Config{Batch: 32, Budget: 40e6})
	require.NoError(t, err)
	require.LessOrEqual(t, p.PeakBytes, int64(40e6))
	require.Equal(t, "trunk", p.Choices.MicroBatched)

	ref := reference.New(res.Graph, 5)
	exact, err := New(p, Float64, ref)
	require.NoError(t, err)
	arena, err := New(p, Arena, ref)
	require.NoError(t, err)
	require.Len(t, arena.arena, int(p.ArenaBytes))
	b := pixelBatch(res.Graph, 32, rand.New(rand.NewPCG(8, 9)))
	want, err := ref.Run(b, reference.Train)
	require.NoError(t, err)
	for _, r := range []struct {
		runner *Runner
		tol    float64
	}{{exact, 1e-12}, {arena, 1e-4}} {
		got, err := r.runner.Run(b)
		require.NoError(t, err)
		assert.InDelta(t, want.Loss, got.Loss, r.tol*want.Loss)
		assert.Equal(t, want.Correct, got.Correct)
		params, state := r.runner.Params(), r.runner.State()
		for _, pr := range res.Graph.Params {
			assert.LessOrEqual(t, maxRelDiff(ref.Params[pr], params[pr.Name]), r.tol, pr.Name)
			for _, s := range pr.State {
				assert.LessOrEqual(t, maxRelDiff(ref.State[s], state[s.Name]), r.tol, s.Name)
			}
		}
		assert.False(t, math.IsNaN(got.Loss))
	}
	assert.Empty(t, exact.Mismatches)
	assert.Positive(t, exact.Recomputed)
}
