package plan_test

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/dsl"
)

func compileBN(t *testing.T) *compiler.Result {
	t.Helper()
	src, err := os.ReadFile("testdata/bn.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("bn.cnn", src, compiler.Options{})
	require.NoError(t, err)
	return res
}

// Batch norm's statistics write its running buffers: recomputation never
// runs them again. A batch norm's input may be dropped and recomputed (its
// gradient then reads the recomputed input with the saved statistics;
// planexec's TestRecomputeIsBitIdentical checks that this is exact).
func TestBatchNormStatisticsAreNeverRecomputed(t *testing.T) {
	res := compileBN(t)
	base, err := plan.Build(res.Graph, plan.Config{Batch: 6})
	require.NoError(t, err)
	// tighter and tighter budgets, as long as recomputation meets them
	var plans int
	bnInput := false
	var p *plan.Plan
	for budget := base.ArenaBytes - 1; ; budget -= base.ArenaBytes / 50 {
		q, err := plan.Build(res.Graph, plan.Config{Batch: 6, Budget: budget})
		if err != nil || q.Choices.Strategy != "recompute" {
			break
		}
		p = q
		plans++
		for _, s := range q.Steps {
			if !s.Recompute {
				continue
			}
			assert.NotEqual(t, ops.BatchNormStats.String(), s.Kernel, "step %d recomputes %s", s.Index, s.Text)
			bnInput = bnInput || s.Layer == "c1"
		}
	}
	require.Positive(t, plans, "recomputation meets a budget below the peak")
	assert.True(t, bnInput, "bn1's input c1 is recomputed (the tightest plan recomputes %v)", p.Choices.Recompute)
	assert.NotEmpty(t, p.ModelBuffers)
	for _, b := range p.Buffers {
		if b.Category == plan.CatBuffer {
			assert.True(t, b.Persistent, b.Name)
		}
	}
}

// No micro-batch loop crosses a batch norm: asked for one, the planner
// names the layer; a budget only such a loop would meet fails naming it.
func TestBatchNormIsNeverMicroBatchedAcross(t *testing.T) {
	res := compileBN(t)
	_, err := plan.Build(res.Graph, plan.Config{Batch: 6, MicroBatch: 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bn1 (batchnorm_stats at bn.cnn:8:11) computes statistics over the whole batch")
	_, err = plan.Build(res.Graph, plan.Config{Batch: 6, MicroBatch: 2, Trunk: "r1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bn1 (batchnorm_stats")

	// a budget above the parameters' bytes that only micro-batching
	// through the batch norms could meet
	_, err = plan.Build(res.Graph, plan.Config{Batch: 6, Budget: 1})
	var be *plan.BudgetError
	require.True(t, errors.As(err, &be), "%v", err)
	_, err = plan.Build(res.Graph, plan.Config{Batch: 6, Budget: be.Persistent + 256, BudgetPos: dsl.Pos{File: "bn.cnn", Line: 19, Col: 5}})
	require.True(t, errors.As(err, &be), "%v", err)
	out := be.Diagnostic().Render(nil)
	assert.Contains(t, out, "micro-batches cannot cross bn1 (batchnorm_stats at bn.cnn:8:11)")
}

// Without a budget the planner recomputes a batch norm's normalisation and
// the activation after it from the saved conv output and batch statistics
// (cheap recomputation, cheap.go) instead of saving them: the plan is
// smaller than the one that recomputes nothing, recomputes only
// memory-bound kernels (never the statistics, never a conv), and each
// recomputed value reads the saved statistics. planexec's
// TestRecomputeIsBitIdentical runs this plan (case "bn relu fits") and
// requires the recomputed values to be the forward pass's bit for bit.
func TestBatchNormNormalisationIsRecomputedNotSaved(t *testing.T) {
	src, err := os.ReadFile("testdata/bnrelu.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnrelu.cnn", src, compiler.Options{})
	require.NoError(t, err)
	cfg := plan.Config{Batch: res.Train.Batch}
	p, err := plan.Build(res.Graph, cfg)
	require.NoError(t, err)
	cfg.NoRecompute = true
	saving, err := plan.Build(res.Graph, cfg)
	require.NoError(t, err)
	assert.Empty(t, saving.Choices.Recompute)
	assert.Less(t, p.ArenaBytes, saving.ArenaBytes, "recomputing the normalisation lowers the peak")
	assert.Equal(t, "fits", p.Choices.Strategy)
	assert.Contains(t, p.Choices.Recompute, "bn1")
	assert.Contains(t, p.Choices.Recompute, "r1")
	cheapKernels := map[string]bool{"batchnorm2d": true, "relu": true, "hardswish": true, "maxpool2d": true}
	var normalised int
	for _, s := range p.Steps {
		if !s.Recompute {
			continue
		}
		assert.True(t, cheapKernels[s.Kernel], "step %d recomputes %s, not a memory-bound kernel", s.Index, s.Text)
		if s.Kernel == "batchnorm2d" {
			normalised++
			assert.Contains(t, s.Text, s.Layer+".mean, %"+s.Layer+".invstd", "the saved batch statistics")
		}
	}
	assert.Positive(t, normalised)
	assert.Positive(t, p.ExtraFLOPs)
	assert.Less(t, float64(p.ExtraFLOPs), 0.05*float64(p.FLOPs), "memory-bound work only")
}
