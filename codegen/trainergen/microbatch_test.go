package trainergen_test

import (
	"github.com/cnnc/cnnc/driver"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A trainer built for a 40 MB budget runs SimpleCNN's conv trunk in
// micro-batches (recomputing it in the backward loop, accumulating the conv
// gradients) and the head on the whole batch — within exactly its planned
// arena — and its steps give what the unbudgeted trainer's give.
func TestMicroBatchedTrainerEqualsFullBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("two SimpleCNN trainers at batch 32")
	}
	src, err := os.ReadFile("../../examples/simplecnn.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("simplecnn.cnn", src, compiler.Options{})
	require.NoError(t, err)
	full := compileTrainer(t, res, plan.Config{})
	res2, err := compiler.CompileSource("simplecnn.cnn", src, compiler.Options{})
	require.NoError(t, err)
	micro := compileTrainer(t, res2, driver.Budget(res2, 40e6, "--memory-budget"))
	require.Equal(t, driver.CPU, targetOf(micro))
	require.NotEmpty(t, micro.Plan.Loops, "the 40 MB plan micro-batches")
	assert.LessOrEqual(t, micro.Spec.ArenaBytes, int64(40e6))
	assert.Equal(t, micro.Plan.PeakBytes, micro.Spec.ArenaBytes)
	t.Logf("40 MB plan: %s, arena %d", micro.Plan.Loops[0].What, micro.Spec.ArenaBytes)

	a, b := newSession(t, full, 5), newSession(t, micro, 5)
	rng := rand.New(rand.NewPCG(9, 9))
	var last trainer.Batch
	for step := 0; step < 2; step++ {
		batch := trainer.Batch{Valid: 32, Pixels: make([]uint8, 32*128*128*3), Labels: make([]int32, 32)}
		for i := range batch.Pixels {
			batch.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range batch.Labels {
			batch.Labels[i] = int32(rng.IntN(10))
		}
		la, ca, err := a.TrainStep(batch)
		require.NoError(t, err)
		lb, cb, err := b.TrainStep(batch)
		require.NoError(t, err)
		assert.InDelta(t, la, lb, 1e-5*math.Max(1, float64(la)), "step %d loss", step)
		assert.Equal(t, ca, cb)
		last = batch
	}
	// evaluation stays inside the 40 MB arena too: in chunks that fit its
	// temporary space
	assert.Zero(t, micro.Spec.EvalArenaBytes)
	assert.Less(t, micro.Spec.EvalBatch, 32)
	ea, eca, err := a.EvalBatch(last)
	require.NoError(t, err)
	eb, ecb, err := b.EvalBatch(last)
	require.NoError(t, err)
	assert.InDelta(t, ea, eb, 1e-5*math.Max(1, float64(ea)))
	assert.Equal(t, eca, ecb)
	for _, p := range full.Spec.Params {
		q, ok := b.Param(p.Name)
		require.True(t, ok)
		x, err := a.ReadTensor(p)
		require.NoError(t, err)
		y, err := b.ReadTensor(q)
		require.NoError(t, err)
		want := make([]float64, len(x))
		for i, v := range x {
			want[i] = float64(v)
		}
		assert.Less(t, maxRel(y, want), 1e-4, p.Name)
	}
}

// A plan that micro-batches the whole step — loss and dropout included —
// trains exactly like the whole batch: the loss is scaled by the batch and
// summed over micro-batches, and dropout keys its mask by the element's
// index in the whole batch.
func TestWholeStepMicroBatchesWithDropoutEqualFullBatch(t *testing.T) {
	src := []byte(`model D(image: f32[1,9,8], label: class[5]) {
    c    = conv2d(image, out=4, kernel=3, padding=1)
    p    = maxpool(relu(c), kernel=2)
    h    = linear(flatten(p), out=12)
    d    = dropout(relu(h), p=0.3)
    out  = linear(d, out=5)
    loss = cross_entropy(out, label)
}
train { optimizer = adam(lr=0.01) batch = 10 }
`)
	compile := func(cfg plan.Config) *trainergen.Compiled {
		res, err := compiler.CompileSource("d.cnn", src, compiler.Options{})
		require.NoError(t, err)
		c, err := driver.Compile(res, cfg, driver.CUDA)
		require.NoError(t, err)
		return c
	}
	full := compile(plan.Config{})
	micro := compile(plan.Config{MicroBatch: 4}) // 4 + 4 + 2
	require.NotEmpty(t, micro.Plan.Loops)
	require.Equal(t, "step", micro.Plan.Choices.MicroBatched)
	a, b := newSession(t, full, 3), newSession(t, micro, 3)
	rng := rand.New(rand.NewPCG(4, 4))
	// evaluation turns dropout off: it matches the reference's Eval
	eb := trainer.Batch{Valid: 10, Pixels: make([]uint8, 720), Labels: make([]int32, 10)}
	for i := range eb.Pixels {
		eb.Pixels[i] = uint8(rng.IntN(256))
	}
	el, ec, err := a.EvalBatch(eb)
	require.NoError(t, err)
	r, err := reference.New(full.Plan.Graph, 3).Run(reference.Batch{N: 10, Pixels: eb.Pixels, Labels: eb.Labels}, reference.Eval)
	require.NoError(t, err)
	assert.InDelta(t, r.Loss, float64(el), 1e-5*math.Max(1, r.Loss))
	assert.Equal(t, r.Correct, ec)
	for step := 0; step < 3; step++ {
		valid := 10
		if step == 2 {
			valid = 7 // a partial last batch: padded, then micro-batched
		}
		batch := trainer.Batch{Valid: valid, Pixels: make([]uint8, valid*72), Labels: make([]int32, valid)}
		for i := range batch.Pixels {
			batch.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range batch.Labels {
			batch.Labels[i] = int32(rng.IntN(5))
		}
		la, ca, err := a.TrainStep(batch)
		require.NoError(t, err)
		lb, cb, err := b.TrainStep(batch)
		require.NoError(t, err)
		assert.InDelta(t, la, lb, 1e-5*math.Max(1, float64(la)), "step %d loss", step)
		assert.Equal(t, ca, cb, "step %d correct", step)
	}
	for _, p := range full.Spec.Params {
		q, _ := b.Param(p.Name)
		x, err := a.ReadTensor(p)
		require.NoError(t, err)
		y, err := b.ReadTensor(q)
		require.NoError(t, err)
		want := make([]float64, len(x))
		for i, v := range x {
			want[i] = float64(v)
		}
		assert.Less(t, maxRel(y, want), 1e-4, p.Name)
	}
}
