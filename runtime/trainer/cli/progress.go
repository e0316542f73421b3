package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/cnnc/cnnc/runtime/trainer"
)

// recorder sees every step and epoch of a run: progress, --log, the
// curves of --plot, --profile.
type recorder struct {
	r        *runner
	progress *progress
	curves   curves
	steps    int // steps of this run
	// the traced steps' device times and host gaps, for --profile
	times, gaps []time.Duration
}

func newRecorder(r *runner, perEpoch int) *recorder {
	var w io.Writer
	if !r.o.quiet {
		w = r.o.stderr
	}
	return &recorder{r: r, progress: newProgress(w, r.o.stderrIsTerminal, r.o.progressEvery, r.o.epochs, perEpoch)}
}

func (rec *recorder) step(m *trainer.StepMetrics) error {
	rec.steps++
	rec.progress.step(m)
	if rec.r.o.plot != "" {
		rec.curves.addStep(m)
	}
	if rec.r.log != nil {
		if err := rec.r.log.write(m); err != nil {
			return err
		}
	}
	if m.Timed {
		rec.times = append(rec.times, m.DeviceTime)
		if m.HasGap {
			rec.gaps = append(rec.gaps, m.HostGap)
		}
	}
	if p := rec.r.o.profile; p > 0 && rec.steps == p {
		if err := printProfile(rec.r.sess, m.Input, rec.r.out, rec.r.o.roofline); err != nil {
			return err
		}
		printHostGaps(rec.r.out, rec.r.sess, rec.times, rec.gaps)
	}
	return nil
}

func (rec *recorder) epoch(e *trainer.EpochMetrics) error {
	rec.progress.endEpoch()
	o := rec.r.o
	head := fmt.Sprintf("epoch %d/%d", e.Epoch, o.epochs)
	if e.Partial {
		head += fmt.Sprintf(" (stopped by --max-steps after batch %d of %d)", rec.progress.batch, rec.progress.perEpoch)
	}
	line := fmt.Sprintf("%s: train loss %.4f, train accuracy %.2f%%", head, e.TrainLoss, 100*e.TrainAcc)
	if e.Tested {
		line += fmt.Sprintf(", test loss %.4f, test accuracy %.2f%%", e.TestLoss, 100*e.TestAcc)
	}
	line += fmt.Sprintf(", lr %.4g, %.0f images/s", e.LR, e.Throughput)
	if e.Best {
		line += " (best so far"
		if o.keepBest != "" {
			line += ": written to " + o.keepBest
		}
		line += ")"
	}
	fmt.Fprintln(rec.r.out, line)
	if o.plot != "" {
		rec.curves.epochs = append(rec.curves.epochs, *e)
	}
	if rec.r.log != nil {
		return rec.r.log.write(e)
	}
	return nil
}

func (rec *recorder) plot() error {
	if rec.r.o.plot == "" || rec.steps == 0 {
		return nil
	}
	if err := rec.curves.draw(rec.r.o.plot, rec.r.spec.Model); err != nil {
		return fmt.Errorf("--plot %s: %w", rec.r.o.plot, err)
	}
	return nil
}

// isTerminal says whether w is a terminal (not a file or a pipe).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress shows where an epoch is: a bar redrawn in place on a terminal;
// elsewhere (a log file, a pipe) a line every so often, so that a
// redirected log holds lines, not a stream of carriage returns.
type progress struct {
	w               io.Writer // nil: quiet
	terminal        bool
	every           time.Duration
	now             func() time.Time
	epochs          int
	perEpoch, batch int
	epoch           int // shown epoch, from 1 (0: none yet)
	bar             *progressbar.ProgressBar
	start, last     time.Time
	seen            int
	loss            float32
}

func newProgress(w io.Writer, terminal bool, every time.Duration, epochs, perEpoch int) *progress {
	return &progress{w: w, terminal: terminal, every: every, now: time.Now, epochs: epochs, perEpoch: perEpoch}
}

func (p *progress) step(m *trainer.StepMetrics) {
	if m.Epoch != p.epoch {
		p.beginEpoch(m.Epoch, m.Batch)
	}
	p.batch, p.loss = m.Batch+1, m.Loss
	p.seen += m.Size
	if p.w == nil {
		return
	}
	if p.bar != nil {
		p.bar.Describe(p.describe())
		p.bar.Set(p.batch)
		return
	}
	if now := p.now(); now.Sub(p.last) >= p.every {
		p.last = now
		fmt.Fprintf(p.w, "%s, batch %d/%d\n", p.describe(), p.batch, p.perEpoch)
	}
}

func (p *progress) beginEpoch(epoch, first int) {
	p.endEpoch()
	p.epoch, p.batch, p.seen = epoch, first, 0
	p.start = p.now()
	p.last = p.start
	if p.w != nil && p.terminal {
		p.bar = progressbar.NewOptions(p.perEpoch, progressbar.OptionSetWriter(p.w), progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch, p.epochs)),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionClearOnFinish())
		p.bar.Set(first)
	}
}

func (p *progress) describe() string {
	rate := float64(p.seen) / max(p.now().Sub(p.start).Seconds(), 1e-9)
	return fmt.Sprintf("epoch %d/%d loss %.4f %.0f img/s", p.epoch, p.epochs, p.loss, rate)
}

// endEpoch clears the bar (the epoch's line follows on stdout).
func (p *progress) endEpoch() {
	if p.bar != nil {
		p.bar.Finish()
		p.bar = nil
	}
}

func (p *progress) done() { p.endEpoch() }
