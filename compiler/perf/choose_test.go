package perf

import (
	"strings"
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

// The choice's listing names each plan's split updates and puts the
// minimal-memory plan (the planner's own, first) beside the chosen one.
func TestWriteChoiceShowsTheMinimalMemoryPlan(t *testing.T) {
	ch := &Choice{Considered: []Considered{
		{Strategy: "fits", How: "no recomputation, no micro-batching", PeakBytes: 47_373_828, Launches: 19,
			SplitUpdates: []string{"fc2", "conv2"}, FusedUpdates: []string{"fc1", "conv1"}, PredictedStepSeconds: 147.6e-6},
		{Strategy: "fits", How: "no recomputation, no micro-batching", PeakBytes: 55_066_116, Launches: 15,
			FusedUpdates: []string{"fc2", "fc1", "conv2", "conv1"}, PredictedStepSeconds: 141.3e-6},
	}}
	best := fastest(ch.Considered)
	assert.Equal(t, 1, best)
	ch.Considered[best].Chosen = true
	var b strings.Builder
	ch.WriteChoice(&b, "H200 SXM", 64<<20)
	out := b.String()
	assert.Contains(t, out, "19 launches      147.6 µs  no recomputation, no micro-batching; split updates: fc2, conv2\n")
	assert.Contains(t, out, "* fits        peak    55.07 MB    15 launches      141.3 µs  no recomputation, no micro-batching; every update fused\n")
	assert.Contains(t, out, "minimal-memory plan (the planner's own, as without --gpu; --min-memory keeps it): peak 47.37 MB, 147.6 µs; chosen: peak 55.07 MB, 141.3 µs\n")
}
