package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"syscall"

	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// openData opens --test and --data as the data block's formats. Errors
// name the flag, and the data block's line when the path is its default.
func (r *runner) openData() error {
	o := r.o
	if o.test != "" {
		ds, err := r.openSource("test", o.test, testSource(r.spec))
		if err != nil {
			return err
		}
		r.test = ds
		if o.evalOnly {
			return nil
		}
	}
	if err := r.checkDataGiven(); err != nil {
		return err
	}
	ds, err := r.openSource("data", o.data, r.spec.TrainData)
	r.train = ds
	if err != nil || r.test == nil {
		return err
	}
	if err := trainer.CheckSameClasses(r.train, r.test); err != nil {
		return fmt.Errorf("%s: %s: %w; give it the class folders of --data %s (an empty one needs --skip-bad)",
			r.origin("test", testSource(r.spec)), o.test, err, o.data)
	}
	return nil
}

// checkDataGiven refuses an empty --data where the run needs it: for
// training, or for --eval-only without --test.
func (r *runner) checkDataGiven() error {
	o := r.o
	switch {
	case o.data != "" || o.evalOnly && o.test != "":
		return nil
	case o.evalOnly:
		return usagef("--eval-only evaluates --test, or --data when --test is empty: give one")
	case r.spec.TrainData.Path == "":
		return usagef("--data is needed: model %s has no data block to take it from", r.spec.Model)
	}
	return usagef("--data is empty: give the training data")
}

// openSource opens one data flag's dataset.
func (r *runner) openSource(flag, path string, src trainer.DataSource) (data.Dataset, error) {
	kind := src.Kind
	if kind == "" {
		kind = "imagefolder" // no data block
	}
	ds, err := data.OpenDataset(kind, path, flag == "data", data.ImageFolderOptions{
		Shape:   data.Shape{H: r.spec.H, W: r.spec.W, C: r.spec.C},
		SkipBad: r.o.skipBad, CacheDir: r.o.cacheDir, Rehash: r.o.rehash, Warn: r.warn,
	})
	if err == nil {
		r.closers = append(r.closers, ds.Close)
		err = trainer.CheckDataset(r.spec, ds)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.origin(flag, src), err)
	}
	return ds, nil
}

// origin names where a data path came from: the flag, or the data block.
func (r *runner) origin(flag string, src trainer.DataSource) string {
	if r.o.changed(flag) || src.Path == "" {
		return "--" + flag
	}
	where := "the data block"
	if src.Where != "" {
		where += ", " + src.Where
	}
	return fmt.Sprintf("--%s (default from %s)", flag, where)
}

// evalOnly evaluates --test, or --data, and stops.
func (r *runner) evalOnly() (int, error) {
	ds := r.test
	if ds == nil {
		ds = r.train
	}
	ev, err := trainer.Evaluate(context.Background(), r.sess, ds, r.o.batch)
	if err != nil {
		return ExitError, err
	}
	fmt.Fprintf(r.out, "eval: loss %.4f, accuracy %.2f%% (%d images)\n", ev.Loss, 100*ev.Accuracy, ev.Samples)
	return ExitOK, nil
}

// runTraining trains with the library's loop, the command line's
// progress, log, curves and checkpoints around it, and reports the end.
func (r *runner) runTraining() (int, error) {
	o := r.o
	loop := &trainer.Loop{Session: r.sess, Train: r.train, Test: r.test, Epochs: o.epochs, Batch: o.batch,
		NoShuffle: o.noShuffle, MaxSteps: o.maxSteps, Schedule: r.spec.Schedule}
	if err := loop.Prepare(); err != nil {
		return ExitError, err
	}
	if s := r.spec.Schedule; !s.IsConstant() {
		fmt.Fprintf(r.out, "learning rate: %s of base %v (--lr) over %d epochs of %d steps\n", s, r.sess.LR, o.epochs, loop.BatchesPerEpoch())
	}
	if err := r.startPosition(loop); err != nil {
		return ExitError, err
	}
	if err := r.openLog(); err != nil {
		return ExitError, err
	}
	if o.checkpoint != "" {
		loop.Save = func(at trainer.Position) error { return r.save(o.checkpoint, at) }
	}
	if err := r.followBest(loop); err != nil {
		return ExitError, err
	}
	rec := newRecorder(r, loop.BatchesPerEpoch())
	loop.OnStep, loop.OnEpoch = rec.step, rec.epoch
	r.sess.TraceGaps = o.profile > 0 // --profile shows the host gap per step
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := loop.Run(ctx)
	rec.progress.done()
	return r.report(res, err, rec, loop.BatchesPerEpoch())
}

// save writes the checkpoint of the run at position at to path, unless
// the data-parallel job has failed: a collective that an abort cut short
// may have left the parameters half summed.
func (r *runner) save(path string, at trainer.Position) error {
	if err := r.jobFailed(); err != nil {
		return err
	}
	return r.sess.Save(path, r.runMeta(at))
}

// runMeta is what a checkpoint of the run at position at says besides the
// session's own metadata: where the run is and its settings, the best
// epoch's state (--keep-best, --patience), the class names.
func (r *runner) runMeta(at trainer.Position) map[string]string {
	o := r.o
	st := trainer.RunState{Position: at, Epochs: o.epochs, Batch: o.batch, NoShuffle: o.noShuffle, Samples: r.train.Len()}
	meta := st.Meta()
	if r.best != nil {
		maps.Copy(meta, r.best.Meta())
	}
	if names := trainer.ClassNames(r.train); names != nil {
		meta[trainer.MetaClasses] = trainer.EncodeClassNames(names)
	}
	return meta
}

// followBest hands --keep-best and --patience to the loop, with the best
// so far when resuming a run that followed the same metric.
func (r *runner) followBest(loop *trainer.Loop) error {
	o := r.o
	if r.best == nil {
		if by := trainer.FollowedBy(r.meta); by != "" {
			// say so: a later resume with --keep-best must not be
			// surprised that the best epoch is chosen afresh
			fmt.Fprintf(r.out, "the checkpoint's run followed the test %s (--keep-best, --patience); this run does not, so checkpoints it writes forget the best epoch\n", by)
		}
		return nil
	}
	loop.Best = r.best
	if o.keepBest != "" {
		loop.SaveBest = func(at trainer.Position) error { return r.save(o.keepBest, at) }
	}
	if r.meta == nil {
		return nil
	}
	ok, err := r.best.Restore(r.meta)
	switch {
	case err != nil:
		return fmt.Errorf("--resume %s: %w", o.resume, err)
	case ok && r.best.Epoch > 0:
		fmt.Fprintf(r.out, "best so far: %s (%d epochs since)\n", r.best.Describe(), r.best.Stale)
	case !ok && trainer.FollowedBy(r.meta) != "":
		fmt.Fprintf(r.out, "--keep-best-by %s: the checkpoint's run followed the test %s; the best epoch is chosen afresh from here\n", o.keepBestBy, trainer.FollowedBy(r.meta))
	}
	return nil
}

// startPosition checks a resumed run's state against the data and starts
// the loop where it was.
func (r *runner) startPosition(loop *trainer.Loop) error {
	st := r.resumed
	if st == nil {
		return nil
	}
	if err := st.Check(r.sess.Step, r.train.Len(), loop.BatchesPerEpoch()); err != nil {
		return fmt.Errorf("--resume %s: %w", r.o.resume, err)
	}
	loop.Start = st.Position
	fmt.Fprintf(r.out, "resuming from %s at step %d, %s\n", r.o.resume, r.sess.Step, st.Position.Describe(loop.BatchesPerEpoch()))
	return nil
}

// openLog opens --log: appended to when resuming (the run goes on), else
// written anew.
func (r *runner) openLog() error {
	if r.o.log == "" {
		return nil
	}
	l, err := openJSONLog(r.o.log, r.resumed != nil)
	if err != nil {
		return err
	}
	r.log = l
	r.closers = append(r.closers, l.close)
	return nil
}

// report says how the run ended and returns its exit code.
func (r *runner) report(res trainer.Result, err error, rec *recorder, perEpoch int) (int, error) {
	o := r.o
	code, err := r.explain(res, err, rec, perEpoch)
	if perr := rec.plot(); perr != nil && code == ExitOK {
		code, err = ExitError, perr
	}
	if r.log != nil {
		if lerr := r.log.close(); lerr != nil && code == ExitOK {
			code, err = ExitError, lerr
		}
	}
	if code == ExitOK && o.plot != "" && rec.steps > 0 {
		fmt.Fprintf(r.out, "curves written to %s\n", o.plot)
	}
	return code, err
}

// explain turns the loop's result into a message and an exit code.
func (r *runner) explain(res trainer.Result, err error, rec *recorder, perEpoch int) (int, error) {
	o := r.o
	var div *trainer.DivergedError
	switch {
	case errors.As(err, &div):
		msg := err.Error() + "; stopping"
		if o.checkpoint != "" {
			msg += fmt.Sprintf(". %s still holds the last good checkpoint", o.checkpoint)
		}
		return ExitDiverged, errors.New(msg + ". Try a lower --lr")
	case err != nil:
		return ExitError, err
	case res.Stop == trainer.EarlyStopped:
		fmt.Fprintln(r.out, r.earlyStopLine(rec))
	case res.Stop == trainer.Interrupted:
		if o.checkpoint != "" {
			return ExitInterrupted, fmt.Errorf("interrupted after step %d; checkpoint written to %s. Continue with: --resume %s", r.sess.Step, o.checkpoint, o.checkpoint)
		}
		return ExitInterrupted, fmt.Errorf("interrupted after step %d; no --checkpoint was given, so nothing was saved", r.sess.Step)
	case res.Stop == trainer.StepLimit && rec.steps == 0:
		fmt.Fprintf(r.out, "nothing to train: the run is at step %d, and --max-steps is %d\n", r.sess.Step, o.maxSteps)
	case res.Stop == trainer.StepLimit:
		line := fmt.Sprintf("stopped at --max-steps %d: step %d, %s", o.maxSteps, r.sess.Step, res.At.Describe(perEpoch))
		if o.checkpoint != "" {
			line += fmt.Sprintf("; continue with --resume %s and a larger --max-steps", o.checkpoint)
		}
		fmt.Fprintln(r.out, line)
	case rec.steps == 0 && r.resumed != nil && o.changed("epochs"):
		fmt.Fprintf(r.out, "nothing to train: the run is %s, and --epochs is %d\n", res.At.Describe(perEpoch), o.epochs)
	case rec.steps == 0 && r.resumed != nil:
		fmt.Fprintf(r.out, "nothing to train: the run is %s, the last of its %d (--epochs N trains on to epoch N)\n", res.At.Describe(perEpoch), o.epochs)
	}
	return ExitOK, nil
}

// earlyStopLine says why --patience ended the run, and where the best is.
func (r *runner) earlyStopLine(rec *recorder) string {
	o, b := r.o, r.best
	line := fmt.Sprintf("stopped early: the test %s has not improved for %d epochs (--patience %d); the best is %s", b.By, b.Stale, b.Patience, b.Describe())
	if rec.steps == 0 {
		line = "nothing to train: " + line
	}
	if o.keepBest != "" {
		line += ", in " + o.keepBest
	}
	return line
}

// jsonLog is --log: one JSON object per line; a failed write stops the
// run with its error.
type jsonLog struct {
	f      *os.File
	enc    *json.Encoder
	path   string
	closed bool
}

func openJSONLog(path string, appendTo bool) (*jsonLog, error) {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appendTo {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--log: %w", err)
	}
	return &jsonLog{f: f, enc: json.NewEncoder(f), path: path}, nil
}

func (l *jsonLog) write(v any) error {
	if err := l.enc.Encode(v); err != nil {
		return fmt.Errorf("--log %s: %w", l.path, err)
	}
	return nil
}

func (l *jsonLog) close() error {
	if l.closed {
		return nil
	}
	l.closed = true
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("--log %s: %w", l.path, err)
	}
	return nil
}
