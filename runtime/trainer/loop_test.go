package trainer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// saves records a loop's checkpoints: where each would resume, and the
// session's step then.
type saves struct {
	sess  *trainer.Session
	at    []trainer.Position
	steps []int64
}

func (s *saves) save(p trainer.Position) error {
	s.at = append(s.at, p)
	s.steps = append(s.steps, s.sess.Step)
	return nil
}

func newLoop(sess *trainer.Session, ds *trainertest.Memory, epochs int) (*trainer.Loop, *saves) {
	sv := &saves{sess: sess}
	return &trainer.Loop{Session: sess, Train: ds, Epochs: epochs, Save: sv.save}, sv
}

// --max-steps is honoured when it falls on an epoch's end (it used to be
// read only inside an epoch: 2 batches per epoch and a limit of 2 ran
// every epoch), and the run says it stopped there.
func TestLoopStepLimitAtEpochEnd(t *testing.T) {
	m := trainertest.Tiny(t)
	sess := m.Session(t, 1)
	loop, sv := newLoop(sess, trainertest.Data(m.Spec, 8, 1), 5) // 2 batches per epoch
	loop.MaxSteps = 2
	res, err := loop.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(2), sess.Step)
	assert.Equal(t, trainer.StepLimit, res.Stop)
	assert.Equal(t, trainer.Position{Epoch: 1}, res.At)
	require.Len(t, res.Epochs, 1)
	assert.False(t, res.Epochs[0].Partial)
	assert.Equal(t, []trainer.Position{{Epoch: 1}}, sv.at)

	// inside an epoch: the epoch is partial, the checkpoint resumes there
	sess = m.Session(t, 1)
	loop, sv = newLoop(sess, trainertest.Data(m.Spec, 12, 1), 5) // 3 per epoch
	loop.MaxSteps = 4
	res, err = loop.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, trainer.StepLimit, res.Stop)
	assert.Equal(t, trainer.Position{Epoch: 1, Batch: 1}, res.At)
	assert.True(t, res.Epochs[1].Partial)
	assert.Equal(t, []trainer.Position{{Epoch: 1}, {Epoch: 1, Batch: 1}}, sv.at)
	assert.Equal(t, "in epoch 2 after batch 1 of 3", res.At.Describe(3))
}

// MaxSteps counts steps in total, across resumed runs, as documented; and
// a run stopped by MaxSteps and resumed ends exactly where an
// uninterrupted run does.
func TestLoopStepLimitIsTotalAcrossResume(t *testing.T) {
	m := trainertest.Tiny(t)
	ds := trainertest.Data(m.Spec, 12, 2)
	whole := m.Session(t, 5)
	loop, _ := newLoop(whole, ds, 3)
	_, err := loop.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(9), whole.Step)

	part := m.Session(t, 5)
	loop, sv := newLoop(part, ds, 3)
	loop.MaxSteps = 4
	res, err := loop.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(4), part.Step)
	// the same session goes on as a resumed run would: from the position
	loop, _ = newLoop(part, ds, 3)
	loop.Start, loop.MaxSteps = res.At, 4
	res, err = loop.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(4), part.Step, "4 steps in total already: nothing to do")
	assert.Equal(t, trainer.StepLimit, res.Stop)
	loop, _ = newLoop(part, ds, 3)
	loop.Start, loop.MaxSteps = sv.at[len(sv.at)-1], 7
	res, err = loop.Run(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(7), part.Step)
	loop, _ = newLoop(part, ds, 3)
	loop.Start = res.At
	_, err = loop.Run(context.Background())
	require.NoError(t, err)
	sameState(t, whole, part)
}

// Cancelling the context stops after the current step and saves where to
// resume; the resumed run ends as the uninterrupted one.
func TestLoopInterruptSavesAndResumesExactly(t *testing.T) {
	m := trainertest.Tiny(t)
	ds := trainertest.Data(m.Spec, 12, 3)
	whole := m.Session(t, 2)
	loop, _ := newLoop(whole, ds, 2)
	_, err := loop.Run(context.Background())
	require.NoError(t, err)

	part := m.Session(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	loop, sv := newLoop(part, ds, 2)
	loop.OnStep = func(s *trainer.StepMetrics) error {
		if s.Step == 2 {
			cancel()
		}
		return nil
	}
	res, err := loop.Run(ctx)
	require.NoError(t, err)
	assert.Equal(t, trainer.Interrupted, res.Stop)
	assert.Equal(t, int64(2), part.Step)
	assert.Equal(t, []trainer.Position{{Epoch: 0, Batch: 2}}, sv.at)
	loop, _ = newLoop(part, ds, 2)
	loop.Start = res.At
	_, err = loop.Run(context.Background())
	require.NoError(t, err)
	sameState(t, whole, part)
}

// An error from a callback (a --log that cannot be written) stops the run
// with that error, after saving: no training state is lost.
func TestLoopCallbackErrorStopsAfterSaving(t *testing.T) {
	m := trainertest.Tiny(t)
	sess := m.Session(t, 1)
	loop, sv := newLoop(sess, trainertest.Data(m.Spec, 12, 1), 2)
	full := errors.New("disk full")
	loop.OnStep = func(s *trainer.StepMetrics) error {
		if s.Step == 2 {
			return full
		}
		return nil
	}
	_, err := loop.Run(context.Background())
	assert.ErrorIs(t, err, full)
	assert.Equal(t, []trainer.Position{{Batch: 2}}, sv.at)
}

// A step whose update wrecks the parameters, right before a save, does
// not replace the last good checkpoint: the loss of the new parameters
// is checked first. (The loss a step returns is computed before its
// update, so the step's own loss cannot tell.)
func TestLoopNoCheckpointAfterADivergingUpdate(t *testing.T) {
	m := trainertest.Tiny(t)
	sess := m.Session(t, 1)
	loop, sv := newLoop(sess, trainertest.Data(m.Spec, 12, 4), 2) // 3 batches per epoch
	loop.OnStep = func(s *trainer.StepMetrics) error {
		if s.Step == 5 { // the next step, the epoch's last, updates with this rate
			sess.LR = 1e30
		}
		return nil
	}
	_, err := loop.Run(context.Background())
	var div *trainer.DivergedError
	require.ErrorAs(t, err, &div)
	assert.True(t, div.AtSave, "%v", err)
	assert.Equal(t, int64(6), div.Step)
	assert.Equal(t, []trainer.Position{{Epoch: 1}}, sv.at, "only epoch 1's checkpoint")
	assert.Contains(t, err.Error(), "after step 6 (epoch 2) the parameters diverge")
}

// A learning rate far too large stops the run with the divergence rule
// (exit 4 in a trainer), before any checkpoint of the wreck.
func TestLoopStopsAnExplodingLoss(t *testing.T) {
	m := trainertest.Tiny(t)
	sess := m.Session(t, 1)
	sess.LR = 50
	loop, sv := newLoop(sess, trainertest.Data(m.Spec, 40, 5), 3)
	_, err := loop.Run(context.Background())
	var div *trainer.DivergedError
	require.ErrorAs(t, err, &div)
	assert.False(t, div.AtSave)
	assert.Less(t, div.Step, int64(10), "%v", err)
	assert.Empty(t, sv.at)
	// the message counts batches from 1, as every other message does: the
	// step's batch within its epoch of 8 batches
	inEpoch := div.Step - int64(div.Epoch-1)*8
	assert.Contains(t, err.Error(), fmt.Sprintf("at step %d (epoch %d, batch %d)", div.Step, div.Epoch, inEpoch))
}

func TestDivergingRule(t *testing.T) {
	ln3 := math.Log(3)
	assert.Empty(t, trainer.Diverging(1.2, 1.1, 3))
	assert.Empty(t, trainer.Diverging(100*ln3, 0.01, 3), "at the bound: not yet")
	assert.Contains(t, trainer.Diverging(100*ln3+0.01, 0.01, 3), "exceeds 100 times 1.099")
	assert.Contains(t, trainer.Diverging(501, 5, 3), "exceeds 100 times 5")
	assert.Empty(t, trainer.Diverging(499, 5, 3))
	assert.Contains(t, trainer.Diverging(math.NaN(), 1, 3), "the loss became NaN")
	assert.Contains(t, trainer.Diverging(math.Inf(1), 1, 3), "became +Inf")
	assert.Empty(t, trainer.Diverging(2, math.Inf(1), 3), "a non-finite first loss falls back to ln(classes)")
}

// Evaluation is in order, whole, and leaves training alone.
func TestEvaluate(t *testing.T) {
	m := trainertest.Tiny(t)
	sess := m.Session(t, 1)
	ds := trainertest.Data(m.Spec, 10, 6) // a partial last batch
	ev, err := trainer.Evaluate(context.Background(), sess, ds, 0)
	require.NoError(t, err)
	assert.Equal(t, 10, ev.Samples)
	assert.InDelta(t, math.Log(3), ev.Loss, 1, "about a uniform guess at the start")
	assert.Equal(t, int64(0), sess.Step)
	bad := *ds
	bad.Classes = 4
	_, err = trainer.Evaluate(context.Background(), sess, &bad, 0)
	assert.ErrorContains(t, err, "the data has 4 classes but model Tiny predicts 3")
}

// An epoch's log line has test_loss and test_accuracy exactly when it was
// tested: a test accuracy of 0 is written, not dropped as empty.
func TestEpochMetricsJSONKeepsZeroTestAccuracy(t *testing.T) {
	b, err := json.Marshal(trainer.EpochMetrics{Epoch: 1, Step: 3, TrainLoss: 2.5, Tested: true, TestLoss: 2.75, TestAcc: 0})
	require.NoError(t, err)
	assert.JSONEq(t, `{"epoch":1,"step":3,"train_loss":2.5,"train_accuracy":0,"test_loss":2.75,"test_accuracy":0,"lr":0,"images_per_second":0}`, string(b))
	b, err = json.Marshal(trainer.EpochMetrics{Epoch: 1, Step: 3, Partial: true, Best: true})
	require.NoError(t, err)
	assert.JSONEq(t, `{"epoch":1,"step":3,"train_loss":0,"train_accuracy":0,"partial":true,"lr":0,"images_per_second":0,"best":true}`, string(b))
}
