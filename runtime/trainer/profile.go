package trainer

import (
	"fmt"

	"github.com/cnnc/cnnc/runtime/device"
	"io"
	"sort"
	"time"
)

// Profile runs the training step's launches one by one on b, timing each
// with the wall clock after a device sync (on CUDA, events would be
// finer; the CPU emulator's launches are synchronous), and prints a table
// per kernel: calls, total and mean time, achieved GB/s and GFLOP/s from
// codegen's minimum bytes and FLOPs. The parameters are restored after, so
// profiling does not change training.
func Profile(s *Session, b Batch, w io.Writer, roofline string) error {
	var peakGBs, peakGFLOPs float64
	if roofline != "" {
		if _, err := fmt.Sscanf(roofline, "%g,%g", &peakGBs, &peakGFLOPs); err != nil || peakGBs <= 0 || peakGFLOPs <= 0 {
			return fmt.Errorf("--roofline %q: want GB/s,GFLOP/s, e.g. 4800,67000", roofline)
		}
	}
	saved := map[string][]float32{}
	for _, t := range append(append([]Tensor{}, s.Spec.Params...), s.Spec.State...) {
		v, err := s.ReadTensor(t)
		if err != nil {
			return err
		}
		saved[t.Name] = v
	}
	if err := s.upload(s.Spec.Train, b); err != nil {
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
	timer, events := s.Dev.(device.Timer)
	for _, l := range s.Spec.Train.Launches {
		one := Step{Launches: []Launch{l}}
		var d time.Duration
		if events {
			// CUDA events around the launch: device time only
			var err error
			if d, err = timer.TimeLaunches(func() error { return s.run(one, b.Valid) }); err != nil {
				return err
			}
		} else {
			t0 := time.Now()
			if err := s.run(one, b.Valid); err != nil {
				return err
			}
			d = time.Since(t0)
		}
		r, ok := rows[l.Kernel]
		if !ok {
			r = &row{kernel: l.Kernel}
			rows[l.Kernel] = r
			order = append(order, l.Kernel)
		}
		r.calls++
		r.total += d
		r.flops += l.FLOPs
		r.bytes += l.MinBytes
	}
	for _, t := range append(append([]Tensor{}, s.Spec.Params...), s.Spec.State...) {
		if err := s.WriteTensor(t, saved[t.Name]); err != nil {
			return err
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return rows[order[i]].total > rows[order[j]].total })
	var all time.Duration
	for _, r := range rows {
		all += r.total
	}
	clock := "wall clock after each launch"
	if events {
		clock = "CUDA events"
	}
	fmt.Fprintf(w, "\nprofile of one step on %s (%d launches, %.3f ms, timed with %s):\n", s.Dev.Name(), len(s.Spec.Train.Launches), ms(all), clock)
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
