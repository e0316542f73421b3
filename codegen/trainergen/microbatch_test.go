package trainergen_test

import (
	"github.com/cnnc/cnnc/driver"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/trainertest"
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

// A depthwise conv whose output only a batch norm reads writes the
// statistics' partials (the direct kernel, direct_conv_fwd_bn) on the whole
// batch; in a micro-batched trunk it writes none and the statistics compute
// the cells from its output after the loop (batchnorm_stats_partial); the
// backward's recomputation of it (the planner's choice with no budget, and
// under a budget that also recomputes bn) writes them again. Each CUDA trainer (on the emulator) follows the reference step by
// step, a padded last batch included: loss within 1e-5, parameters and
// running statistics within 1e-4 (the other trainer tests' bounds).
func TestDepthwiseBNPartialsInLoopsAndRecomputation(t *testing.T) {
	src := []byte(`model DW(image: f32[3,9,8], label: class[5]) {
    c1   = conv2d(image, out=4, kernel=3, padding=1, bias=false)
    dw   = conv2d(relu(c1), out=4, kernel=3, stride=2, padding=1, groups=4, bias=false)
    bn   = batchnorm2d(dw)
    dw2  = conv2d(hardswish(bn), out=4, kernel=3, padding=1, groups=4, bias=false)
    bn2  = batchnorm2d(dw2)
    out  = linear(flatten(relu(bn2)), out=5)
    loss = cross_entropy(out, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) batch = 6 }
`)
	compile := func(cfg func(*plan.Plan) plan.Config) *trainergen.Compiled {
		res, err := compiler.CompileSource("dw.cnn", src, compiler.Options{})
		require.NoError(t, err)
		base, err := driver.Compile(res, plan.Config{NoRecompute: true}, driver.CUDA)
		require.NoError(t, err)
		c, err := driver.Compile(res, cfg(base.Plan), driver.CUDA)
		require.NoError(t, err)
		return c
	}
	// kernels: the launches' kernel names, joined
	kernels := func(c *trainergen.Compiled) string {
		var ks []string
		for _, l := range c.Spec.Train.Launches {
			ks = append(ks, l.Kernel)
		}
		return strings.Join(ks, " ")
	}
	// the depthwise convs' forwards with the partials at the whole batch
	const dwBN, dw2BN = "direct_conv_fwd_x4x9x8_o4_k3x3s2x2p1x1d1x1_g4_b6_bnstats", "direct_conv_fwd_x4x5x4_o4_k3x3s1x1p1x1d1x1_g4_b6_bnstats"
	full := compile(func(*plan.Plan) plan.Config { return plan.Config{} })
	assert.Contains(t, kernels(full), dwBN)
	assert.Contains(t, kernels(full), dw2BN)
	assert.NotContains(t, kernels(full), "batchnorm_stats_partial", "the convs wrote the cells")
	assert.Contains(t, full.Plan.Choices.Recompute, "dw", "the backward recomputes dw, partials and all")
	micro := compile(func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 4, Trunk: "dw"} })
	require.NotEmpty(t, micro.Plan.Loops)
	assert.NotContains(t, kernels(micro), dwBN, "dw, in the loop, writes none")
	assert.Contains(t, kernels(micro), dw2BN)
	assert.Contains(t, kernels(micro), "batchnorm_stats_partial", "bn's statistics compute the cells from dw's output")
	recomp := compile(func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes - 1} })
	require.Equal(t, "recompute", recomp.Plan.Choices.Strategy)
	t.Logf("recomputed: %v", recomp.Plan.Choices.Recompute)
	for name, c := range map[string]*trainergen.Compiled{"full": full, "micro": micro, "recompute": recomp} {
		sess := newSession(t, c, 2)
		ref := reference.New(c.Plan.Graph, 2)
		rng := rand.New(rand.NewPCG(3, 5))
		for step := 0; step < 3; step++ {
			valid := 6
			if step == 2 {
				valid = 5 // a padded last batch
			}
			b := trainertest.RandomBatch(c.Spec, valid, rng)
			loss, _, err := sess.TrainStep(b)
			require.NoError(t, err)
			r, err := ref.Run(reference.Batch{N: valid, Pixels: b.Pixels, Labels: b.Labels}, reference.Train)
			require.NoError(t, err)
			assert.InDelta(t, r.Loss, float64(loss), 1e-5*math.Max(1, r.Loss), "%s: step %d loss", name, step)
		}
		assertStateFollowsReference(t, c, sess, ref, name)
	}
}
