package trainergen_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A trainer of a model with batch norm follows the reference step by step,
// running statistics included; evaluation uses the running statistics and
// changes nothing; checkpoints hold the buffers under PyTorch's state_dict
// names and types (num_batches_tracked an int64 scalar), and load back.
func TestCPUTrainerBatchNorm(t *testing.T) {
	const batch, steps = 6, 3
	c := compileExample(t, "../../compiler/plan/testdata/bn.cnn", batch)
	names := map[string]string{}
	for _, b := range c.Spec.Buffers {
		names[b.Name] = b.DType
	}
	assert.Equal(t, map[string]string{
		"bn1.running_mean": "", "bn1.running_var": "", "bn1.num_batches_tracked": trainer.DTypeI64,
		"bn2.running_mean": "", "bn2.running_var": "", "bn2.num_batches_tracked": trainer.DTypeI64,
		"bn3.running_mean": "", "bn3.running_var": "", "bn3.num_batches_tracked": trainer.DTypeI64,
	}, names)
	sess := newSession(t, c, 2)
	ref := reference.New(c.Plan.Graph, 2)
	rng := rand.New(rand.NewPCG(8, 9))
	batchOf := func() trainer.Batch { return trainertest.RandomBatch(c.Spec, batch, rng) }
	for s := 0; s < steps; s++ {
		b := batchOf()
		loss, _, err := sess.TrainStep(b)
		require.NoError(t, err)
		r, err := ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Train)
		require.NoError(t, err)
		assert.InDelta(t, r.Loss, float64(loss), 1e-5*math.Max(1, r.Loss), "step %d loss", s)
		assertStateFollowsReference(t, c, sess, ref, "after a step")
	}
	b := batchOf()
	loss, correct, err := sess.EvalBatch(b)
	require.NoError(t, err)
	r, err := ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Eval)
	require.NoError(t, err)
	assert.InDelta(t, r.Loss, float64(loss), 1e-5*math.Max(1, r.Loss), "evaluation uses the running statistics")
	assert.Equal(t, r.Correct, correct)
	assertStateFollowsReference(t, c, sess, ref, "after evaluation")

	path := filepath.Join(t.TempDir(), "bn.safetensors")
	require.NoError(t, sess.Save(path, nil))
	f, err := checkpoint.Read(path)
	require.NoError(t, err)
	nbt, err := f.Expect("bn2.num_batches_tracked", checkpoint.I64, []int64{})
	require.NoError(t, err)
	assert.Equal(t, uint64(steps), binary.LittleEndian.Uint64(nbt.Data), "one count per training step")
	rv, err := f.Expect("bn1.running_var", checkpoint.F32, []int64{4})
	require.NoError(t, err)
	assert.Less(t, maxRel(rv.Float32s(), ref.ParamByName("bn1.running_var")), 1e-4)

	fresh := newSession(t, c, 99)
	_, err = fresh.Load(path, true)
	require.NoError(t, err)
	l2, c2, err := fresh.EvalBatch(b)
	require.NoError(t, err)
	assert.Equal(t, loss, l2, "a loaded checkpoint evaluates the same")
	assert.Equal(t, correct, c2)
}
