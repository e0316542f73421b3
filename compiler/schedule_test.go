package compiler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/schedule"
)

const scheduleModel = header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n"

func TestSchedules(t *testing.T) {
	for _, c := range []struct {
		train string
		want  schedule.Schedule
		lr    float64
	}{
		{"schedule = step(every=30)", schedule.Schedule{Kind: schedule.Step, Every: 30, Gamma: 0.1}, 0.01},
		{"schedule = step(every=2, gamma=0.5)\n  warmup = 100", schedule.Schedule{Kind: schedule.Step, Every: 2, Gamma: 0.5, Warmup: 100}, 0.01},
		{"schedule = multistep(milestones=[30, 60], gamma=0.2)", schedule.Schedule{Kind: schedule.MultiStep, Milestones: []int{30, 60}, Gamma: 0.2}, 0.01},
		{"schedule = cosine()", schedule.Schedule{Kind: schedule.Cosine}, 0.01},
		{"schedule = cosine(eta_min=1e-4, t_max=20)\n  optimizer = adam(lr=0.003)", schedule.Schedule{Kind: schedule.Cosine, EtaMin: 1e-4, TMax: 20}, 0.003},
		{"warmup = 500", schedule.Schedule{Warmup: 500}, 0.01},
		{"schedule = onecycle(max_lr=0.1, pct_start=0.25)", schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.25, DivFactor: 25, FinalDivFactor: 1e4}, 0.1},
		{"schedule = onecycle(max_lr=0.2, div_factor=10, final_div_factor=100, anneal_strategy=\"linear\", cycle_momentum=false)",
			schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.3, DivFactor: 10, FinalDivFactor: 100, LinearAnneal: true}, 0.2},
	} {
		src := scheduleModel + "train {\n  " + c.train + "\n}\n"
		res, err := CompileSource("m.cnn", []byte(src), Options{})
		require.NoError(t, err, c.train)
		assert.Equal(t, c.want, res.Train.Schedule, c.train)
		assert.Equal(t, c.lr, res.Train.Optimizer.LR, c.train)
		assert.Empty(t, res.Warnings, c.train)
	}
}

// onecycle's max_lr is the run's base rate: an optimizer's lr beside it is
// a warning (PyTorch's OneCycleLR ignores it too).
func TestOneCycleWarnsOfAnUnusedLR(t *testing.T) {
	src := scheduleModel + "train {\n  optimizer = sgd(lr=0.01, momentum=0.9)\n  schedule = onecycle(max_lr=0.1)\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{})
	require.NoError(t, err)
	assert.Equal(t, 0.1, res.Train.Optimizer.LR)
	require.Len(t, res.Warnings, 1)
	assert.Contains(t, res.Warnings.RenderAll(map[string][]byte{"m.cnn": []byte(src)}), "m.cnn:6:19: warning: sgd's lr is not used: onecycle's max_lr=0.1 is the run's base rate")
}

func TestScheduleErrors(t *testing.T) {
	for _, c := range []struct{ train, want string }{
		{"schedule = cosin()", "m.cnn:6:14: unknown schedule cosin"},
		{"schedule = 3", "m.cnn:6:14: schedule must be a call such as cosine() or step(every=30), got integer 3"},
		{"schedule = step()", "m.cnn:6:14: step needs every=..."},
		{"schedule = step(every=0)", "m.cnn:6:25: step: every must be at least 1, got 0"},
		{"schedule = step(30)", "m.cnn:6:19: step takes keyword arguments only (every=...)"},
		{"schedule = multistep(milestones=30)", "m.cnn:6:35: multistep: milestones must be a list of epochs such as [30, 60], got integer 30"},
		{"schedule = multistep(milestones=[30, 20])", "m.cnn:6:40: multistep: milestones must increase, but 20 follows 30"},
		{"schedule = multistep(milestones=[0])", "m.cnn:6:36: multistep: a milestone is an epoch, an integer of at least 1, got integer 0"},
		{"schedule = cosine(eta_min=-1)", "m.cnn:6:29: cosine: eta_min must be at least 0"},
		{"schedule = cosine(tmax=3)", "m.cnn:6:21: cosine has no argument \"tmax\""},
		{"schedule = onecycle(pct_start=0.3)", "m.cnn:6:14: onecycle needs max_lr=..."},
		{"schedule = onecycle(max_lr=0)", "m.cnn:6:30: onecycle: max_lr must be above 0, got 0"},
		{"schedule = onecycle(max_lr=0.1, pct_start=1)", "m.cnn:6:45: onecycle: pct_start must be in [0, 1), got 1"},
		{"schedule = onecycle(max_lr=0.1, anneal_strategy=\"exp\")", "m.cnn:6:51: onecycle: anneal_strategy must be \"cos\" or \"linear\", got \"exp\""},
		{"schedule = onecycle(max_lr=0.1, cycle_momentum=true)", "m.cnn:6:50: onecycle: cnnc does not cycle momentum"},
		{"schedule = onecycle(max_lr=0.1)\n  warmup = 10", "m.cnn:7:12: warmup with onecycle: onecycle warms up by itself"},
		{"warmup = 0", "m.cnn:6:12: train block: warmup must be at least 1, got 0"},
	} {
		src := scheduleModel + "train {\n  " + c.train + "\n}\n"
		_, err := CompileSource("m.cnn", []byte(src), Options{})
		require.Error(t, err, c.train)
		var ds dsl.Diagnostics
		require.ErrorAs(t, err, &ds)
		assert.Contains(t, ds.RenderAll(map[string][]byte{"m.cnn": []byte(src)}), c.want, c.train)
	}
}

func TestLabelSmoothing(t *testing.T) {
	src := header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label, label_smoothing=0.1)\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{})
	require.NoError(t, err)
	assert.Contains(t, res.Graph.Text(), "softmax_cross_entropy(%f, %label) label_smoothing=0.1")
	bad := header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label, label_smoothing=1.5)\n}\n"
	_, err = CompileSource("m.cnn", []byte(bad), Options{})
	require.Error(t, err)
	assert.Contains(t, err.(dsl.Diagnostics).RenderAll(map[string][]byte{"m.cnn": []byte(bad)}), "m.cnn:3:50: cross_entropy: label_smoothing must be in [0, 1), got 1.5")
}
