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
