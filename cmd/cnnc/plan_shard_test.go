package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/nvcc"
)

// cnnc plan --gpu h200 --gpus 4 --shard-optimizer: the sharded rank's
// step — the slowest rank's share of the updates with its all-reduces,
// then the parameters' broadcasts in one NCCL group — in words and in
// --json, where predicted_step_seconds is that rank's step plus the
// broadcasts; --scaling adds the broadcasts' column from 2 GPUs on.
func TestPlanGPUPredictsTheShardedStep(t *testing.T) {
	nvcc.Require(t)
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--gpus", "4", "--batch", "256", "--shard-optimizer", simple)
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"Data-parallel step (PREDICTION): 4 GPUs over NVLink 4 (NVSwitch)",
		"sharded optimizer: rank ",
		"parameter broadcasts after them",
		"in one NCCL group",
		"not overlapped; the same launches unsharded:",
		"scaling efficiency",
	} {
		assert.Contains(t, out, want)
	}
	code, out, errOut = cnnc("plan", "--gpu", "h200", "--gpus", "4", "--batch", "256", "--shard-optimizer", "--json", simple)
	require.Equal(t, 0, code, errOut)
	var p struct {
		Step float64 `json:"predicted_step_seconds"`
		DP   struct {
			Compute   float64 `json:"compute_seconds"`
			AllReduce float64 `json:"all_reduce_seconds"`
			NoOverlap float64 `json:"no_overlap_step_seconds"`
			Step      float64 `json:"predicted_step_seconds"`
			Shard     *struct {
				RankSteps   []float64 `json:"rank_step_seconds"`
				Slowest     int       `json:"slowest_rank"`
				Updates     int       `json:"update_launches"`
				RankUpdates int       `json:"rank_update_launches"`
				Broadcasts  int       `json:"broadcasts"`
				Group       struct {
					Bytes   int64   `json:"bytes"`
					Seconds float64 `json:"predicted_seconds"`
				} `json:"broadcast_group"`
				Unsharded float64 `json:"unsharded_step_seconds"`
			} `json:"shard_optimizer"`
		} `json:"data_parallel"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	sh := p.DP.Shard
	require.NotNil(t, sh)
	require.Len(t, sh.RankSteps, 4)
	assert.Equal(t, p.DP.Step, p.Step)
	// SimpleCNN's parameters, all with momentum, are every one broadcast:
	// 3,692,906 float32 values (fc1's 3,686,400 among them)
	assert.Equal(t, int64(4*3692906), sh.Group.Bytes)
	assert.GreaterOrEqual(t, sh.Broadcasts, 8)
	assert.Less(t, sh.RankUpdates, sh.Updates)
	assert.Positive(t, sh.Group.Seconds)
	assert.InEpsilon(t, sh.RankSteps[sh.Slowest]+sh.Group.Seconds, p.DP.Step, 1e-9)
	assert.InEpsilon(t, p.DP.Compute+p.DP.AllReduce+sh.Group.Seconds, p.DP.NoOverlap, 1e-9)
	for _, s := range sh.RankSteps {
		assert.LessOrEqual(t, s, sh.Unsharded)
	}

	code, out, errOut = cnnc("plan", "--gpu", "h200", "--scaling", "1,4", "--batch", "64", "--shard-optimizer", simple)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "broadcast µs")
	assert.Contains(t, out, "--shard-optimizer: from 2 GPUs each rank runs its share of the updates")
}

// cnnc build --gpu h200 --gpus 2 --shard-optimizer prints the rank's
// data-parallel step with its broadcasts, not only its launches.
func TestBuildGPUPredictsTheShardedStep(t *testing.T) {
	nvcc.Require(t)
	code, out, errOut := cnnc("build", "--gpu", "h200", "--gpus", "2", "--shard-optimizer", "--emit-cuda", t.TempDir(), "../../examples/mnist.cnn")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "predicted data-parallel step on 2 GPUs over NVLink 4 (NVSwitch)")
	assert.Contains(t, out, "the rank's share of the updates, then ")
	assert.Contains(t, out, "parameter broadcasts")
	code, out, errOut = cnnc("build", "--gpu", "h200", "--gpus", "2", "--emit-cuda", t.TempDir(), "../../examples/mnist.cnn")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "with its all-reduces overlapped with the backward pass (a prediction")
	assert.NotContains(t, out, "parameter broadcasts")
}
