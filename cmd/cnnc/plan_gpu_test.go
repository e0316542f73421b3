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
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--json", mnist)
	require.Equal(t, 0, code, errOut)
	var p struct {
		GPU       string  `json:"gpu"`
		Step      float64 `json:"predicted_step_seconds"`
		PeakBytes int64   `json:"peak_bytes"`
		Note      string  `json:"note"`
		Launches  []struct {
			Kernel  string  `json:"kernel"`
			Bound   string  `json:"bound"`
			Seconds float64 `json:"predicted_seconds"`
		} `json:"launches"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, "H200 SXM", p.GPU)
	assert.Positive(t, p.PeakBytes)
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

	code, _, errOut = cnnc("plan", "--gpu", "v100", mnist)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown GPU "v100" (known: a100, h100, h200, l4, rtx4090)`)
}
