package cli

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// parseRoofline reads --roofline's GB/s,GFLOP/s peaks (0, 0 when empty).
func parseRoofline(s string) (gbs, gflops float64, err error) {
	if s == "" {
		return 0, 0, nil
	}
	if _, err := fmt.Sscanf(s, "%g,%g", &gbs, &gflops); err != nil || gbs <= 0 || gflops <= 0 {
		return 0, 0, fmt.Errorf("--roofline %q: want GB/s,GFLOP/s, e.g. 4800,67000", s)
	}
	return gbs, gflops, nil
}

// printProfile times the training step's launches one by one on b
// (Session.ProfileStep, which leaves training unchanged) and prints a
// table per kernel: calls, total and mean time, achieved GB/s and GFLOP/s
// from codegen's minimum bytes and FLOPs, and with --roofline the
// fraction of each kernel's roofline bound.
func printProfile(s *trainer.Session, b trainer.Batch, w io.Writer, roofline string) error {
	peakGBs, peakGFLOPs, err := parseRoofline(roofline)
	if err != nil {
		return err
	}
	times, events, err := s.ProfileStep(b)
	if err != nil {
		return err
	}
	type row struct {
		kernel       string
		calls        int
		total        time.Duration
		flops, bytes int64
	}
	rows := map[string]*row{}
	var order []string
	var all time.Duration
	for _, t := range times {
		r, ok := rows[t.Launch.Kernel]
		if !ok {
			r = &row{kernel: t.Launch.Kernel}
			rows[t.Launch.Kernel] = r
			order = append(order, t.Launch.Kernel)
		}
		r.calls++
		r.total += t.Time
		r.flops += t.Launch.FLOPs
		r.bytes += t.Launch.MinBytes
		all += t.Time
	}
	sort.SliceStable(order, func(i, j int) bool { return rows[order[i]].total > rows[order[j]].total })
	clock := "wall clock after each launch"
	if events {
		clock = "CUDA events"
	}
	fmt.Fprintf(w, "\nprofile of one step on %s (%d launches, %.3f ms, timed with %s):\n", s.Dev.Name(), len(times), ms(all), clock)
	fmt.Fprintf(w, "%-90s %5s %10s %10s %6s %9s %9s %9s\n", "kernel", "calls", "total ms", "mean ms", "share", "GB/s", "GFLOP/s", "roofline")
	for _, k := range order {
		r := rows[k]
		sec := r.total.Seconds()
		roof := "-"
		if peakGBs > 0 {
			// the time the kernel must take at least: its bytes at peak
			// bandwidth or its FLOPs at peak compute, whichever is longer
			bound := max(float64(r.bytes)/(peakGBs*1e9), float64(r.flops)/(peakGFLOPs*1e9))
			roof = fmt.Sprintf("%.1f%%", 100*bound/sec)
		}
		fmt.Fprintf(w, "%-90s %5d %10.3f %10.3f %5.1f%% %9.2f %9.2f %9s\n", k, r.calls, ms(r.total), ms(r.total)/float64(r.calls),
			100*r.total.Seconds()/all.Seconds(), float64(r.bytes)/sec/1e9, float64(r.flops)/sec/1e9, roof)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// printHostGaps summarises the host gap of the traced training steps: how
// long the device had nothing to do between one step's end and the next
// step's start because the host was not ready (zero when the host loop
// keeps it fed), beside the steps' own time.
func printHostGaps(w io.Writer, s *trainer.Session, times, gaps []time.Duration) {
	if len(gaps) == 0 {
		fmt.Fprintf(w, "host gap per step: needs two steps (--profile 2 or more)\n")
		return
	}
	how := "the host's clock from one step's end to the next step's launch (the device runs each step before the host goes on)"
	if s.Pipelined() {
		how = fmt.Sprintf("CUDA events around each step: the device idle between one step's end and the next one's start (%d steps queued at a time)", trainer.PipelineDepth)
	}
	q := func(ds []time.Duration, f float64) float64 {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ms(ds[min(len(ds)-1, int(f*float64(len(ds))))])
	}
	fmt.Fprintf(w, "host gap per step over %d steps, from %s:\n", len(gaps), how)
	fmt.Fprintf(w, "  gap:  median %.3f ms, 90th percentile %.3f ms, max %.3f ms\n", q(gaps, 0.5), q(gaps, 0.9), q(gaps, 1))
	fmt.Fprintf(w, "  step: median %.3f ms, 90th percentile %.3f ms, max %.3f ms\n", q(times, 0.5), q(times, 0.9), q(times, 1))
}

// runBench times training steps on one random batch: each step alone (it
// ends when its loss is read back, so device work is included), then as
// many steps submitted one after the other as training does.
func (r *runner) runBench() (int, error) {
	sess, o := r.sess, r.o
	sp := sess.Spec
	lr, err := trainer.LR32(o.lr)
	if err != nil {
		return ExitUsage, fmt.Errorf("--lr %v: %v", o.lr, err)
	}
	sess.LR = lr
	rng := rand.New(rand.NewPCG(o.seed, 7))
	n, global := o.batch, 0
	if sp.DataParallel != nil && r.rank != nil {
		// a rank times its share of the global batch (--batch), as it trains
		n, global = sp.Batch, o.batch
	}
	b := trainer.Batch{Valid: n, GlobalValid: global, Pixels: make([]uint8, n*sp.H*sp.W*sp.C), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(sp.Classes))
	}
	var times []float64
	timer, events := sess.Dev.(device.Timer)
	step := func() error { _, _, err := sess.TrainStep(b); return err }
	for i := 0; i < o.bench+3; i++ {
		t0 := time.Now()
		var d time.Duration
		var err error
		if events {
			d, err = timer.TimeLaunches(step) // CUDA events around the whole step
		} else {
			err = step()
			d = time.Since(t0)
		}
		if err != nil {
			return ExitError, err
		}
		if i >= 3 {
			times = append(times, d.Seconds())
		}
	}
	sort.Float64s(times)
	med := times[len(times)/2]
	fmt.Fprintf(o.stdout, "bench: %s on %s, batch %d: median step %.3f ms over %d steps (min %.3f, max %.3f), %.0f images/s, arena %d bytes\n",
		sp.Model, sess.Dev.Name(), o.batch, 1e3*med, len(times), 1e3*times[0], 1e3*times[len(times)-1], float64(o.batch)/med, sp.ArenaBytes)
	// the steady state as training runs it: steps submitted without
	// waiting, the host one step ahead where the device allows
	depth := 1
	if sess.Pipelined() {
		depth = trainer.PipelineDepth
	}
	// with --profile these steps are traced for the host gap
	sess.TraceGaps = o.profile > 0
	var gaps, stepTimes []time.Duration
	traced := func(r trainer.StepResult) error {
		if r.Timed {
			stepTimes = append(stepTimes, r.Time)
		}
		if r.HasGap {
			gaps = append(gaps, r.Gap)
		}
		return nil
	}
	t0 := time.Now()
	for range o.bench {
		if err := sess.Submit(b, traced); err != nil {
			return ExitError, err
		}
	}
	if err := sess.Flush(); err != nil {
		return ExitError, err
	}
	per := time.Since(t0).Seconds() / float64(o.bench)
	fmt.Fprintf(o.stdout, "bench: pipelined (%d steps submitted without waiting, %d queued at a time): %.3f ms per step, %.0f images/s (wall clock)\n",
		o.bench, depth, 1e3*per, float64(o.batch)/per)
	if o.profile > 0 {
		if err := printProfile(sess, b, o.stdout, o.roofline); err != nil {
			return ExitError, err
		}
		printHostGaps(o.stdout, sess, stepTimes, gaps)
	}
	return ExitOK, nil
}
