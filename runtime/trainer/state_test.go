package trainer_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/runtime/trainer"
)

func TestRunStateRoundTripAndChecks(t *testing.T) {
	st := trainer.RunState{Position: trainer.Position{Epoch: 2, Batch: 3}, Epochs: 5, Batch: 32, NoShuffle: true, Samples: 1000}
	got, err := trainer.ParseRunState(st.Meta())
	require.NoError(t, err)
	assert.True(t, got.HasPosition())
	got.Has = nil
	assert.Equal(t, st, got)
	// 1000 samples at 32: 32 batches per epoch; epoch 2 after batch 3 is step 67
	assert.NoError(t, st.Check(67, 1000, 32))
	assert.ErrorContains(t, st.Check(66, 1000, 32), "its step count 66 does not match its position (epoch 3 after batch 3 at 32 batches per epoch is step 67)")
	assert.ErrorContains(t, st.Check(67, 999, 32), "it was trained on 1000 samples and the data has 999")
	assert.ErrorContains(t, st.Check(67, 1000, 3), "it is at batch 3 of epoch 3, but an epoch of this data has 3 batches")

	for _, bad := range []map[string]string{
		{"epoch": "-1", "epoch_batch": "0"},
		{"epoch": "1", "epoch_batch": "x"},
		{"epoch": "1"},
		{"epoch": "1", "epoch_batch": "0", "batch_size": "0"},
		{"epoch": "1", "epoch_batch": "0", "no_shuffle": "maybe"},
	} {
		_, err := trainer.ParseRunState(bad)
		assert.Error(t, err, "%v", bad)
	}
	none, err := trainer.ParseRunState(map[string]string{"step": "3"})
	require.NoError(t, err)
	assert.False(t, none.HasPosition())
}

// A learning rate is what the kernels will use, or an error: never
// silently 0 (1e-50 in float32) or infinite.
func TestLR32(t *testing.T) {
	lr, err := trainer.LR32(0.01)
	require.NoError(t, err)
	assert.Equal(t, float32(0.01), lr)
	smallest := math.Float32frombits(0x00800000) // float32's smallest normal, 2^-126
	lr, err = trainer.LR32(float64(smallest))
	require.NoError(t, err)
	assert.Equal(t, smallest, lr)
	for _, bad := range []float64{1e-50, float64(smallest) / 2, 0, -0.1, math.NaN(), 1e39, math.Inf(1)} {
		_, err := trainer.LR32(bad)
		assert.Error(t, err, "%v", bad)
	}
	_, err = trainer.LR32(1e-50)
	assert.ErrorContains(t, err, "below float32's smallest normal number (1.175e-38)")
}
