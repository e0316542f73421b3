package schedule_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/torchtest"
	"github.com/cnnc/cnnc/runtime/schedule"
)

// Values worked out by hand from PyTorch's documented formulas.
func TestScheduleByHand(t *testing.T) {
	const base = 0.1
	at := func(s schedule.Schedule, step int64) float64 { return s.LR(base, step, 10, 5) }
	st := schedule.Schedule{Kind: schedule.Step, Every: 2, Gamma: 0.5}
	assert.Equal(t, base, at(st, 19))      // epoch 1
	assert.Equal(t, base*0.5, at(st, 20))  // epoch 2
	assert.Equal(t, base*0.25, at(st, 49)) // epoch 4
	ms := schedule.Schedule{Kind: schedule.MultiStep, Milestones: []int{1, 3}, Gamma: 0.1}
	assert.Equal(t, base, at(ms, 9))
	assert.InDelta(t, base*0.1, at(ms, 10), 1e-15*base)
	assert.InDelta(t, base*0.1, at(ms, 29), 1e-15*base)
	assert.InDelta(t, base*0.01, at(ms, 30), 1e-15*base)
	cos := schedule.Schedule{Kind: schedule.Cosine, EtaMin: 0.001}
	assert.Equal(t, base, at(cos, 9))                                                          // epoch 0: the base
	assert.InDelta(t, 0.001+(base-0.001)*(1+math.Cos(math.Pi*2/5))/2, at(cos, 25), 1e-15*base) // epoch 2 of T_max 5
	oc := schedule.Schedule{Kind: schedule.OneCycle}                                           // 50 steps: warm-up phase ends at 0.3*50-1 = 14
	assert.InDelta(t, base/25, at(oc, 0), 1e-15*base)
	assert.InDelta(t, base, at(oc, 14), 1e-15*base)
	assert.InDelta(t, base/25/1e4, at(oc, 49), 1e-15*base)
	w := schedule.Schedule{Warmup: 4}
	assert.InDelta(t, base/4, at(w, 0), 1e-15*base)
	assert.InDelta(t, base*(0.25+0.75*3/4.0), at(w, 3), 1e-15*base)
	assert.Equal(t, base, at(w, 4))
	assert.True(t, schedule.Schedule{}.IsConstant())
	assert.False(t, w.IsConstant())
	assert.Equal(t, "cosine(eta_min=0.001), warmup 4 steps", schedule.Schedule{Kind: schedule.Cosine, EtaMin: 0.001, Warmup: 4}.String())
	assert.Equal(t, "multistep(milestones=[1, 3], gamma=0.1)", ms.String())
}

func TestOneCycleChecksItsSteps(t *testing.T) {
	oc := schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.1}
	require.NoError(t, oc.Check(10, 3))
	assert.ErrorContains(t, oc.Check(5, 2), "pct_start 0.1 of 10 steps is one step")
	assert.ErrorContains(t, oc.Check(5, 0), "has none")
	assert.NoError(t, schedule.Schedule{Kind: schedule.Step, Every: 1}.Check(5, 0))
}

// Runs is every kind of schedule, with and without warmup (spanning an
// epoch boundary, and inside the first epoch where cosine's eta_min > 0
// needs it: see LR), on odd epoch lengths.
func Runs() []torchtest.ScheduleRun {
	return []torchtest.ScheduleRun{
		{Name: "constant", Schedule: schedule.Schedule{}, Base: 0.05, PerEpoch: 7, Epochs: 3},
		{Name: "warmup only", Schedule: schedule.Schedule{Warmup: 10}, Base: 0.05, PerEpoch: 7, Epochs: 3},
		{Name: "step", Schedule: schedule.Schedule{Kind: schedule.Step, Every: 2, Gamma: 0.1}, Base: 0.1, PerEpoch: 5, Epochs: 7},
		{Name: "step warmup across epochs", Schedule: schedule.Schedule{Kind: schedule.Step, Every: 1, Gamma: 0.5, Warmup: 12}, Base: 0.1, PerEpoch: 5, Epochs: 6},
		{Name: "multistep", Schedule: schedule.Schedule{Kind: schedule.MultiStep, Milestones: []int{2, 5, 6}, Gamma: 0.3}, Base: 0.2, PerEpoch: 4, Epochs: 8},
		{Name: "multistep warmup", Schedule: schedule.Schedule{Kind: schedule.MultiStep, Milestones: []int{1, 3}, Gamma: 0.1, Warmup: 6}, Base: 0.2, PerEpoch: 4, Epochs: 5},
		{Name: "cosine", Schedule: schedule.Schedule{Kind: schedule.Cosine}, Base: 0.1, PerEpoch: 3, Epochs: 11},
		{Name: "cosine eta_min warmup", Schedule: schedule.Schedule{Kind: schedule.Cosine, EtaMin: 0.004, Warmup: 3}, Base: 0.1, PerEpoch: 5, Epochs: 9},
		{Name: "cosine t_max beyond", Schedule: schedule.Schedule{Kind: schedule.Cosine, EtaMin: 0.01, TMax: 4}, Base: 0.1, PerEpoch: 3, Epochs: 11},
		{Name: "cosine warmup across epochs", Schedule: schedule.Schedule{Kind: schedule.Cosine, Warmup: 8}, Base: 0.1, PerEpoch: 3, Epochs: 6},
		{Name: "onecycle", Schedule: schedule.Schedule{Kind: schedule.OneCycle}, Base: 0.1, PerEpoch: 9, Epochs: 5},
		{Name: "onecycle options", Schedule: schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.45, DivFactor: 10, FinalDivFactor: 100, LinearAnneal: true}, Base: 0.3, PerEpoch: 7, Epochs: 3},
		{Name: "onecycle short warm-up", Schedule: schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.05}, Base: 0.1, PerEpoch: 4, Epochs: 3},
	}
}

// Every schedule gives PyTorch's rate at every step. Tolerance: PyTorch
// multiplies the rate by a ratio at each step (cosine: a ratio of
// 1+cos terms), each product rounded to float64; over at most 60 steps
// that is < 60·4·2^-53 ≈ 3e-14 of the base rate, so 1e-12·base holds
// with room, and is 10^-5 of the rate's smallest relevant change
// (onecycle's lowest rate is 4e-6 of the base).
func TestScheduleIsPyTorchs(t *testing.T) {
	runs := Runs()
	want, version := torchtest.ScheduleLRs(t, runs)
	for _, r := range runs {
		w := want[r.Name]
		require.Len(t, w, r.PerEpoch*r.Epochs, r.Name)
		require.NoError(t, r.Schedule.Check(r.PerEpoch, r.Epochs))
		for step, lr := range w {
			got := r.Schedule.LR(r.Base, int64(step), r.PerEpoch, r.Epochs)
			if !assert.InDelta(t, lr, got, 1e-12*r.Base, "%s (%s): step %d", r.Name, r.Schedule, step) {
				break
			}
		}
	}
	t.Logf("%d schedules equal torch %s's rates at every step", len(runs), version)
}
