package perf

import (
	"fmt"
	"io"
	"strings"
)

// WriteTable prints the per-launch table and the predicted step.
func (p *Prediction) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "Predicted training step of %s at batch %d on %s — a PREDICTION of cnnc's performance model, not a measurement:\n\n",
		p.Model, p.Batch, p.GPU)
	fmt.Fprintf(w, "%3s %-9s %-44s %-14s %5s %4s %6s %-11s %6s %6s %-5s %7s %-4s %8s %8s %9s %7s %7s %7s %7s  %-22s %8s\n",
		"#", "layer", "kernel", "grid", "block", "regs", "smem", "blk/SM", "warps", "waves", "fill", "MFLOP", "tc", "DRAM MB", "L2 MB",
		"smem wf", "comp", "smem", "L2", "DRAM", "bound", "µs")
	for _, l := range p.Launches {
		conflicts := ""
		if l.SharedIdeal > 0 {
			conflicts = fmt.Sprintf("%.1fx", l.SharedWavefronts/l.SharedIdeal)
		}
		tc := "-"
		if l.Tensor != "" {
			tc = l.Tensor
		}
		fmt.Fprintf(w, "%3d %-9s %-44s %-14s %5d %4d %6d %-11s %6.1f %6.2f %-5s %7.1f %-4s %8.2f %8.2f %9s %7.1f %7.1f %7.1f %7.1f  %-22s %8.1f\n",
			l.Index, clip(l.Layer, 9), clip(l.Kernel, 44), dims(l.Grid), l.Block[0]*l.Block[1]*l.Block[2], l.Registers, l.SharedBytes,
			fmt.Sprintf("%d (%s)", l.BlocksPerSM, clip(l.Limiter, 5)), l.WarpsPerSM, l.Waves, clip(l.Fill, 5), float64(l.FLOPs)/1e6, tc,
			float64(l.DRAMBytes)/1e6, l.L2Bytes/1e6, conflicts, 1e6*l.ComputeSeconds, 1e6*l.SharedSeconds, 1e6*l.L2Seconds,
			1e6*l.DRAMSeconds, l.Bound, 1e6*l.Seconds)
	}
	fmt.Fprintf(w, "\n%d launches: %.1f µs, + %.1f µs graph launch = predicted_step_seconds %.6g (%.1f µs)\n",
		len(p.Launches), 1e6*p.LaunchSum, 1e6*p.GraphLaunchSeconds, p.PredictedStepSeconds, 1e6*p.PredictedStepSeconds)
	fmt.Fprintln(w, "columns: blk/SM = resident blocks per SM (what limits them); warps = resident warps per SM; smem wf = shared")
	fmt.Fprintln(w, "wavefronts over the conflict-free count; comp/smem/L2/DRAM = µs each resource needs; each launch adds a")
	fmt.Fprintf(w, "%.1f µs gap. Counts come from ptxas and the SASS (nvcc) and from tracing the step on the emulator.\n", 1e6*KernelGapSeconds)
	fmt.Fprintf(w, "fill: ok = >= %.0f waves or >= %.0f warps per SM averaged over all SMs; tiny = under both, but the launch's work at\n", FillWaves, FillWarpsPerSM)
	fmt.Fprintf(w, "peak rates (FLOPs, minimum bytes at DRAM bandwidth) is under %.1f µs; small = under both, but the op's outputs at one\n", 1e6*TinyLaunchSeconds)
	fmt.Fprintf(w, "thread each are under %.0f warps per SM and each thread's FMAs take under %.1f µs; UNDER = none of these.\n", FillWarpsPerSM, 1e6*TinyLaunchSeconds)
	for _, l := range p.Launches {
		if l.Fill != FillOK {
			fmt.Fprintf(w, "  #%d %s: %s (%s)\n", l.Index, l.Kernel, l.Fill, l.FillWhy)
		}
	}
}

func dims(d [3]uint32) string {
	switch {
	case d[2] > 1:
		return fmt.Sprintf("%dx%dx%d", d[0], d[1], d[2])
	case d[1] > 1:
		return fmt.Sprintf("%dx%d", d[0], d[1])
	}
	return fmt.Sprint(d[0])
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// Summary is one line: the predicted step and the bound that costs most.
func (p *Prediction) Summary() string {
	byBound := map[string]float64{}
	for _, l := range p.Launches {
		byBound[strings.SplitN(l.Bound, " ", 2)[0]] += l.Seconds
	}
	worst, most := "", 0.0
	for b, t := range byBound {
		if t > most {
			worst, most = b, t
		}
	}
	return fmt.Sprintf("predicted step on %s: %.1f µs (%d launches; %s-bound launches take %.0f%%) — a prediction",
		p.GPU, 1e6*p.PredictedStepSeconds, len(p.Launches), worst, 100*most/p.LaunchSum)
}
