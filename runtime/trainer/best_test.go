package trainer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

func TestBestObserves(t *testing.T) {
	acc, err := trainer.NewBest("accuracy", 2)
	require.NoError(t, err)
	ep := func(n int, loss, a float64) trainer.EpochMetrics {
		return trainer.EpochMetrics{Epoch: n, TestLoss: loss, TestAcc: a, Tested: true}
	}
	assert.True(t, acc.Observe(ep(1, 2, 0.5)), "the first epoch is the best so far")
	assert.True(t, acc.Observe(ep(2, 2, 0.6)))
	assert.False(t, acc.Observe(ep(3, 1, 0.6)), "a tie is no improvement")
	assert.False(t, acc.Exhausted())
	assert.False(t, acc.Observe(ep(4, 1, 0.55)))
	assert.True(t, acc.Exhausted(), "two epochs without improvement")
	assert.Equal(t, "test accuracy 0.6 at epoch 2", acc.Describe())

	loss, err := trainer.NewBest("loss", 0)
	require.NoError(t, err)
	assert.True(t, loss.Observe(ep(1, 2, 0.5)))
	assert.True(t, loss.Observe(ep(2, 1.5, 0.1)), "lower loss is better")
	for i := 3; i < 10; i++ {
		assert.False(t, loss.Observe(ep(i, 1.7, 0.9)))
	}
	assert.False(t, loss.Exhausted(), "patience 0 never stops")

	back, _ := trainer.NewBest("accuracy", 2)
	ok, err := back.Restore(acc.Meta())
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, *acc, *back)
	other, _ := trainer.NewBest("loss", 2)
	ok, err = other.Restore(acc.Meta())
	require.NoError(t, err)
	assert.False(t, ok, "a checkpoint that followed accuracy says nothing about the loss")
	_, err = back.Restore(map[string]string{"best_by": "accuracy", "best_epoch": "x"})
	assert.ErrorContains(t, err, `metadata "best_value" = "" is not a number`)

	_, err = trainer.NewBest("acc", 0)
	assert.ErrorContains(t, err, `"acc": the best epoch is chosen by accuracy or loss`)
}

// The loop saves the best epochs through SaveBest (before Save, whose
// metadata then holds the state), stops when patience runs out, and a
// run resumed from a checkpoint of its first epochs stops where the
// uninterrupted run did. A learning rate of 1e-30 leaves the float32
// parameters as they are, so every epoch's test loss ties the first's:
// no improvement after epoch 1.
func TestLoopKeepsTheBestAndStopsEarly(t *testing.T) {
	m := trainertest.Tiny(t)
	train, test := trainertest.Data(m.Spec, 8, 1), trainertest.Data(m.Spec, 6, 2)
	var bestAt []trainer.Position
	run := func(sess *trainer.Session, best *trainer.Best, start trainer.Position, maxSteps int64) (trainer.Result, []trainer.Position) {
		sv := &saves{sess: sess}
		bestAt = nil
		l := &trainer.Loop{Session: sess, Train: train, Test: test, Epochs: 10, Start: start, MaxSteps: maxSteps, Best: best, Save: sv.save,
			SaveBest: func(p trainer.Position) error { bestAt = append(bestAt, p); return nil }}
		res, err := l.Run(context.Background())
		require.NoError(t, err)
		return res, sv.at
	}
	sess := m.Session(t, 1)
	sess.LR = 1e-30
	best, _ := trainer.NewBest("loss", 2)
	res, saved := run(sess, best, trainer.Position{}, 0)
	assert.Equal(t, trainer.EarlyStopped, res.Stop)
	require.Len(t, res.Epochs, 3, "epoch 1 is the best; 2 and 3 do not improve")
	assert.Equal(t, []bool{true, false, false}, []bool{res.Epochs[0].Best, res.Epochs[1].Best, res.Epochs[2].Best})
	assert.Equal(t, []trainer.Position{{Epoch: 1}}, bestAt)
	assert.Equal(t, []trainer.Position{{Epoch: 1}, {Epoch: 2}, {Epoch: 3}}, saved, "the epoch that stops is saved too")
	assert.Equal(t, 1, best.Epoch)

	// resumed after epoch 2 (stopped by MaxSteps), with the state its
	// checkpoint held: it stops after epoch 3 as well
	sess = m.Session(t, 1)
	sess.LR = 1e-30
	first, _ := trainer.NewBest("loss", 2)
	res, _ = run(sess, first, trainer.Position{}, 4) // 2 steps per epoch
	require.Equal(t, trainer.StepLimit, res.Stop)
	meta := first.Meta()
	again, _ := trainer.NewBest("loss", 2)
	ok, err := again.Restore(meta)
	require.NoError(t, err)
	require.True(t, ok)
	res, _ = run(sess, again, res.At, 0)
	assert.Equal(t, trainer.EarlyStopped, res.Stop)
	require.Len(t, res.Epochs, 1)
	assert.Equal(t, 3, res.Epochs[0].Epoch)
	assert.Empty(t, bestAt)
	// and resumed once more, it has nothing left to do
	res, _ = run(sess, again, res.At, 0)
	assert.Equal(t, trainer.EarlyStopped, res.Stop)
	assert.Empty(t, res.Epochs)

	l := &trainer.Loop{Session: sess, Train: train, Epochs: 1, Best: best}
	assert.ErrorContains(t, l.Prepare(), "choosing the best epoch by test loss needs test data")
}
