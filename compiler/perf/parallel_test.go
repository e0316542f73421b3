package perf

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/plan"
)

// Tolerances: every expected time below is a few float64 operations on
// the same constants as the model's (sums and one division), each
// rounding by at most 2^-53 relative; 1e-12 relative bounds that with
// room, and any real error in the formula (a missing factor, a wrong step
// count) moves the result by more than 1e-3.
const relTol = 1e-12

func fabric(t *testing.T, gpu, kind string, ranks, nodes int) Fabric {
	t.Helper()
	f, err := LookupFabric(gpu, kind, ranks, nodes)
	require.NoError(t, err)
	return f
}

// A large all-reduce is bandwidth-bound: NCCL's ring moves 2(N−1)/N of the
// buffer over the bus bandwidth, Simple protocol, plus its latency: the
// base and 2(N−1) NVLink hops.
func TestAllReduceRingLargeBuffer(t *testing.T) {
	const bytes = 1 << 30
	f := fabric(t, "h200", "", 8, 1)
	assert.Equal(t, "nvlink4", f.Intra.Key)
	a := f.AllReduceSeconds(bytes)
	lat := 8.4e-6 + 14*3.4e-6
	assert.Equal(t, "Simple", a.Protocol)
	assert.InEpsilon(t, lat, a.Latency, relTol)
	assert.InEpsilon(t, lat+2*7.0/8*bytes/460e9, a.Seconds, relTol)

	// two GPUs: each sends and receives the whole buffer once (2(N−1)/N = 1)
	a = fabric(t, "h200", "", 2, 1).AllReduceSeconds(bytes)
	assert.InEpsilon(t, 8.4e-6+2*3.4e-6+float64(bytes)/460e9, a.Seconds, relTol)

	// PCIe: the GPU's own generation, PCIe hop latencies
	f = fabric(t, "a100", "pcie", 4, 1)
	assert.Equal(t, "pcie4", f.Intra.Key)
	a = f.AllReduceSeconds(bytes)
	assert.InEpsilon(t, 8.4e-6+6*5.7e-6+1.5*bytes/17.5e9, a.Seconds, relTol)
}

// A small all-reduce is latency-bound: NCCL picks LL, whose latency is
// the base plus 2(N−1) hops, at a quarter of the bus bandwidth.
func TestAllReduceSmallBufferIsLatency(t *testing.T) {
	f := fabric(t, "h100", "", 8, 1)
	a := f.AllReduceSeconds(8)
	lat := 3.6e-6 + 14*0.47e-6
	assert.Equal(t, "LL", a.Protocol)
	assert.InEpsilon(t, lat, a.Latency, relTol)
	assert.InEpsilon(t, lat+2*7.0/8*8/(0.25*460e9), a.Seconds, relTol)
	// doubling the ranks adds hops, not bandwidth time
	assert.Greater(t, fabric(t, "h100", "", 16, 1).AllReduceSeconds(8).Seconds, a.Seconds+7e-6)
}

// One GPU needs no all-reduce: NCCL returns at once.
func TestAllReduceOneRankIsFree(t *testing.T) {
	a := fabric(t, "h200", "", 1, 1).AllReduceSeconds(25 << 20)
	assert.Zero(t, a.Seconds)
	assert.Zero(t, a.Latency)
}

// Across machines: the 2(M−1) ring steps between M nodes take the
// network's hop latency, and the bus bandwidth is the lower of the
// machine's NVLink and its NICs together (one 400 Gb/s NIC per GPU).
func TestAllReduceAcrossNodes(t *testing.T) {
	const bytes = 1 << 30
	f := fabric(t, "h200", "", 16, 2)
	a := f.AllReduceSeconds(bytes)
	assert.Equal(t, "Simple", a.Protocol)
	assert.InEpsilon(t, 8.4e-6+28*3.4e-6+2*9.6e-6, a.Latency, relTol)
	assert.InEpsilon(t, a.Latency+30.0/16*bytes/(8*45e9), a.Seconds, relTol)
	// one GPU per machine: the whole ring over InfiniBand, one NIC each
	f = fabric(t, "h200", "ib", 4, 4)
	a = f.AllReduceSeconds(bytes)
	assert.InEpsilon(t, 8.4e-6+6*9.6e-6, a.Latency, relTol)
	assert.InEpsilon(t, a.Latency+1.5*bytes/45e9, a.Seconds, relTol)
}

func TestLookupFabricErrors(t *testing.T) {
	_, err := LookupFabric("l4", "nvlink", 2, 1)
	assert.ErrorContains(t, err, "the L4 has no NVLink (use pcie)")
	f := fabric(t, "rtx4090", "", 2, 1)
	assert.Equal(t, "pcie4", f.Intra.Key, "no NVLink: PCIe by default")
	_, err = LookupFabric("h200", "infiniband", 2, 1)
	assert.ErrorContains(t, err, `unknown interconnect "infiniband" (known: nvlink, pcie, ib)`)
	_, err = LookupFabric("h200", "", 6, 4)
	assert.ErrorContains(t, err, "6 GPUs do not split evenly over 4 nodes")
	_, err = LookupFabric("v100", "", 2, 1)
	assert.ErrorContains(t, err, `no interconnects known for GPU "v100"`)
	// every GPU of the spec table has its links
	for _, g := range GPUNames() {
		fabric(t, g, "", 8, 1)
		fabric(t, g, "pcie", 8, 1)
	}
}

// A bucket finished early is hidden behind the later backward launches;
// the last bucket, ready after the last backward launch, is exposed.
func TestOverlapHidesEarlyBucketsExposesTheLast(t *testing.T) {
	launches := []float64{10, 10, 10, 10, 10} // 3 backward launches, then 2 updates
	buckets := []BucketReduce{
		{Index: 0, ReadyAfter: 0, NeededBy: 3, AllReduce: AllReduce{Seconds: 15}},
		{Index: 1, ReadyAfter: 2, NeededBy: 4, AllReduce: AllReduce{Seconds: 7}},
	}
	step, err := Overlap(launches, 1, buckets)
	require.NoError(t, err)
	// bucket 0: from 11 to 26, under launches 1 and 2 (11..31): hidden
	assert.Equal(t, 11.0, buckets[0].Start)
	assert.Equal(t, 26.0, buckets[0].End)
	// bucket 1: from 31 (launch 2's end) to 38; launch 3 (31..41) runs
	// beside it, launch 4 waits for nothing: 41..51
	assert.Equal(t, 31.0, buckets[1].Start)
	assert.Equal(t, 38.0, buckets[1].End)
	assert.Equal(t, 51.0, step, "every all-reduce hidden")

	// the last bucket's update waits: launch 3 needs it, it ends at 31+20
	buckets[1].Seconds, buckets[1].NeededBy = 20, 3
	step, err = Overlap(launches, 1, buckets)
	require.NoError(t, err)
	assert.Equal(t, 51.0, buckets[1].End)
	assert.Equal(t, 71.0, step, "launch 3 starts at 51: 20 exposed")

	// all-reduces run one after another: bucket 1 waits for bucket 0
	buckets[0].Seconds = 40 // 11..51
	buckets[1].Seconds, buckets[1].NeededBy = 5, -1
	step, err = Overlap(launches, 1, buckets)
	require.NoError(t, err)
	assert.Equal(t, 51.0, buckets[1].Start)
	assert.Equal(t, 56.0, buckets[1].End)
	// launch 3 waits for bucket 0 (until 51), ends 61, launch 4 ends 71
	assert.Equal(t, 71.0, step)

	// a bucket only the host reads ends the step when it is last
	step, err = Overlap([]float64{10, 10}, 0, []BucketReduce{{ReadyAfter: 1, NeededBy: -1, AllReduce: AllReduce{Seconds: 8}}})
	require.NoError(t, err)
	assert.Equal(t, 28.0, step)
}

func TestOverlapRejectsABucketReadBeforeWritten(t *testing.T) {
	_, err := Overlap([]float64{1, 1, 1}, 0, []BucketReduce{{ReadyAfter: 2, NeededBy: 1}})
	assert.ErrorContains(t, err, "launch 1 reads bucket 0, whose bucket 0 is written only by launch 2")
	_, err = Overlap([]float64{1}, 0, []BucketReduce{{ReadyAfter: 3, NeededBy: -1}})
	assert.ErrorContains(t, err, "bucket 0 is ready after launch 3 of 1")
}

// A micro-batch loop's launches repeat its plan steps: a bucket written in
// the loop is ready after the last iteration's launch.
func TestBucketLaunchesInALoop(t *testing.T) {
	var ls []*codegen.Launch
	for _, s := range []int{0, 1, 2, 1, 2, 3, 4} {
		ls = append(ls, &codegen.Launch{Step: s})
	}
	ready, needed := BucketLaunches(ls, 2, 4)
	assert.Equal(t, 4, ready)
	assert.Equal(t, 6, needed)
	ready, needed = BucketLaunches(ls, 3, -1)
	assert.Equal(t, 5, ready)
	assert.Equal(t, -1, needed)
}

// On a real rank's plan (SimpleCNN, 4 ranks): every bucket is mapped to
// launches of its plan steps, and the step is between the launches alone
// and the launches plus every all-reduce after them.
func TestParallelStepOnARanksPlan(t *testing.T) {
	comp := compileExample(t, "../../examples/simplecnn.cnn", 64, plan.Config{Ranks: 4})
	p := &Prediction{GraphLaunchSeconds: GraphLaunchSeconds}
	for i := range comp.Train.Launches {
		p.Launches = append(p.Launches, Launch{Index: i, Seconds: 20e-6})
		p.LaunchSum += 20e-6
	}
	p.PredictedStepSeconds = p.LaunchSum + p.GraphLaunchSeconds
	pp, err := ParallelStep(comp, p, fabric(t, "h200", "", 4, 1))
	require.NoError(t, err)
	dp := comp.Plan.DataParallel
	require.Len(t, pp.Buckets, len(dp.Buckets))
	sum := 0.0
	for i, b := range pp.Buckets {
		assert.LessOrEqual(t, comp.Train.Launches[b.ReadyAfter].Step, dp.Buckets[i].ReadyStep)
		if b.NeededBy >= 0 {
			assert.GreaterOrEqual(t, comp.Train.Launches[b.NeededBy].Step, dp.Buckets[i].NeededStep)
			assert.Greater(t, b.NeededBy, b.ReadyAfter)
		}
		assert.Positive(t, b.Seconds)
		sum += b.Seconds
	}
	assert.InEpsilon(t, sum, pp.AllReduceSeconds, relTol)
	assert.GreaterOrEqual(t, pp.PredictedStepSeconds, pp.ComputeSeconds)
	assert.LessOrEqual(t, pp.PredictedStepSeconds, pp.NoOverlapStepSeconds)
	assert.InDelta(t, pp.AllReduceSeconds, pp.HiddenSeconds+pp.ExposedSeconds, 1e-15)
	assert.Equal(t, 64, pp.GlobalBatch)
	assert.Equal(t, 16, pp.RankBatch)
	assert.InEpsilon(t, 64/pp.PredictedStepSeconds, pp.SamplesPerSecond, relTol)
	pp.CompareOneDevice(pp.ComputeSeconds)
	assert.InEpsilon(t, pp.ComputeSeconds/pp.PredictedStepSeconds, pp.ScalingEfficiency, relTol)

	_, err = ParallelStep(comp, p, fabric(t, "h200", "", 8, 1))
	assert.ErrorContains(t, err, "the plan is one rank of 4, the fabric has 8")
}
