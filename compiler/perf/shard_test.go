package perf

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A large broadcast is bandwidth-bound: every rank receives the buffer
// once (busBw = algBw), at the bus bandwidth but no more than the link's
// peak (NVLink 4: the 450 GB/s link, not the table's NVLS 460), plus the
// base latency and N ring steps.
func TestBroadcastRingLargeBuffer(t *testing.T) {
	const bytes = 1 << 30
	b := fabric(t, "h200", "", 8, 1).BroadcastSeconds(bytes)
	lat := 8.4e-6 + 8*3.4e-6
	assert.Equal(t, "Simple", b.Protocol)
	assert.Equal(t, int64(bytes), b.Bytes)
	assert.InEpsilon(t, lat, b.Latency, relTol)
	assert.InEpsilon(t, lat+float64(bytes)/450e9, b.Seconds, relTol)
	// the same bytes all-reduced move 2(N−1)/N of them: a broadcast is cheaper
	assert.Less(t, b.Seconds, fabric(t, "h200", "", 8, 1).AllReduceSeconds(bytes).Seconds)

	// PCIe: below its link, the table's bus bandwidth
	b = fabric(t, "a100", "pcie", 4, 1).BroadcastSeconds(bytes)
	assert.InEpsilon(t, 8.4e-6+4*5.7e-6+float64(bytes)/17.5e9, b.Seconds, relTol)

	// two machines: 2 of the 16 steps at the network's hop latency, the
	// machine's NICs together (8 × 45 GB/s) the bus bandwidth
	b = fabric(t, "h200", "", 16, 2).BroadcastSeconds(bytes)
	assert.InEpsilon(t, 8.4e-6+14*3.4e-6+2*9.6e-6, b.Latency, relTol)
	assert.InEpsilon(t, b.Latency+float64(bytes)/(8*45e9), b.Seconds, relTol)

	// one rank: nothing to send
	b = fabric(t, "h200", "", 1, 1).BroadcastSeconds(bytes)
	assert.Zero(t, b.Seconds)
}

// One NCCL group pays the base latency once and each broadcast its ring
// steps; small broadcasts go LL, at a quarter of the bus bandwidth.
func TestGroupBroadcastPaysTheBaseLatencyOnce(t *testing.T) {
	f := fabric(t, "h100", "", 4, 1)
	g := f.GroupBroadcastSeconds([]int64{256, 1024, 64})
	assert.Equal(t, "LL", g.Protocol)
	assert.Equal(t, int64(256+1024+64), g.Bytes)
	lat := 3.6e-6 + 3*4*0.47e-6
	assert.InEpsilon(t, lat, g.Latency, relTol)
	assert.InEpsilon(t, lat+float64(256+1024+64)/(0.25*450e9), g.Seconds, relTol)
	// three separate broadcasts pay three base latencies
	sep := f.BroadcastSeconds(256).Seconds + f.BroadcastSeconds(1024).Seconds + f.BroadcastSeconds(64).Seconds
	assert.InEpsilon(t, g.Seconds+2*3.6e-6, sep, relTol)
	assert.Zero(t, f.GroupBroadcastSeconds(nil).Seconds, "no broadcasts, no group")
}

// On a real sharded rank's plan (SimpleCNN, 4 ranks, every launch 20 µs):
// each rank runs its parameters' updates only (a split one's on its
// range), the step is the slowest rank's plus the broadcasts of every
// sharded parameter in one group, and it is shorter than the same
// launches run unsharded by the updates the rank skips, less the
// broadcasts.
func TestParallelStepOfAShardedRank(t *testing.T) {
	const launch = 20e-6
	comp := compileExample(t, "../../examples/simplecnn.cnn", 64, plan.Config{Ranks: 4, ShardOptimizer: true})
	p := &Prediction{GraphLaunchSeconds: GraphLaunchSeconds}
	for i := range comp.Train.Launches {
		p.Launches = append(p.Launches, Launch{Index: i, Seconds: launch})
		p.LaunchSum += launch
	}
	p.PredictedStepSeconds = p.LaunchSum + p.GraphLaunchSeconds
	f := fabric(t, "h200", "", 4, 1)
	pp, err := ParallelStep(comp, p, f)
	require.NoError(t, err)
	sh := pp.Shard
	require.NotNil(t, sh)
	spec := comp.Spec
	ssh := spec.DataParallel.Shard
	require.NotEmpty(t, ssh.Updates)
	assert.Equal(t, len(ssh.Updates), sh.Updates)
	assert.InEpsilon(t, float64(len(ssh.Updates))*launch, sh.UpdateSeconds, relTol)
	require.Len(t, sh.RankStepSeconds, 4)

	// the slowest rank's launches, worked out from the spec
	want := GraphLaunchSeconds
	runs := 0
	skipped := map[int]bool{}
	for _, u := range ssh.Updates {
		prm := spec.Params[u.Param]
		switch {
		case ssh.Split[u.Param] > 0:
			lo, hi := trainer.Tensor{Shape: prm.Shape, RankElems: ssh.Split[u.Param]}.RankRange(sh.SlowestRank)
			want -= launch - (KernelGapSeconds + float64(hi-lo)/float64(prm.Elems())*(launch-KernelGapSeconds))
			runs++
		case ssh.Owners[u.Param] == sh.SlowestRank:
			runs++
		default:
			skipped[u.Launch] = true
		}
	}
	want += launch * float64(len(comp.Train.Launches)-len(skipped))
	assert.InEpsilon(t, want, pp.ComputeSeconds, relTol)
	assert.Equal(t, runs, sh.RankUpdates)
	assert.Less(t, sh.RankUpdates, sh.Updates, "a rank skips the other ranks' updates")
	for r, s := range sh.RankStepSeconds {
		assert.LessOrEqual(t, s, sh.RankStepSeconds[sh.SlowestRank], "rank %d", r)
		assert.LessOrEqual(t, s, sh.UnshardedStepSeconds, "rank %d runs fewer or shorter launches", r)
	}

	// the broadcasts: every parameter with optimizer state, whole or in
	// each rank's range, in one group
	var sizes []int64
	total := int64(0)
	for i, prm := range spec.Params {
		if ssh.Owners[i] >= 0 || ssh.Split[i] > 0 {
			total += 4 * prm.Elems()
		}
		if ssh.Owners[i] >= 0 {
			sizes = append(sizes, 4*prm.Elems())
		}
	}
	for i, prm := range spec.Params {
		for r := range 4 {
			if lo, hi := (trainer.Tensor{Shape: prm.Shape, RankElems: ssh.Split[i]}).RankRange(r); ssh.Split[i] > 0 && hi > lo {
				sizes = append(sizes, 4*(hi-lo))
			}
		}
	}
	assert.Equal(t, len(sizes), sh.Broadcasts)
	assert.Equal(t, total, sh.Broadcast.Bytes)
	assert.InEpsilon(t, f.GroupBroadcastSeconds(sizes).Seconds, sh.Broadcast.Seconds, relTol)

	// the step: the slowest rank's, then the broadcasts
	assert.InEpsilon(t, sh.RankStepSeconds[sh.SlowestRank]+sh.Broadcast.Seconds, pp.PredictedStepSeconds, relTol)
	assert.InEpsilon(t, pp.ComputeSeconds+pp.AllReduceSeconds+sh.Broadcast.Seconds, pp.NoOverlapStepSeconds, relTol)
	assert.InDelta(t, pp.AllReduceSeconds, pp.HiddenSeconds+pp.ExposedSeconds, 1e-15)
	assert.GreaterOrEqual(t, pp.ExposedSeconds, 0.0)
	assert.InEpsilon(t, 64/pp.PredictedStepSeconds, pp.SamplesPerSecond, relTol)

	// the unsharded rank (the same launches: sharding moves buffers, not
	// kernels) on the same launch times has no shard part, and its step is
	// the sharded plan's launches run unsharded
	plain := compileExample(t, "../../examples/simplecnn.cnn", 64, plan.Config{Ranks: 4})
	require.Equal(t, len(plain.Train.Launches), len(comp.Train.Launches))
	up, err := ParallelStep(plain, p, f)
	require.NoError(t, err)
	assert.Nil(t, up.Shard)
	assert.InEpsilon(t, up.PredictedStepSeconds, sh.UnshardedStepSeconds, relTol)
}
