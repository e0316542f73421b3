package perf

// A sharded optimizer's data-parallel step (ZeRO stage 1: plan.Config's
// ShardOptimizer, run by runtime/trainer/shard.go). Rank r runs the step's
// launches less the updates of parameters other ranks own, and the update
// of a parameter split in element ranges on its range only; after its
// updates it broadcasts every sharded parameter from the rank that updated
// it, all in one NCCL group queued on the device's stream
// (GroupBroadcastSeconds). So:
//
//   - each rank's launches and all-reduces overlap as the unsharded step's
//     do (Overlap), on the rank's own launch times: a skipped update takes
//     none, a split one KernelGapSeconds plus its range's share of the
//     rest (an update is element-wise: its traffic and arithmetic scale
//     with the elements it updates, the gap between launches does not);
//   - the broadcasts start when every rank has issued them and its earlier
//     collectives are done (NCCL's collectives wait for every rank; the
//     group follows the step's all-reduces on the same communicator): at
//     the slowest rank's step, both streams;
//   - nothing overlaps them: they follow the updates, which write what
//     they send, and the next step's forward pass reads what they write.
//
// The step is the slowest rank's plus the group's time.

import (
	"fmt"
	"slices"

	"github.com/cnnc/cnnc/runtime/trainer"
)

// ShardStep is what a sharded optimizer changes in the data-parallel step.
type ShardStep struct {
	// RankStepSeconds is each rank's step up to its broadcasts (its
	// launches with its all-reduces overlapped); SlowestRank the rank
	// whose step is longest, whose buckets and compute the data-parallel
	// prediction shows.
	RankStepSeconds []float64 `json:"rank_step_seconds"`
	SlowestRank     int       `json:"slowest_rank"`
	// Updates counts the update launches of sharded parameters, all of
	// which an unsharded rank runs whole; RankUpdates those the slowest
	// rank runs (a split parameter's on its range). UpdateSeconds and
	// RankUpdateSeconds are their predicted times.
	Updates           int     `json:"update_launches"`
	RankUpdates       int     `json:"rank_update_launches"`
	UpdateSeconds     float64 `json:"update_seconds"`
	RankUpdateSeconds float64 `json:"rank_update_seconds"`
	// Broadcasts counts the parameter broadcasts (one per whole parameter,
	// one per rank's range of a split one), issued as one NCCL group
	// whose cost is Broadcast (Bytes: all of them).
	Broadcasts int       `json:"broadcasts"`
	Broadcast  AllReduce `json:"broadcast_group"`
	// UnshardedStepSeconds is the same launches run as an unsharded rank
	// does (every update whole, no broadcasts).
	UnshardedStepSeconds float64 `json:"unsharded_step_seconds"`
}

// shardedStep predicts spec's sharded step from every launch's time
// (times, as an unsharded rank runs them) and the buckets' all-reduces:
// it returns the shard's part, the slowest rank's buckets (Start and End
// set) and launch times, and that rank's step before the broadcasts.
func shardedStep(spec *trainer.Spec, times []float64, graphLaunch float64, buckets []BucketReduce, f Fabric) (*ShardStep, []BucketReduce, []float64, float64, error) {
	dp := spec.DataParallel
	sh := dp.Shard
	for _, u := range sh.Updates {
		if u.Launch < 0 || u.Launch >= len(times) || u.Param < 0 || u.Param >= len(spec.Params) {
			return nil, nil, nil, 0, fmt.Errorf("perf: update launch %d of parameter %d is not in the step", u.Launch, u.Param)
		}
	}
	st := &ShardStep{Updates: len(sh.Updates)}
	for _, u := range sh.Updates {
		st.UpdateSeconds += times[u.Launch]
	}
	unsharded := slices.Clone(buckets)
	var err error
	if st.UnshardedStepSeconds, err = Overlap(times, graphLaunch, unsharded); err != nil {
		return nil, nil, nil, 0, err
	}
	var slowest []BucketReduce
	var slowestTimes []float64
	for r := range dp.Ranks {
		ts := rankLaunchSeconds(spec, times, r)
		bs := slices.Clone(buckets)
		step, err := Overlap(ts, graphLaunch, bs)
		if err != nil {
			return nil, nil, nil, 0, err
		}
		st.RankStepSeconds = append(st.RankStepSeconds, step)
		if r == 0 || step > st.RankStepSeconds[st.SlowestRank] {
			st.SlowestRank, slowest, slowestTimes = r, bs, ts
		}
	}
	for _, u := range sh.Updates {
		if sh.Split[u.Param] > 0 || sh.Owners[u.Param] == st.SlowestRank {
			st.RankUpdates++
			st.RankUpdateSeconds += slowestTimes[u.Launch]
		}
	}
	sizes := broadcastSizes(spec)
	st.Broadcasts = len(sizes)
	st.Broadcast = f.GroupBroadcastSeconds(sizes)
	return st, slowest, slowestTimes, st.RankStepSeconds[st.SlowestRank], nil
}

// rankLaunchSeconds are the launch times of rank's sharded step: the
// updates of other ranks' parameters take none, a split parameter's
// update the launch gap and its range's share of the rest.
func rankLaunchSeconds(spec *trainer.Spec, times []float64, rank int) []float64 {
	sh := spec.DataParallel.Shard
	out := slices.Clone(times)
	for _, u := range sh.Updates {
		p := spec.Params[u.Param]
		switch {
		case sh.Split[u.Param] > 0:
			lo, hi := trainer.Tensor{Shape: p.Shape, RankElems: sh.Split[u.Param]}.RankRange(rank)
			share := float64(hi-lo) / float64(max(p.Elems(), 1))
			out[u.Launch] = KernelGapSeconds + share*max(0, times[u.Launch]-KernelGapSeconds)
		case sh.Owners[u.Param] != rank:
			out[u.Launch] = 0
		}
	}
	return out
}

// broadcastSizes are the bytes of each parameter broadcast of a sharded
// step, in the order the ranks queue them (runtime/trainer's
// queueParamBroadcasts): a whole parameter from its owner, each rank's
// non-empty range of a split one from that rank.
func broadcastSizes(spec *trainer.Spec) []int64 {
	sh := spec.DataParallel.Shard
	var sizes []int64
	for i, p := range spec.Params {
		if k := sh.Split[i]; k > 0 {
			for r := range spec.DataParallel.Ranks {
				if lo, hi := (trainer.Tensor{Shape: p.Shape, RankElems: k}).RankRange(r); hi > lo {
					sizes = append(sizes, 4*(hi-lo))
				}
			}
		} else if sh.Owners[i] >= 0 {
			sizes = append(sizes, 4*p.Elems())
		}
	}
	return sizes
}
