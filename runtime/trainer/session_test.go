package trainer_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/version"
)

// batches cuts a dataset into full batches of the compiled size, in order.
func batches(m *trainertest.Model, ds *trainertest.Memory) []trainer.Batch {
	var out []trainer.Batch
	b := m.Spec.Batch
	for first := 0; first+b <= ds.Len(); first += b {
		tb := trainer.Batch{Valid: b}
		for i := first; i < first+b; i++ {
			tb.Pixels = append(tb.Pixels, ds.Images[i]...)
			tb.Labels = append(tb.Labels, ds.Labels[i])
		}
		out = append(out, tb)
	}
	return out
}

func allTensors(spec *trainer.Spec) []trainer.Tensor {
	return append(append([]trainer.Tensor{}, spec.Params...), spec.State...)
}

// sameState says whether two sessions hold the same parameters and
// optimizer state, bit for bit.
func sameState(t *testing.T, a, b *trainer.Session) {
	t.Helper()
	for _, tn := range allTensors(a.Spec) {
		x, err := a.ReadTensor(tn)
		require.NoError(t, err)
		y, err := b.ReadTensor(tn)
		require.NoError(t, err)
		assert.Equal(t, x, y, tn.Name)
	}
}

// Save -> Load round-trips exactly, and a run interrupted and resumed from
// its checkpoint ends with the same parameters, bit for bit, as one that
// was not.
func TestSaveLoadAndResumeAreExact(t *testing.T) {
	m := trainertest.Tiny(t)
	bs := batches(m, trainertest.Data(m.Spec, 16, 1))
	ckpt := filepath.Join(t.TempDir(), "ckpt.safetensors")

	whole := m.Session(t, 3)
	for _, b := range bs {
		_, _, err := whole.TrainStep(b)
		require.NoError(t, err)
	}
	first := m.Session(t, 3)
	for _, b := range bs[:2] {
		_, _, err := first.TrainStep(b)
		require.NoError(t, err)
	}
	require.NoError(t, first.Save(ckpt, nil))
	resumed := m.Session(t, 99) // another init: the checkpoint must replace it all
	_, err := resumed.Load(ckpt, true)
	require.NoError(t, err)
	assert.Equal(t, int64(2), resumed.Step)
	assert.Equal(t, uint64(3), resumed.Seed, "a resume restores the run's seed: dropout and augmentation draws are keyed by it")
	sameState(t, first, resumed)
	for _, b := range bs[2:] {
		_, _, err := resumed.TrainStep(b)
		require.NoError(t, err)
	}
	sameState(t, whole, resumed)

	// the same through a writer and a reader
	var buf bytes.Buffer
	require.NoError(t, whole.Encode(&buf, map[string]string{"extra": "1"}))
	again := m.Session(t, 7)
	meta, err := again.Decode(&buf, true)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), again.Seed)
	assert.Equal(t, "1", meta["extra"])
	sameState(t, whole, again)
}

// A checkpoint says which cnnc made it, and stores the learning rate as
// the exact float32 the kernels used.
func TestCheckpointMetadata(t *testing.T) {
	m := trainertest.Tiny(t)
	s := m.Session(t, 1)
	s.LR = float32(1e-7)
	path := filepath.Join(t.TempDir(), "c.safetensors")
	require.NoError(t, s.Save(path, map[string]string{"epoch": "0"}))
	f, err := checkpoint.Read(path)
	require.NoError(t, err)
	assert.Equal(t, version.Get().Version, f.Metadata[trainer.MetaVersion])
	assert.Equal(t, "Tiny", f.Metadata[trainer.MetaModel])
	assert.Equal(t, "1e-07", f.Metadata[trainer.MetaLR])
	assert.Equal(t, "0", f.Metadata["epoch"])
}

// A checkpoint of another model is refused naming the tensor, and nothing
// is loaded; garbage is refused naming the file.
func TestLoadingAnotherModelsCheckpointFails(t *testing.T) {
	m := trainertest.Tiny(t)
	sess := m.Session(t, 1)
	before, err := sess.ReadTensor(m.Spec.Params[0])
	require.NoError(t, err)
	other := trainertest.Compile(t, "wide.cnn", []byte(strings.Replace(string(trainertest.TinySource), "out=2", "out=4", 1)))
	ckpt := filepath.Join(t.TempDir(), "other.safetensors")
	require.NoError(t, other.Session(t, 1).Save(ckpt, nil))
	_, err = sess.Load(ckpt, true)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `tensor "conv1.weight" has shape [4 1 3 3], the model needs [2 1 3 3]`)
	after, err := sess.ReadTensor(m.Spec.Params[0])
	require.NoError(t, err)
	assert.Equal(t, before, after, "nothing loaded")
	require.NoError(t, os.WriteFile(ckpt, []byte("garbage"), 0o644))
	_, err = sess.Load(ckpt, true)
	assert.ErrorContains(t, err, ckpt)
	_, err = sess.Decode(bytes.NewReader(make([]byte, 1<<20)), true)
	assert.Error(t, err)
}

// Parameters that are no longer finite are never written: such a
// checkpoint could not be resumed, and it would replace a good one.
func TestSaveRefusesNonFiniteParameters(t *testing.T) {
	m := trainertest.Tiny(t)
	s := m.Session(t, 1)
	path := filepath.Join(t.TempDir(), "c.safetensors")
	require.NoError(t, s.Save(path, nil))
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	p := m.Spec.Params[1]
	vals, err := s.ReadTensor(p)
	require.NoError(t, err)
	vals[1] = float32(math.Inf(1))
	require.NoError(t, s.WriteTensor(p, vals))
	err = s.Save(path, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p.Name+" holds +Inf at element 1")
	now, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, good, now, "the good checkpoint is untouched")
	assert.Error(t, s.Encode(&bytes.Buffer{}, nil))
}

// Predict's probabilities are a distribution, sorted, and its top class
// is what evaluation counts as correct.
func TestPredict(t *testing.T) {
	m := trainertest.Tiny(t)
	s := m.Session(t, 1)
	bs := batches(m, trainertest.Data(m.Spec, 40, 2))
	for _, b := range bs {
		_, _, err := s.TrainStep(b)
		require.NoError(t, err)
	}
	b := bs[0]
	_, correct, err := s.EvalBatch(b)
	require.NoError(t, err)
	all, err := s.Predict(b.Pixels, m.Spec.Classes)
	require.NoError(t, err)
	require.Len(t, all, b.Valid)
	right := 0
	for i, ps := range all {
		sum := 0.0
		for j, p := range ps {
			sum += p.Prob
			if j > 0 {
				assert.GreaterOrEqual(t, ps[j-1].Prob, p.Prob)
			}
		}
		// float64 sum of 3 probabilities, each rounded once: a few ulps
		assert.InDelta(t, 1, sum, 1e-12)
		if int32(ps[0].Class) == b.Labels[i] {
			right++
		}
	}
	assert.Equal(t, correct, right)
	top1, err := s.Predict(b.Pixels[:36], 1)
	require.NoError(t, err)
	assert.Equal(t, all[0][0], top1[0][0])
	_, err = s.Predict(b.Pixels[:35], 1)
	assert.ErrorContains(t, err, "whole 6x6x1 images")
	_, err = s.Predict(b.Pixels, 4)
	assert.ErrorContains(t, err, "k must be 1 to 3")
}

// Profiling times every launch and leaves training as it was.
func TestProfileStepLeavesStateAlone(t *testing.T) {
	m := trainertest.Tiny(t)
	a, b := m.Session(t, 1), m.Session(t, 1)
	bs := batches(m, trainertest.Data(m.Spec, 8, 3))
	times, events, err := a.ProfileStep(bs[0])
	require.NoError(t, err)
	assert.False(t, events, "the emulator has no events")
	assert.Len(t, times, len(m.Spec.Train.Launches))
	assert.Equal(t, int64(0), a.Step)
	sameState(t, a, b)
}
