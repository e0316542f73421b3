package trainergen_test

import (
	"fmt"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/units"
)

func compileExample(t *testing.T, path string, batch int64) *trainergen.Compiled {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(checkoutName(path), src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	return c
}

func mnistBatches(t *testing.T, n, batch int) []trainer.Batch {
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	ds, err := data.LoadMNIST(dir, "train")
	require.NoError(t, err)
	var out []trainer.Batch
	for s := 0; s < n; s++ {
		b := trainer.Batch{Valid: batch}
		for i := 0; i < batch; i++ {
			k := s*batch + i
			b.Pixels = append(b.Pixels, ds.Images.Image(k)...)
			b.Labels = append(b.Labels, int32(ds.Labels[k]))
		}
		out = append(out, b)
	}
	return out
}

// assertStateFollowsReference checks that session sess of c holds the
// reference's parameters and float buffers (running statistics) within
// 1e-4 relative to each tensor's largest value (the trainer tests' bound).
func assertStateFollowsReference(t *testing.T, c *trainergen.Compiled, sess *trainer.Session, ref *reference.Executor, what string) {
	t.Helper()
	for _, p := range append(append([]trainer.Tensor{}, c.Spec.Params...), c.Spec.Buffers...) {
		if p.DType == trainer.DTypeI64 {
			continue
		}
		got, err := sess.ReadTensor(p)
		require.NoError(t, err)
		assert.Less(t, maxRel(got, ref.ParamByName(p.Name)), 1e-4, "%s: %s", what, p.Name)
	}
}

func maxRel(got []float32, want []float64) float64 {
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	worst := 0.0
	for i := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-want[i])/math.Max(scale, 1e-30))
	}
	return worst
}

// The CPU trainer for examples/mnist.cnn follows the float64 reference step
// by step: loss, correct count and every parameter, from the same init.
func TestCPUTrainerMatchesTheReference(t *testing.T) {
	const batch = 16
	c := compileExample(t, "../../examples/mnist.cnn", batch)
	// the trainer allocates exactly the planned arena, kernel workspace included
	assert.Equal(t, c.Plan.ArenaBytes, c.Spec.ArenaBytes)
	assert.Equal(t, c.Plan.PeakBytes, c.Spec.ArenaBytes)
	// and prints its size as it prints the arena's: the unit that fits
	assert.Equal(t, fmt.Sprintf("memory plan: peak %s (%d bytes), kernel workspace included", units.FormatBytes(c.Plan.PeakBytes), c.Plan.PeakBytes),
		strings.SplitN(c.Spec.PlanSummary, ";", 2)[0])
	sess := newSession(t, c, 1)
	ref := reference.New(c.Plan.Graph, 1)
	for step, b := range mnistBatches(t, 4, batch) {
		loss, correct, err := sess.TrainStep(b)
		require.NoError(t, err)
		r, err := ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Train)
		require.NoError(t, err)
		assert.InDelta(t, r.Loss, float64(loss), 1e-5*math.Max(1, r.Loss), "step %d loss", step)
		assert.Equal(t, r.Correct, correct, "step %d correct", step)
		for _, p := range c.Spec.Params {
			got, err := sess.ReadTensor(p)
			require.NoError(t, err)
			e := maxRel(got, ref.ParamByName(p.Name))
			assert.Less(t, e, 1e-4, "step %d %s", step, p.Name)
		}
	}
	// evaluation borrows the training arena's temporary space (no second
	// arena) and leaves the parameters alone
	assert.Zero(t, c.Spec.EvalArenaBytes)
	b := mnistBatches(t, 5, batch)[4]
	before, err := sess.ReadTensor(c.Spec.Params[0])
	require.NoError(t, err)
	loss, correct, err := sess.EvalBatch(b)
	require.NoError(t, err)
	r, err := ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Eval)
	require.NoError(t, err)
	assert.InDelta(t, r.Loss, float64(loss), 1e-5*math.Max(1, r.Loss))
	assert.Equal(t, r.Correct, correct)
	after, err := sess.ReadTensor(c.Spec.Params[0])
	require.NoError(t, err)
	assert.Equal(t, before, after)
	// and training goes on after it as if evaluation had not happened
	lt, _, err := sess.TrainStep(b)
	require.NoError(t, err)
	rt, err := ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Train)
	require.NoError(t, err)
	assert.InDelta(t, rt.Loss, float64(lt), 1e-5*math.Max(1, rt.Loss))
	for _, p := range c.Spec.Params {
		got, err := sess.ReadTensor(p)
		require.NoError(t, err)
		assert.Less(t, maxRel(got, ref.ParamByName(p.Name)), 1e-4, p.Name)
	}
}
