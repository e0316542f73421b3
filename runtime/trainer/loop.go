package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/schedule"
)

// Position is where a run is: the epoch in progress (from 0) and the
// batches of it already trained. A finished epoch e is Position{e+1, 0}.
type Position struct{ Epoch, Batch int }

// Describe says where p is in words, with batches per epoch.
func (p Position) Describe(perEpoch int) string {
	switch {
	case p.Epoch == 0 && p.Batch == 0:
		return "at the start"
	case p.Batch == 0:
		return fmt.Sprintf("after epoch %d", p.Epoch)
	}
	return fmt.Sprintf("in epoch %d after batch %d of %d", p.Epoch+1, p.Batch, perEpoch)
}

// StopReason says why Loop.Run returned without an error.
type StopReason int

const (
	Finished     StopReason = iota // every epoch trained
	StepLimit                      // Session.Step reached MaxSteps
	Interrupted                    // the context was cancelled
	EarlyStopped                   // Best's patience ran out
)

// StepMetrics is one training step (one line of a trainer's --log).
type StepMetrics struct {
	Step    int64   `json:"step"`  // steps done, this one included
	Epoch   int     `json:"epoch"` // from 1
	Batch   int     `json:"batch"` // from 0, within the epoch
	Loss    float32 `json:"loss"`  // the batch's mean loss, before this step's update
	Correct int     `json:"correct"`
	Size    int     `json:"size"` // samples in the batch
	LR      float32 `json:"lr"`   // the learning rate of this step's update
	// Batches is the number of batches per epoch.
	Batches int `json:"-"`
	// Input is the batch trained on, valid during the callback only.
	Input Batch `json:"-"`
	// With Session.TraceGaps (Timed): the step's device time, and (HasGap)
	// how long the device waited for the host before it (StepResult).
	DeviceTime, HostGap time.Duration `json:"-"`
	Timed, HasGap       bool          `json:"-"`
}

// EpochMetrics ends an epoch, or the part of it a run trained (Partial).
type EpochMetrics struct {
	Epoch     int     `json:"epoch"` // from 1
	Step      int64   `json:"step"`
	TrainLoss float64 `json:"train_loss"` // mean over the samples this run trained in the epoch
	TrainAcc  float64 `json:"train_accuracy"`
	TestLoss  float64 `json:"test_loss,omitempty"`
	TestAcc   float64 `json:"test_accuracy,omitempty"`
	Partial   bool    `json:"partial,omitempty"` // the run stopped inside the epoch (MaxSteps)
	Tested    bool    `json:"-"`                 // TestLoss and TestAcc are set

	// LR is the rate of the epoch's last step.
	LR float32 `json:"lr"`
	// Throughput is the images trained per second of the epoch's training
	// (data loading included, the evaluation after it not).
	Throughput float64 `json:"images_per_second"`
	// Best says the epoch improved on the best so far (Loop.Best), and
	// was saved through SaveBest.
	Best bool `json:"best,omitempty"`
}

// MarshalJSON writes test_loss and test_accuracy exactly when the epoch
// was tested, zeros included: a log reader must tell a test accuracy of
// 0 from no test.
func (m EpochMetrics) MarshalJSON() ([]byte, error) {
	type plain EpochMetrics // without this method
	v := struct {
		plain
		TestLoss *float64 `json:"test_loss,omitempty"`
		TestAcc  *float64 `json:"test_accuracy,omitempty"`
	}{plain: plain(m)}
	if m.Tested {
		v.TestLoss, v.TestAcc = &m.TestLoss, &m.TestAcc
	}
	return json.Marshal(v)
}

// Loop trains a Session over a dataset: epochs of batches in the Loader's
// order (the same on every run for a seed), from a Position, until
// Epochs, MaxSteps, an error, a diverging loss or the context stops it.
// Checkpoints go through Save at the end of each epoch and when the run
// stops early, only after the new parameters have given a finite loss.
//
// Steps are submitted to the session without waiting for them
// (Session.Submit): their losses arrive up to PipelineDepth steps late on
// a pipelined device, so the divergence rule and OnStep see a step while
// the next ones run, and the epoch's end, an evaluation and every save
// first wait for all of them (Session.Flush) — a checkpoint never holds
// parameters whose loss was not seen to be good.
type Loop struct {
	Session *Session
	Train   data.Dataset
	// Test, when set, is evaluated after each epoch.
	Test   data.Dataset
	Epochs int
	Batch  int // samples per step; 0: the compiled batch
	// Schedule sets every step's learning rate from the session's base
	// rate LR, the step's position, the batches per epoch and Epochs
	// (schedule.Schedule.LR): a pure function of the position, so a
	// resumed run has the rates of an uninterrupted one. The zero value
	// keeps LR.
	Schedule  schedule.Schedule
	NoShuffle bool
	// MaxSteps stops the run when Session.Step (steps in total, across
	// resumed runs) reaches it; 0: no limit.
	MaxSteps int64
	Start    Position
	// Save, when set, writes a checkpoint to resume from pos. Loop calls
	// it at each epoch's end and when the run stops early (MaxSteps, the
	// context, a callback's error), never after a diverging step.
	Save func(pos Position) error
	// OnStep and OnEpoch, when set, see every step and epoch; an error
	// from them stops the run (after saving).
	OnStep  func(m *StepMetrics) error
	OnEpoch func(m *EpochMetrics) error
	// Best, when set, observes every whole epoch's test evaluation (Test
	// is needed); an epoch that improves on the best so far is written
	// through SaveBest (before Save, which then carries Best's state), and
	// the run stops (EarlyStopped) when Best's patience runs out.
	Best     *Best
	SaveBest func(pos Position) error

	loader    *data.Loader
	perEpoch  int
	firstLoss float64 // this run's first step loss (the divergence rule's scale)
	guard     Batch   // a copy of this run's first batch: checks parameters before a save
	lastEpoch int     // the epoch (from 1) of the last step
	sums      *epochSums
	// stepErr is the error OnStep returned: the run stops with it, and the
	// steps still in flight then skip OnStep.
	stepErr error
	// asked is Run's context: its end asks the run to stop (interrupted).
	asked context.Context
}

// Result is how a run ended.
type Result struct {
	Stop StopReason
	// At is where the run stopped: a later run resumes from here.
	At     Position
	Epochs []EpochMetrics
}

// BatchesPerEpoch is the number of steps an epoch takes (after Run
// started, or Prepare).
func (l *Loop) BatchesPerEpoch() int { return l.perEpoch }

// Prepare checks the settings against the data and makes the loader; Run
// calls it when it has not been called.
func (l *Loop) Prepare() error {
	if l.loader != nil {
		return nil
	}
	sp := l.Session.Spec
	most, ranks := sp.Batch, 0
	if l.Session.reducer != nil { // a data-parallel rank: Batch is the global batch
		most, ranks = sp.DataParallel.GlobalBatch, sp.DataParallel.Ranks
	}
	if l.Batch == 0 {
		l.Batch = most
	}
	if l.Batch < 1 || l.Batch > most {
		return fmt.Errorf("batch %d: the model was compiled for batches of 1 to %d", l.Batch, most)
	}
	if ranks > 0 && l.Batch != most {
		// a rank's first-sample arguments place its share at rank·(compiled share)
		return fmt.Errorf("batch %d: the %d data-parallel ranks were compiled for the global batch %d", l.Batch, ranks, most)
	}
	if err := CheckDataset(sp, l.Train); err != nil {
		return err
	}
	if l.Test != nil {
		if err := CheckDataset(sp, l.Test); err != nil {
			return err
		}
		if err := CheckSameClasses(l.Train, l.Test); err != nil {
			return fmt.Errorf("test data: %w", err)
		}
	} else if l.Best != nil {
		return fmt.Errorf("choosing the best epoch by test %s needs test data", l.Best.By)
	}
	loader, err := data.NewLoader(l.Train, data.LoaderOptions{BatchSize: l.Batch, Seed: l.Session.Seed, NoShuffle: l.NoShuffle,
		Rank: l.Session.rank, Ranks: ranks})
	if err != nil {
		return err
	}
	if err := l.Schedule.Check(loader.BatchesPerEpoch(), l.Epochs); err != nil {
		return fmt.Errorf("learning-rate schedule: %w", err)
	}
	l.loader, l.perEpoch = loader, loader.BatchesPerEpoch()
	return nil
}

// StepLR is the learning rate of the step at position (epoch, batch).
func (l *Loop) StepLR(epoch, batch int) float32 {
	step := int64(epoch)*int64(l.perEpoch) + int64(batch)
	return float32(l.Schedule.LR(float64(l.Session.LR), step, l.perEpoch, l.Epochs))
}

// CheckDataset refuses data the model cannot take: images of another
// shape, more classes than it predicts.
func CheckDataset(sp *Spec, ds data.Dataset) error {
	if s := ds.Shape(); s != (data.Shape{H: sp.H, W: sp.W, C: sp.C}) {
		return fmt.Errorf("the data's images are %v (HxWxC) but model %s takes %dx%dx%d", s, sp.Model, sp.H, sp.W, sp.C)
	}
	if n := ds.NumClasses(); n > sp.Classes {
		return fmt.Errorf("the data has %d classes but model %s predicts %d", n, sp.Model, sp.Classes)
	}
	return nil
}

// Run trains until the last epoch, MaxSteps or ctx stops it.
func (l *Loop) Run(ctx context.Context) (Result, error) {
	res := Result{At: l.Start}
	l.stepErr = nil
	if err := l.Prepare(); err != nil {
		return res, err
	}
	if l.Start.Epoch < 0 || l.Start.Batch < 0 || l.Start.Batch >= l.perEpoch {
		return res, fmt.Errorf("cannot start in epoch %d after batch %d: an epoch has %d batches", l.Start.Epoch+1, l.Start.Batch, l.perEpoch)
	}
	l.asked = ctx
	if l.Session.reducer != nil {
		// data-parallel ranks stop together, as interrupted agrees: the
		// loader and evaluation run on
		ctx = context.WithoutCancel(ctx)
	}
	for res.At.Epoch < l.Epochs && res.Stop == Finished {
		if l.Best != nil && l.Best.Exhausted() {
			res.Stop = EarlyStopped // a resumed run that had stopped early
			return res, nil
		}
		stop, err := l.interrupted()
		if err != nil {
			return res, err
		}
		switch {
		case stop:
			res.Stop = Interrupted
			return res, l.save(res.At)
		case l.atStepLimit():
			res.Stop = StepLimit
			return res, nil
		}
		if err := l.runEpoch(ctx, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (l *Loop) atStepLimit() bool { return l.MaxSteps > 0 && l.Session.Step >= l.MaxSteps }

// epochSums add up an epoch's steps.
type epochSums struct {
	loss          float64
	correct, seen int
	lr            float32 // the last step's
}

// runEpoch trains the rest of res.At's epoch, evaluates and saves.
func (l *Loop) runEpoch(ctx context.Context, res *Result) error {
	epoch := res.At.Epoch
	var sums epochSums
	l.sums = &sums
	start := time.Now()
	stop, err := l.trainBatches(ctx, &res.At)
	if err == nil && stop != Interrupted {
		err = l.flush(res.At) // every step's loss is in the epoch's sums
	}
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	if stop == Interrupted {
		res.Stop = Interrupted
		return l.save(res.At)
	}
	partial := res.At.Batch < l.perEpoch
	if partial {
		res.Stop = StepLimit
	} else {
		res.At = Position{Epoch: epoch + 1}
	}
	ep := EpochMetrics{Epoch: epoch + 1, Step: l.Session.Step, Partial: partial, LR: sums.lr}
	if sums.seen > 0 {
		ep.TrainLoss, ep.TrainAcc = sums.loss/float64(sums.seen), float64(sums.correct)/float64(sums.seen)
		ep.Throughput = float64(sums.seen) / max(elapsed.Seconds(), 1e-9)
	}
	if l.Test != nil {
		// every data-parallel rank evaluates (the same parameters, the same
		// result), so that the best epoch and early stopping agree
		ev, err := Evaluate(ctx, l.Session, l.Test, min(l.Batch, l.Session.Spec.Batch))
		if err != nil {
			return l.saveAfter(res.At, fmt.Errorf("evaluating after epoch %d: %w", epoch+1, err))
		}
		ep.TestLoss, ep.TestAcc, ep.Tested = ev.Loss, ev.Accuracy, true
	}
	if l.Best != nil && ep.Tested && !partial {
		ep.Best = l.Best.Observe(ep)
		if l.Best.Exhausted() && res.At.Epoch < l.Epochs {
			res.Stop = EarlyStopped // (after the last epoch the run is simply done)
		}
	}
	res.Epochs = append(res.Epochs, ep)
	if l.OnEpoch != nil {
		if err := l.OnEpoch(&ep); err != nil {
			return l.saveAfter(res.At, err)
		}
	}
	return l.saveEpoch(res.At, ep.Best)
}

// saveEpoch saves at an epoch's end: the best checkpoint first when the
// epoch improved (a crash between the two then repeats the epoch, which
// improves again), then the checkpoint; both after one check of the
// parameters. A failed best save still lets the checkpoint be written.
func (l *Loop) saveEpoch(at Position, best bool) error {
	if !best || l.SaveBest == nil {
		return l.save(at)
	}
	if err := l.Session.GatherOptimizerState(); err != nil {
		return err
	}
	if err := l.checkBeforeSave(); err != nil {
		return err
	}
	var errs []error
	if err := l.SaveBest(at); err != nil {
		errs = append(errs, fmt.Errorf("writing the best checkpoint: %w", err))
	}
	if l.Save != nil {
		if err := l.Save(at); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// trainBatches runs the batches of at's epoch from at.Batch on, moving at
// past each one submitted.
func (l *Loop) trainBatches(ctx context.Context, at *Position) (StopReason, error) {
	for b, err := range l.loader.Epoch(ctx, at.Epoch, at.Batch) {
		if err != nil {
			if ctx.Err() != nil {
				return Interrupted, nil
			}
			return Finished, err
		}
		if l.atStepLimit() {
			return StepLimit, nil
		}
		before := l.Session.Step
		err = l.step(Batch{Pixels: b.Pixels, Labels: b.Labels, Valid: b.Size(), GlobalValid: b.GlobalSize}, at.Epoch, b.Number)
		if l.Session.Step > before {
			at.Batch = b.Number + 1
		}
		if err != nil {
			return Finished, l.stopped(*at, err)
		}
		if at.Batch < l.perEpoch && l.agreesNow() {
			if stop, err := l.interrupted(); err != nil || stop {
				return Interrupted, err
			}
		}
	}
	if ctx.Err() != nil && at.Batch < l.perEpoch {
		return Interrupted, nil
	}
	return Finished, nil
}

// interrupted says whether the run stops for an interrupt here, at a
// step boundary: whether the run's context has ended; on data-parallel
// ranks, whether any rank's has, agreed (one all-reduce of a flag:
// Session.AgreeStop; every stopAgreeEvery steps, agreesNow), so that all
// stop after the same step.
func (l *Loop) interrupted() (bool, error) {
	return l.Session.AgreeStop(l.asked.Err() != nil)
}

// stopAgreeEvery is how many steps data-parallel ranks train between two
// agreements inside an epoch (they also agree at every epoch's start).
// Agreeing waits for the steps in flight (Session.Flush) and the flag's
// all-reduce, which on a GPU drains the host loop's pipeline: every 16
// steps keeps that under a sixteenth of the steps, and an interrupt stops
// the ranks at most 15 steps after it arrives.
const stopAgreeEvery = 16

// agreesNow says whether this step boundary checks for an interrupt: every
// boundary on one device (a context's Err costs nothing), every
// stopAgreeEvery-th step on data-parallel ranks — the same steps on every
// rank, as they count the same steps.
func (l *Loop) agreesNow() bool {
	return l.Session.reducer == nil || l.Session.Step%stopAgreeEvery == 0
}

// step submits a training step on b at the schedule's rate; the
// divergence rule and OnStep see its result when it arrives (finish).
func (l *Loop) step(b Batch, epoch, number int) error {
	if l.guard.Valid == 0 && b.Valid > 0 && (l.Save != nil || l.SaveBest != nil) {
		l.guard = Batch{Pixels: append([]uint8(nil), b.Pixels...), Labels: append([]int32(nil), b.Labels...), Valid: b.Valid}
	}
	lr := l.StepLR(epoch, number)
	l.Session.SetStepLR(lr)
	return l.Session.Submit(b, func(r StepResult) error { return l.finish(r, epoch, number, lr) })
}

// finish applies the divergence rule to a step's loss, adds the step to
// the epoch's sums and calls OnStep.
func (l *Loop) finish(r StepResult, epoch, number int, lr float32) error {
	m := StepMetrics{Step: r.Step, Epoch: epoch + 1, Batch: number, Loss: r.Loss, Correct: r.Correct, Size: r.Samples, LR: lr, Batches: l.perEpoch, Input: r.Input,
		HostGap: r.Gap, DeviceTime: r.Time, Timed: r.Timed, HasGap: r.HasGap}
	l.lastEpoch = m.Epoch
	if l.firstLoss == 0 {
		l.firstLoss = float64(r.Loss)
	}
	if why := Diverging(float64(r.Loss), l.firstLoss, l.Session.Spec.Classes); why != "" {
		return &DivergedError{Step: m.Step, Epoch: m.Epoch, Batch: number, Loss: float64(r.Loss), Why: why}
	}
	if l.sums != nil {
		l.sums.loss += float64(m.Loss) * float64(m.Size)
		l.sums.correct += m.Correct
		l.sums.seen += m.Size
		l.sums.lr = m.LR
	}
	if l.OnStep != nil && l.stepErr == nil {
		if err := l.OnStep(&m); err != nil {
			l.stepErr = err
			return err
		}
	}
	return nil
}

// stopped ends the run after err from a step: a diverging loss or a
// device error as it is, an error of OnStep after saving at.
func (l *Loop) stopped(at Position, err error) error {
	if l.stepErr != nil && errors.Is(err, l.stepErr) {
		return l.saveAfter(at, err)
	}
	return err
}

// flush waits for the steps in flight and sees their results (as
// stopped says when one of them stops the run).
func (l *Loop) flush(at Position) error {
	if err := l.Session.Flush(); err != nil {
		return l.stopped(at, err)
	}
	return nil
}

// ExplodeFactor is the divergence rule's factor: see Diverging.
const ExplodeFactor = 100

// Diverging applies the divergence rule to a loss, given the run's first
// loss and the number of classes, and says why the loss diverges ("" when
// it does not). The rule: the loss is NaN or infinite, or it exceeds
// ExplodeFactor times the larger of the run's first loss and ln(classes)
// (the cross-entropy of a uniform guess). A falling loss never comes near
// that bound, and a learning rate far too large passes it within a few
// steps (MNIST at lr 50 reaches 1e7).
func Diverging(loss, first float64, classes int) string {
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return fmt.Sprintf("the loss became %v", loss)
	}
	scale := math.Max(first, math.Log(float64(max(classes, 2))))
	if math.IsNaN(scale) || math.IsInf(scale, 0) {
		scale = math.Log(float64(max(classes, 2)))
	}
	if loss > ExplodeFactor*scale {
		return fmt.Sprintf("the loss %.4g exceeds %d times %.4g (the larger of the run's first loss and ln(%d classes))", loss, ExplodeFactor, scale, classes)
	}
	return ""
}

// DivergedError stops a run whose loss diverged (see Diverging). Nothing
// is saved after such a step: a checkpoint keeps the last good state.
type DivergedError struct {
	Step         int64 // the step that gave the loss (at a save: the last one trained)
	Epoch, Batch int   // its epoch (from 1) and batch (from 0)
	Loss         float64
	Why          string
	// AtSave is set when the loss came from the check before a save:
	// the parameters after the last step give it on a training batch.
	AtSave bool
}

func (e *DivergedError) Error() string {
	if e.AtSave {
		return fmt.Sprintf("after step %d (epoch %d) the parameters diverge: on a training batch %s; nothing was saved", e.Step, e.Epoch, e.Why)
	}
	return fmt.Sprintf("%s at step %d (epoch %d, batch %d)", e.Why, e.Step, e.Epoch, e.Batch+1) // batches count from 1 where users read them
}

// save sees the results of the steps in flight, checks the parameters on
// the guard batch (when this run has trained), then calls Save.
func (l *Loop) save(at Position) error {
	if err := l.Session.Flush(); err != nil {
		if l.stepErr != nil && errors.Is(err, l.stepErr) {
			return l.saveAfter(at, err) // OnStep failed on a step in flight
		}
		return err // a diverging step, or the device's error: nothing is saved
	}
	// a sharded optimizer's ranks all take part, whichever of them saves
	if err := l.Session.GatherOptimizerState(); err != nil {
		return err
	}
	if l.Save == nil {
		return nil
	}
	if err := l.checkBeforeSave(); err != nil {
		return err
	}
	return l.Save(at)
}

// checkBeforeSave runs the parameters forward on the guard batch (when
// this run has trained): a diverging loss there stops the run before any
// checkpoint of them is written.
func (l *Loop) checkBeforeSave() error {
	if l.guard.Valid == 0 {
		return nil
	}
	loss, _, err := l.Session.EvalBatch(l.guard)
	if err != nil {
		return err
	}
	if why := Diverging(float64(loss), l.firstLoss, l.Session.Spec.Classes); why != "" {
		return &DivergedError{Step: l.Session.Step, Epoch: l.lastEpoch, Loss: float64(loss), Why: why, AtSave: true}
	}
	return nil
}

// saveAfter saves at and returns err (with the save's error, if any).
func (l *Loop) saveAfter(at Position, err error) error {
	if serr := l.save(at); serr != nil {
		return errors.Join(err, fmt.Errorf("and the checkpoint could not be written: %w", serr))
	}
	return err
}

// Evaluation is a dataset's mean loss and accuracy.
type Evaluation struct {
	Loss, Accuracy float64
	Samples        int
}

// Evaluate runs the whole dataset through the forward pass (dropout off)
// in order, batch samples at a time (0: the compiled batch).
func Evaluate(ctx context.Context, sess *Session, ds data.Dataset, batch int) (Evaluation, error) {
	if batch == 0 {
		batch = sess.Spec.Batch
	}
	if err := CheckDataset(sess.Spec, ds); err != nil {
		return Evaluation{}, err
	}
	loader, err := data.NewLoader(ds, data.LoaderOptions{BatchSize: batch, NoShuffle: true})
	if err != nil {
		return Evaluation{}, err
	}
	var sumLoss float64
	var correct, seen int
	for b, err := range loader.Epoch(ctx, 0, 0) {
		if err != nil {
			return Evaluation{}, err
		}
		loss, c, err := sess.EvalBatch(Batch{Pixels: b.Pixels, Labels: b.Labels, Valid: b.Size()})
		if err != nil {
			return Evaluation{}, err
		}
		sumLoss += float64(loss) * float64(b.Size())
		correct += c
		seen += b.Size()
	}
	if err := ctx.Err(); err != nil {
		return Evaluation{}, err
	}
	if seen == 0 {
		return Evaluation{}, errors.New("the evaluation set is empty")
	}
	return Evaluation{Loss: sumLoss / float64(seen), Accuracy: float64(correct) / float64(seen), Samples: seen}, nil
}
