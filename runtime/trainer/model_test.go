package trainer_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

func newModel(t *testing.T, m *trainertest.Model, o trainer.Options) *trainer.Model {
	t.Helper()
	mod, err := trainer.NewModel(m.Spec, m.Backends, o)
	require.NoError(t, err)
	t.Cleanup(func() { mod.Close() })
	return mod
}

// Train stops when its context is cancelled and, called again, goes on
// from there; so does a model loaded from a Save (with another seed and
// learning rate given to New: the checkpoint's win): every path ends with
// the uninterrupted run's parameters.
func TestModelTrainCancelContinueSaveLoad(t *testing.T) {
	m := trainertest.Tiny(t)
	ds := trainertest.Data(m.Spec, 12, 7)
	var epochs []trainer.EpochMetrics
	whole := newModel(t, m, trainer.Options{Seed: 4, Epochs: 2, OnEpoch: func(e trainer.EpochMetrics) { epochs = append(epochs, e) }})
	require.NoError(t, whole.Train(context.Background(), ds))
	assert.Equal(t, int64(6), whole.Steps())
	require.Len(t, epochs, 2)
	assert.Equal(t, int64(6), epochs[1].Step)
	require.NoError(t, whole.Train(context.Background(), ds), "the epochs are done: nothing to do")
	assert.Equal(t, int64(6), whole.Steps())

	ctx, cancel := context.WithCancel(context.Background())
	var steps []int64
	part := newModel(t, m, trainer.Options{Seed: 4, Epochs: 2, OnStep: func(s trainer.StepMetrics) {
		steps = append(steps, s.Step)
		if s.Step == 2 {
			cancel()
		}
	}})
	err := part.Train(ctx, ds)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []int64{1, 2}, steps)

	var saved bytes.Buffer
	require.NoError(t, part.Save(&saved))
	loaded := newModel(t, m, trainer.Options{Seed: 99, Epochs: 2})
	require.NoError(t, loaded.Load(bytes.NewReader(saved.Bytes())))
	assert.Equal(t, int64(2), loaded.Steps())
	require.NoError(t, loaded.Train(context.Background(), ds))
	sameState(t, whole.Session(), loaded.Session())

	require.NoError(t, part.Train(context.Background(), ds))
	assert.Equal(t, []int64{1, 2, 3, 4, 5, 6}, steps)
	sameState(t, whole.Session(), part.Session())
}

// A failed Load changes nothing.
func TestModelLoadChecksFirst(t *testing.T) {
	m := trainertest.Tiny(t)
	a := newModel(t, m, trainer.Options{Seed: 1})
	var saved bytes.Buffer
	require.NoError(t, a.Session().Encode(&saved, map[string]string{"epoch": "x", "epoch_batch": "0"}))
	b := newModel(t, m, trainer.Options{Seed: 2})
	before, err := b.Session().ReadTensor(m.Spec.Params[0])
	require.NoError(t, err)
	err = b.Load(&saved)
	assert.ErrorContains(t, err, `metadata "epoch" = "x"`)
	after, err := b.Session().ReadTensor(m.Spec.Params[0])
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

// Options the kernels cannot honour are refused when the model is made.
func TestModelOptions(t *testing.T) {
	m := trainertest.Tiny(t)
	_, err := trainer.NewModel(m.Spec, m.Backends, trainer.Options{LR: 1e-50})
	assert.ErrorContains(t, err, "Options.LR: the learning rate 1e-50 is below float32's smallest normal number")
	_, err = trainer.NewModel(m.Spec, m.Backends, trainer.Options{Batch: 5})
	assert.ErrorContains(t, err, "batch 5 (1 to 4")
	_, err = trainer.NewModel(m.Spec, m.Backends, trainer.Options{Device: "cuda"})
	assert.ErrorContains(t, err, `Tiny: Options.Device "cuda": this program was built without it (it has [cpu])`)
	_, err = trainer.NewModel(m.Spec, m.Backends, trainer.Options{Device: "tpu"})
	assert.ErrorContains(t, err, `Options.Device "tpu": want auto, cpu or cuda`)
	mod := newModel(t, m, trainer.Options{LR: 0.25})
	assert.Equal(t, float32(0.25), mod.Session().LR)
	assert.Equal(t, "cpu (CUDA emulator)", mod.Device())
}
