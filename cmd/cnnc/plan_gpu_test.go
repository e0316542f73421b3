package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/nvcc"
)

func TestPlanGPUPredictsTheStep(t *testing.T) {
	nvcc.Require(t)
	const mnist = "../../examples/mnist.cnn"
	// under a budget (MNIST's peak is 2.03 MB) the model chooses among the
	// plans that meet it and says what the budget costs
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--json", "--memory-budget", "1.8MB", mnist)
	require.Equal(t, 0, code, errOut)
	type considered struct {
		Strategy  string  `json:"strategy"`
		PeakBytes int64   `json:"peak_bytes"`
		Step      float64 `json:"predicted_step_seconds"`
		Chosen    bool    `json:"chosen"`
	}
	var p struct {
		GPU        string       `json:"gpu"`
		Step       float64      `json:"predicted_step_seconds"`
		PeakBytes  int64        `json:"peak_bytes"`
		Strategy   string       `json:"strategy"`
		Note       string       `json:"note"`
		BudgetCost float64      `json:"budget_cost_seconds"`
		Alts       []considered `json:"alternatives"`
		Unbudgeted *considered  `json:"unbudgeted"`
		Launches   []struct {
			Kernel  string  `json:"kernel"`
			Bound   string  `json:"bound"`
			Seconds float64 `json:"predicted_seconds"`
		} `json:"launches"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, "H200 SXM", p.GPU)
	assert.Positive(t, p.PeakBytes)
	assert.LessOrEqual(t, p.PeakBytes, int64(1_800_000))
	require.NotEmpty(t, p.Alts)
	chosen := 0
	for _, a := range p.Alts {
		assert.LessOrEqual(t, a.PeakBytes, int64(1_800_000), a.Strategy)
		assert.GreaterOrEqual(t, a.Step, p.Step, "the chosen plan is the fastest")
		if a.Chosen {
			chosen++
			assert.Equal(t, p.Step, a.Step)
			assert.Equal(t, p.PeakBytes, a.PeakBytes)
			assert.Equal(t, p.Strategy, a.Strategy)
		}
	}
	assert.Equal(t, 1, chosen)
	require.NotNil(t, p.Unbudgeted)
	assert.Equal(t, "fits", p.Unbudgeted.Strategy)
	assert.Greater(t, p.Unbudgeted.PeakBytes, int64(1_800_000))
	assert.InDelta(t, p.Step-p.Unbudgeted.Step, p.BudgetCost, 1e-12)
	assert.Contains(t, p.Note, "prediction")
	require.NotEmpty(t, p.Launches)
	sum := 0.0
	for _, l := range p.Launches {
		assert.NotEmpty(t, l.Bound, l.Kernel)
		sum += l.Seconds
	}
	assert.Greater(t, p.Step, sum, "the step adds the graph launch to the launches")

	code, out, errOut = cnnc("plan", "--gpu", "A100", mnist)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "on A100 SXM4 80GB — a PREDICTION")
	assert.Contains(t, out, "predicted_step_seconds")
	assert.NotContains(t, out, "Plans that meet", "no budget, no choice")

	code, _, errOut = cnnc("plan", "--gpu", "v100", mnist)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown GPU "v100" (known: a100, h100, h200, l4, rtx4090)`)
}
