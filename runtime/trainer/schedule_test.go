package trainer_test

import (
	"bytes"
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/torchtest"
	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/schedule"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// withSchedule is m with spec's schedule replaced (the kernels are the
// same: the rate is a run-time argument).
func withSchedule(m *trainertest.Model, s schedule.Schedule) *trainertest.Model {
	spec := *m.Spec
	spec.Schedule = s
	return &trainertest.Model{Spec: &spec, Kernels: m.Kernels, Backends: m.Backends}
}

// A Model trains with its spec's schedule: every step's rate, in a whole
// run and in one stopped after 5 steps (inside an epoch), saved, loaded
// into a new model and trained on, is the rate PyTorch's scheduler gives
// that step (scripts/torch_lr_schedule.py), and both runs end with the
// same parameters. The kernels take the float32 of the rate: it is within
// half a float32 ulp (2^-24 relative) of PyTorch's float64, plus the
// recursion's rounding (see runtime/schedule's test: 1e-12 of the base).
func TestScheduleAcrossResumeIsPyTorchs(t *testing.T) {
	tiny := trainertest.Tiny(t)
	ds := trainertest.Data(tiny.Spec, 12, 3) // 3 batches per epoch
	const epochs = 4
	base := float64(float32(0.05)) // the session's base rate is a float32
	runs := []torchtest.ScheduleRun{
		{Name: "cosine warmup", Schedule: schedule.Schedule{Kind: schedule.Cosine, EtaMin: 0.001, Warmup: 2}, Base: base, PerEpoch: 3, Epochs: epochs},
		{Name: "multistep", Schedule: schedule.Schedule{Kind: schedule.MultiStep, Milestones: []int{1, 3}, Gamma: 0.5}, Base: base, PerEpoch: 3, Epochs: epochs},
		{Name: "step warmup", Schedule: schedule.Schedule{Kind: schedule.Step, Every: 2, Gamma: 0.1, Warmup: 5}, Base: base, PerEpoch: 3, Epochs: epochs},
		{Name: "onecycle", Schedule: schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.3}, Base: base, PerEpoch: 3, Epochs: epochs},
	}
	want, version := torchtest.ScheduleLRs(t, runs)
	for _, r := range runs {
		t.Run(r.Name, func(t *testing.T) {
			m := withSchedule(tiny, r.Schedule)
			var whole []float32
			a := newModel(t, m, trainer.Options{Seed: 3, LR: base, Epochs: epochs, OnStep: func(s trainer.StepMetrics) { whole = append(whole, s.LR) }})
			require.NoError(t, a.Train(context.Background(), ds))

			var resumed []float32
			collect := func(s trainer.StepMetrics) { resumed = append(resumed, s.LR) }
			b := newModel(t, m, trainer.Options{Seed: 3, LR: base, Epochs: epochs, MaxSteps: 5, OnStep: collect})
			require.NoError(t, b.Train(context.Background(), ds))
			var saved bytes.Buffer
			require.NoError(t, b.Save(&saved))
			c := newModel(t, m, trainer.Options{Seed: 3, Epochs: epochs, OnStep: collect}) // the base rate comes from the checkpoint
			require.NoError(t, c.Load(&saved))
			require.NoError(t, c.Train(context.Background(), ds))

			require.Len(t, whole, len(want[r.Name]))
			assert.Equal(t, whole, resumed, "the resumed run's rates")
			for i, lr := range want[r.Name] {
				assert.InDelta(t, lr, float64(whole[i]), math.Abs(lr)*0x1p-24+1e-12*base, "step %d", i)
			}
			sameState(t, a.Session(), c.Session())
		})
	}
	t.Logf("rates of %d schedules equal torch %s's, resumed or not", len(runs), version)
}

// The scheduled rate is what the kernels use: one step at the schedule's
// first rate (onecycle: base/25) updates the parameters exactly as a
// session whose constant rate is that number.
func TestScheduledRateReachesTheKernels(t *testing.T) {
	tiny := trainertest.Tiny(t)
	ds := trainertest.Data(tiny.Spec, 12, 1) // 4 epochs of 3 steps: the warm-up phase ends at step 0.3·12-1
	oc := withSchedule(tiny, schedule.Schedule{Kind: schedule.OneCycle})
	scheduled := newModel(t, oc, trainer.Options{Seed: 2, LR: 0.5, Epochs: 4, MaxSteps: 1, NoShuffle: true})
	require.NoError(t, scheduled.Train(context.Background(), ds))
	assert.Equal(t, float32(0.5), scheduled.Session().LR, "the base rate stays")
	assert.Equal(t, float32(0.5/25), scheduled.Session().StepLR())

	plain := newModel(t, tiny, trainer.Options{Seed: 2, LR: float64(float32(0.5 / 25)), Epochs: 4, MaxSteps: 1, NoShuffle: true})
	require.NoError(t, plain.Train(context.Background(), ds))
	sameState(t, scheduled.Session(), plain.Session())
}

// A run too short for onecycle's warm-up phase is refused before it
// starts, as PyTorch would divide by zero.
func TestLoopChecksTheSchedule(t *testing.T) {
	tiny := trainertest.Tiny(t)
	m := withSchedule(tiny, schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.25})
	mod := newModel(t, m, trainer.Options{Epochs: 2}) // 2 epochs of 2 steps: 0.25 of 4 steps is one
	err := mod.Train(context.Background(), trainertest.Data(tiny.Spec, 8, 1))
	assert.ErrorContains(t, err, "learning-rate schedule: onecycle: pct_start 0.25 of 4 steps is one step")
}

// A rate that changes every step reaches the replayed graphs through the
// step's scalar block, without a graph update, and the parameters equal
// those of kernel-by-kernel steps at the same rates.
func TestScheduledRatesReachTheGraph(t *testing.T) {
	m := trainertest.Tiny(t)
	gd := newPipelined(t, m)
	g, err := trainer.NewSession(m.Spec, gd, 2)
	require.NoError(t, err)
	defer g.Close()
	g.UseGraphs = true
	plain := m.Session(t, 2)
	s := schedule.Schedule{Kind: schedule.OneCycle}
	for i, b := range someBatches(m, 5) {
		lr := float32(s.LR(0.1, int64(i), 5, 1))
		g.SetStepLR(lr)
		plain.SetStepLR(lr)
		stepAlike(t, g, plain, []trainer.Batch{b})
	}
	assert.Equal(t, trainer.PipelineDepth, gd.captures, "one graph per staging slot")
	assert.Equal(t, 4, gd.replays, "every step after the first")
	assert.Zero(t, gd.updates)
	sameState(t, plain, g)
}
