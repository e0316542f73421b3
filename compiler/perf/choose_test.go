package perf

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The fastest predicted step wins, whatever the planner's order; equal
// steps go to the smaller peak, then to the planner's own choice (first).
func TestFastestAlternative(t *testing.T) {
	planner := Considered{Strategy: "recompute", PeakBytes: 40e6, PredictedStepSeconds: 900e-6}
	micro := Considered{Strategy: "micro-batch", PeakBytes: 39e6, PredictedStepSeconds: 700e-6}
	assert.Equal(t, 1, fastest([]Considered{planner, micro}))
	micro.PredictedStepSeconds = 950e-6
	assert.Equal(t, 0, fastest([]Considered{planner, micro}))
	micro.PredictedStepSeconds = planner.PredictedStepSeconds
	assert.Equal(t, 1, fastest([]Considered{planner, micro}), "a tie goes to the smaller peak")
	micro.PeakBytes = planner.PeakBytes
	assert.Equal(t, 0, fastest([]Considered{planner, micro}), "then to the planner's choice")
	assert.Equal(t, 0, fastest([]Considered{planner}))
}

// A data-parallel rank is judged by its step with the collectives: a plan
// whose launches are slower but hide the all-reduces better wins.
func TestFastestDataParallelStep(t *testing.T) {
	hides := Considered{Strategy: "recompute", PeakBytes: 40e6, PredictedStepSeconds: 900e-6, DataParallelStepSeconds: 950e-6}
	exposes := Considered{Strategy: "micro-batch", PeakBytes: 40e6, PredictedStepSeconds: 800e-6, DataParallelStepSeconds: 1100e-6}
	assert.Equal(t, 0, fastest([]Considered{hides, exposes}))
	assert.Equal(t, 1, fastest([]Considered{exposes, hides}))
	exposes.DataParallelStepSeconds = 0 // no fabric: the launches' step
	assert.Equal(t, 800e-6, exposes.step())
}
