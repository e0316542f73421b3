package perf

// The data-parallel step: one rank's launches (Predict on the rank's plan,
// compiler/plan's DataParallel) and its gradient buckets' all-reduces
// (interconnect.go), overlapped as issue 15's design runs them: each
// bucket's all-reduce starts on a second stream as soon as the launch that
// writes its last gradient ends, the all-reduces run one after another in
// bucket order (one NCCL communicator, one stream), and the launch that
// first reads a bucket (its update, the clipping norm) waits for its sum.
// The step ends when both streams are done. Assumed: the all-reduce slows
// no kernel running beside it (NCCL's kernels take a few SMs and some
// memory bandwidth; gpu_check is to measure what that costs). With a
// sharded optimizer each rank runs its share of the updates and the
// parameters' broadcasts follow them (shard.go).

import (
	"fmt"
	"io"
	"slices"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/trainergen"
)

// BucketReduce is one bucket's all-reduce in the step.
type BucketReduce struct {
	Index int `json:"index"`
	// ReadyAfter is the launch after which every gradient of the bucket is
	// written (its all-reduce may start); NeededBy the first launch that
	// reads one (it waits), -1 when only the host does (after the step).
	ReadyAfter int `json:"ready_after_launch"`
	NeededBy   int `json:"needed_by_launch"`
	AllReduce
	// Start and End are seconds from the step's start, on the second
	// stream.
	Start float64 `json:"start_seconds"`
	End   float64 `json:"end_seconds"`
}

// ParallelPrediction is one rank's data-parallel step.
type ParallelPrediction struct {
	Fabric      Fabric `json:"fabric"`
	Description string `json:"interconnect"`
	GlobalBatch int    `json:"global_batch"`
	RankBatch   int    `json:"rank_batch"`
	// ComputeSeconds is the rank's step without communication (its
	// launches and the graph launch).
	ComputeSeconds float64        `json:"compute_seconds"`
	Buckets        []BucketReduce `json:"buckets"`
	// AllReduceSeconds is the buckets' all-reduces added up; ExposedSeconds
	// what they add to the step (the step minus ComputeSeconds) and
	// HiddenSeconds the rest, overlapped with the backward pass.
	AllReduceSeconds float64 `json:"all_reduce_seconds"`
	ExposedSeconds   float64 `json:"exposed_all_reduce_seconds"`
	HiddenSeconds    float64 `json:"hidden_all_reduce_seconds"`
	// NoOverlapStepSeconds is the step with every all-reduce after the
	// backward pass (ComputeSeconds + AllReduceSeconds).
	NoOverlapStepSeconds float64 `json:"no_overlap_step_seconds"`
	PredictedStepSeconds float64 `json:"predicted_step_seconds"`
	SamplesPerSecond     float64 `json:"samples_per_second"`
	// OneDeviceStepSeconds is one GPU's step at the rank's batch (its own
	// plan: updates fused), when known; ScalingEfficiency is then the
	// throughput over Ranks times one GPU's (weak scaling: the batch per
	// GPU fixed).
	OneDeviceStepSeconds float64 `json:"one_device_step_seconds,omitempty"`
	OneDeviceSamplesPerS float64 `json:"one_device_samples_per_second,omitempty"`
	ScalingEfficiency    float64 `json:"scaling_efficiency,omitempty"`
	// Shard is the sharded optimizer's part of the step (shard.go), nil
	// without one: then ComputeSeconds and Buckets are the slowest rank's,
	// and PredictedStepSeconds (and NoOverlapStepSeconds) add the
	// parameters' broadcasts after the updates.
	Shard *ShardStep `json:"shard_optimizer,omitempty"`
	Note  string     `json:"note"`
}

// ParallelStep predicts the data-parallel step of rank (a rank's
// compiled plan) whose launches p predicts, on fabric f.
func ParallelStep(rank *trainergen.Compiled, p *Prediction, f Fabric) (*ParallelPrediction, error) {
	dp := rank.Plan.DataParallel
	if dp == nil {
		return nil, fmt.Errorf("perf: the plan is not a data-parallel rank's")
	}
	if dp.Ranks != f.Ranks {
		return nil, fmt.Errorf("perf: the plan is one rank of %d, the fabric has %d", dp.Ranks, f.Ranks)
	}
	if len(p.Launches) != len(rank.Train.Launches) {
		return nil, fmt.Errorf("perf: %d launches predicted for a step of %d", len(p.Launches), len(rank.Train.Launches))
	}
	pp := &ParallelPrediction{Fabric: f, Description: f.Describe(), GlobalBatch: int(dp.GlobalBatch), RankBatch: int(rank.Plan.Batch),
		ComputeSeconds: p.PredictedStepSeconds,
		Note:           "a prediction of the performance model (compiler/perf): NCCL's ring cost model, all-reduces overlapped with the backward pass on a second stream"}
	for _, b := range dp.Buckets {
		ready, needed := BucketLaunches(rank.Train.Launches, b.ReadyStep, b.NeededStep)
		if ready < 0 {
			return nil, fmt.Errorf("perf: no launch writes bucket %d (ready after plan step %d)", b.Index, b.ReadyStep)
		}
		pp.Buckets = append(pp.Buckets, BucketReduce{Index: b.Index, ReadyAfter: ready, NeededBy: needed, AllReduce: f.AllReduceSeconds(b.Bytes)})
	}
	times := make([]float64, len(p.Launches))
	for i, l := range p.Launches {
		times[i] = l.Seconds
	}
	var step, broadcast float64
	var err error
	if sdp := rank.Spec.DataParallel; sdp != nil && sdp.Shard != nil {
		// the slowest rank's launches and buckets, then the broadcasts
		var rankTimes []float64
		pp.Shard, pp.Buckets, rankTimes, step, err = shardedStep(rank.Spec, times, p.GraphLaunchSeconds, pp.Buckets, f)
		if err != nil {
			return nil, err
		}
		pp.ComputeSeconds = p.GraphLaunchSeconds
		for _, t := range rankTimes {
			pp.ComputeSeconds += t
		}
		broadcast = pp.Shard.Broadcast.Seconds
		pp.Note += "; a sharded optimizer's step: the slowest rank's share of the updates, then the parameters' broadcasts in one NCCL group, not overlapped"
	} else if step, err = Overlap(times, p.GraphLaunchSeconds, pp.Buckets); err != nil {
		return nil, err
	} else {
		// Overlap adds the launches to the graph launch one by one, the
		// prediction adds their sum to it: with no exposed all-reduce the
		// two may differ in the last bit, and no overlap is faster than
		// the compute alone
		step = max(step, pp.ComputeSeconds)
	}
	for _, b := range pp.Buckets {
		pp.AllReduceSeconds += b.Seconds
	}
	pp.ExposedSeconds = step - pp.ComputeSeconds
	pp.HiddenSeconds = pp.AllReduceSeconds - pp.ExposedSeconds
	pp.PredictedStepSeconds = step + broadcast
	pp.NoOverlapStepSeconds = pp.ComputeSeconds + pp.AllReduceSeconds + broadcast
	pp.SamplesPerSecond = float64(pp.GlobalBatch) / pp.PredictedStepSeconds
	return pp, nil
}

// CompareOneDevice sets the one-GPU step at the rank's batch and the
// scaling efficiency against it.
func (pp *ParallelPrediction) CompareOneDevice(oneStepSeconds float64) {
	pp.OneDeviceStepSeconds = oneStepSeconds
	pp.OneDeviceSamplesPerS = float64(pp.RankBatch) / oneStepSeconds
	pp.ScalingEfficiency = pp.SamplesPerSecond / (float64(pp.Fabric.Ranks) * pp.OneDeviceSamplesPerS)
}

// BucketLaunches maps a bucket's plan steps to launches: ready is the last
// launch of a plan step up to readyStep (a micro-batch loop's launches
// repeat its steps, so the last iteration's), -1 if none; needed the first
// later launch of a step from neededStep on, -1 when neededStep is (only
// the host reads the bucket) or no launch is.
func BucketLaunches(launches []*codegen.Launch, readyStep, neededStep int) (ready, needed int) {
	ready, needed = -1, -1
	for i, l := range launches {
		if l.Step >= 0 && l.Step <= readyStep {
			ready = i
		}
	}
	if neededStep < 0 {
		return ready, -1
	}
	for i := ready + 1; i < len(launches); i++ {
		if launches[i].Step >= neededStep {
			return ready, i
		}
	}
	return ready, -1
}

// Overlap is the step's time with the buckets' all-reduces on a second
// stream: the launches (seconds each) run in order after the graph's
// launch; bucket k starts when launch ReadyAfter has ended and bucket k−1
// is done, and launch NeededBy starts no earlier than its end. It sets
// each bucket's Start and End and returns when both streams are done.
func Overlap(launches []float64, graphLaunch float64, buckets []BucketReduce) (float64, error) {
	for k, b := range buckets {
		if b.ReadyAfter < 0 || b.ReadyAfter >= len(launches) {
			return 0, fmt.Errorf("perf: bucket %d is ready after launch %d of %d", k, b.ReadyAfter, len(launches))
		}
	}
	ends := make([]float64, len(launches)) // each launch's end
	done := make([]bool, len(buckets))
	var schedule func(k int) error
	schedule = func(k int) error { // sets bucket k's times; ReadyAfter must have run
		if done[k] {
			return nil
		}
		b := &buckets[k]
		start := ends[b.ReadyAfter]
		if k > 0 {
			if err := schedule(k - 1); err != nil {
				return err
			}
			start = max(start, buckets[k-1].End)
		}
		b.Start, b.End = start, start+b.Seconds
		done[k] = true
		return nil
	}
	t := graphLaunch
	for i, d := range launches {
		for k := range buckets {
			if buckets[k].NeededBy != i {
				continue
			}
			for j := 0; j <= k; j++ {
				if buckets[j].ReadyAfter >= i {
					return 0, fmt.Errorf("perf: launch %d reads bucket %d, whose bucket %d is written only by launch %d", i, k, j, buckets[j].ReadyAfter)
				}
			}
			if err := schedule(k); err != nil {
				return 0, err
			}
			t = max(t, buckets[k].End)
		}
		t += d
		ends[i] = t
	}
	for k := range buckets {
		if err := schedule(k); err != nil {
			return 0, err
		}
		t = max(t, buckets[k].End)
	}
	return t, nil
}

// SameLaunches says whether two compiled steps launch the same kernels
// with the same geometry (a rank's plan at one per-rank batch for
// different rank counts: only constants such as the global batch differ,
// so one prediction of its launches serves them all).
func SameLaunches(a, b *trainergen.Compiled) bool {
	return slices.EqualFunc(a.Train.Launches, b.Train.Launches, func(x, y *codegen.Launch) bool {
		return x.Kernel == y.Kernel && x.Grid == y.Grid && x.Block == y.Block && x.SharedBytes == y.SharedBytes && x.Step == y.Step
	})
}

// WriteParallel prints the rank's data-parallel step.
func (pp *ParallelPrediction) WriteParallel(w io.Writer) {
	fmt.Fprintf(w, "\nData-parallel step (PREDICTION): %s; global batch %d, %d per GPU\n", pp.Description, pp.GlobalBatch, pp.RankBatch)
	fmt.Fprintf(w, "  %6s %12s %8s %10s %10s %12s %12s %12s\n", "bucket", "bytes", "proto", "after #", "before #", "all-reduce µs", "start µs", "end µs")
	for _, b := range pp.Buckets {
		needed := "end"
		if b.NeededBy >= 0 {
			needed = fmt.Sprint(b.NeededBy)
		}
		fmt.Fprintf(w, "  %6d %12d %8s %10d %10s %12.1f %12.1f %12.1f\n", b.Index, b.Bytes, b.Protocol, b.ReadyAfter, needed, 1e6*b.Seconds, 1e6*b.Start, 1e6*b.End)
	}
	fmt.Fprintf(w, "  compute (the rank's launches + graph launch): %.1f µs; all-reduce %.1f µs, of which %.1f µs hidden behind the backward pass and %.1f µs exposed\n",
		1e6*pp.ComputeSeconds, 1e6*pp.AllReduceSeconds, 1e6*pp.HiddenSeconds, 1e6*pp.ExposedSeconds)
	if sh := pp.Shard; sh != nil {
		fmt.Fprintf(w, "  sharded optimizer: rank %d (the slowest) runs %d of the %d sharded updates (%.1f of %.1f µs); %d parameter broadcasts after them, %d bytes in one NCCL group (%s): %.1f µs, not overlapped; the same launches unsharded: %.1f µs a step\n",
			sh.SlowestRank, sh.RankUpdates, sh.Updates, 1e6*sh.RankUpdateSeconds, 1e6*sh.UpdateSeconds, sh.Broadcasts, sh.Broadcast.Bytes, sh.Broadcast.Protocol, 1e6*sh.Broadcast.Seconds, 1e6*sh.UnshardedStepSeconds)
	}
	fmt.Fprintf(w, "  predicted step %.1f µs (%.1f µs without overlap): %.0f samples/s", 1e6*pp.PredictedStepSeconds, 1e6*pp.NoOverlapStepSeconds, pp.SamplesPerSecond)
	if pp.OneDeviceStepSeconds > 0 {
		fmt.Fprintf(w, "; one GPU at batch %d: %.1f µs, %.0f samples/s; scaling efficiency %.1f%%", pp.RankBatch, 1e6*pp.OneDeviceStepSeconds, pp.OneDeviceSamplesPerS, 100*pp.ScalingEfficiency)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  (after #/before #: the launch after which the bucket's all-reduce starts, the launch that waits for it; all-reduces run in order on a second stream)")
}
