package trainergen_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// accumulateModel trains with 3 batches of 4 accumulated per update
// (dropout included: its mask is keyed by the element's index in the
// update's 12 samples).
const accumulateModel = `model D(image: f32[1,9,8], label: class[5]) {
    c    = conv2d(image, out=4, kernel=3, padding=1)
    p    = maxpool(relu(c), kernel=2)
    h    = linear(flatten(p), out=12)
    d    = dropout(relu(h), p=0.3)
    out  = linear(d, out=5)
    loss = cross_entropy(out, label)
}
train { optimizer = %s batch = %d%s }
`

// compileSrc compiles a model's text for CUDA (the emulator runs it).
func compileSrc(t *testing.T, src string) *trainergen.Compiled {
	t.Helper()
	res, err := compiler.CompileSource("d.cnn", []byte(src), compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	return c
}

// accumulate = 3 at batch 4 is one update of 12 samples per step, planned
// as the whole step in 3 micro-batches of 4 (activations of 4 samples),
// and each update equals the full-batch step of 12: the trainer compiled
// for batch 12, and the float64 reference's step on the 12 samples —
// a partial last update (7 samples: micro-batches of 4, 3 and padding)
// included. Bounds: those of the micro-batching tests
// (TestWholeStepMicroBatchesWithDropoutEqualFullBatch): the float32
// kernels differ from float64 by rounding over sums of at most a few
// hundred terms (relative 1e-6 or so per step), well within 1e-5 of the
// loss and 1e-4 of each parameter tensor's largest magnitude after three
// steps; a wrong accumulation (a micro-batch's gradient dropped, counted
// twice or averaged over 4 instead of 12) moves parameters by lr-sized
// amounts, 1e-2 here.
func TestAccumulateEqualsTheFullBatchStep(t *testing.T) {
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9)", "adam(lr=0.01)"} {
		t.Run(opt, func(t *testing.T) {
			acc := compileSrc(t, fmt.Sprintf(accumulateModel, opt, 4, " accumulate = 3"))
			full := compileSrc(t, fmt.Sprintf(accumulateModel, opt, 12, ""))
			p := acc.Plan
			assert.Equal(t, int64(12), p.Batch)
			assert.Equal(t, int64(3), p.Accumulate)
			require.Len(t, p.Loops, 1)
			assert.Equal(t, int64(4), p.Loops[0].MicroBatch)
			assert.Equal(t, int64(3), p.Loops[0].Count)
			assert.Equal(t, "step", p.Choices.MicroBatched)
			assert.Equal(t, "accumulate", p.Choices.Strategy)
			assert.Equal(t, 12, acc.Spec.Batch, "the trainer feeds an update's 12 samples per step")
			assert.Contains(t, acc.Spec.PlanSummary, "gradient accumulation: a step is one update of up to 12 samples, trained as 3 micro-batches of 4")
			assert.NotContains(t, full.Spec.PlanSummary, "accumulation")
			// activations are sized for the micro-batch: the accumulating
			// plan's non-persistent, non-input bytes are below the full one's
			assert.Less(t, p.PeakBytes, full.Plan.PeakBytes)

			a, b := newSession(t, acc, 3), newSession(t, full, 3)
			ref := reference.New(full.Plan.Graph, 3)
			rng := rand.New(rand.NewPCG(5, 5))
			for step := 0; step < 3; step++ {
				valid := 12
				if step == 2 {
					valid = 7
				}
				batch := randomBatch(rng, valid)
				la, ca, err := a.TrainStep(batch)
				require.NoError(t, err)
				lb, cb, err := b.TrainStep(batch)
				require.NoError(t, err)
				r, err := ref.Run(reference.Batch{N: valid, Pixels: batch.Pixels, Labels: batch.Labels}, reference.Train)
				require.NoError(t, err)
				assert.InDelta(t, lb, la, 1e-5*math.Max(1, float64(lb)), "step %d loss vs batch 12", step)
				assert.InDelta(t, r.Loss, float64(la), 1e-5*math.Max(1, r.Loss), "step %d loss vs the reference", step)
				assert.Equal(t, cb, ca, "step %d correct", step)
				assert.Equal(t, r.Correct, ca, "step %d correct vs the reference", step)
				sameParams(t, acc, a, b, fmt.Sprintf("step %d vs batch 12", step))
				for _, q := range acc.Spec.Params {
					y, err := a.ReadTensor(q)
					require.NoError(t, err)
					assert.Less(t, maxRel(y, ref.ParamByName(q.Name)), 1e-4, "step %d %s vs the reference", step, q.Name)
				}
			}
		})
	}
}

// The CPU target runs the same accumulating plan (its kernels accumulate
// into gradient buffers as the emulator's do): its update of 3 batches of
// 4 equals its full-batch step of 12, with the bounds above.
func TestAccumulateOnTheCPUTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles two CPU trainers' kernels with g++")
	}
	opt := "sgd(lr=0.1, momentum=0.9)"
	acc := compileTrainerSrc(t, fmt.Sprintf(accumulateModel, opt, 4, " accumulate = 3"))
	full := compileTrainerSrc(t, fmt.Sprintf(accumulateModel, opt, 12, ""))
	require.Equal(t, driver.CPU, targetOf(acc))
	require.Len(t, acc.Plan.Loops, 1)
	a, b := newSession(t, acc, 3), newSession(t, full, 3)
	rng := rand.New(rand.NewPCG(6, 6))
	for step, valid := range []int{12, 12, 7} {
		batch := randomBatch(rng, valid)
		la, ca, err := a.TrainStep(batch)
		require.NoError(t, err)
		lb, cb, err := b.TrainStep(batch)
		require.NoError(t, err)
		assert.InDelta(t, lb, la, 1e-5*math.Max(1, float64(lb)), "step %d loss", step)
		assert.Equal(t, cb, ca, "step %d correct", step)
	}
	sameParams(t, acc, a, b, "after the run")
}

// A training run with accumulate: a step is an update of 12 samples, so an
// epoch of 30 samples is 3 steps (12, 12 and a partial 6), the step count
// and the learning-rate schedule count updates, and two epochs end where
// the trainer compiled for batch 12 ends (same shuffled order: both feed
// batches of 12), within the bounds above.
func TestAccumulateTrainingRunCountsUpdates(t *testing.T) {
	src := func(batch int, acc string) string {
		return fmt.Sprintf(accumulateModel, "sgd(lr=0.1, momentum=0.9)", batch, acc+" schedule = step(every=1, gamma=0.5)")
	}
	acc := compileTrainerSrc(t, src(4, " accumulate = 3"))
	full := compileTrainerSrc(t, src(12, ""))
	ds := trainertest.Data(acc.Spec, 30, 1)
	run := func(c *trainergen.Compiled) (*trainer.Session, []trainer.StepMetrics) {
		sess := newSession(t, c, 2)
		var steps []trainer.StepMetrics
		loop := &trainer.Loop{Session: sess, Train: ds, Epochs: 2, Schedule: c.Spec.Schedule, OnStep: func(m *trainer.StepMetrics) error {
			steps = append(steps, *m)
			return nil
		}}
		_, err := loop.Run(context.Background())
		require.NoError(t, err)
		return sess, steps
	}
	a, stepsA := run(acc)
	b, stepsB := run(full)
	require.Len(t, stepsA, 6)
	for i, m := range stepsA {
		assert.Equal(t, int64(i+1), m.Step)
		assert.Equal(t, 3, m.Batches)
		assert.Equal(t, []int{12, 12, 6}[i%3], m.Size, "step %d", i)
		assert.Equal(t, float32(0.1)*[]float32{1, 0.5}[i/3], m.LR, "step %d: the schedule's epochs count updates", i)
		assert.InDelta(t, stepsB[i].Loss, m.Loss, 1e-5*math.Max(1, float64(m.Loss)), "step %d loss", i)
	}
	assert.Equal(t, int64(6), a.Step)
	sameParams(t, acc, a, b, "after the run")
}

// sameParams requires every parameter of session a (compiled as c) within
// 1e-4 of the largest magnitude of the same tensor in session b.
func sameParams(t *testing.T, c *trainergen.Compiled, a, b *trainer.Session, what string) {
	t.Helper()
	for _, q := range c.Spec.Params {
		qa, ok := a.Param(q.Name)
		require.True(t, ok, q.Name)
		y, err := a.ReadTensor(qa)
		require.NoError(t, err)
		qb, ok := b.Param(q.Name)
		require.True(t, ok, q.Name)
		x, err := b.ReadTensor(qb)
		require.NoError(t, err)
		want := make([]float64, len(x))
		for i, v := range x {
			want[i] = float64(v)
		}
		assert.Less(t, maxRel(y, want), 1e-4, "%s: %s", what, q.Name)
	}
}

// randomBatch is valid random samples of the 1x9x8 model's 5 classes.
func randomBatch(rng *rand.Rand, valid int) trainer.Batch {
	b := trainer.Batch{Valid: valid, Pixels: make([]uint8, valid*72), Labels: make([]int32, valid)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(5))
	}
	return b
}
