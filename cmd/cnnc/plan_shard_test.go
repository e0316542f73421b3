package main

import (
	"encoding/json"
	"fmt"
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

// cnnc build --gpu NAME --gpus N --interconnect LINK judges the rank's
// plans by their step with the all-reduces over LINK and prints the step
// cnnc plan predicts for the same flags; the links' flags need --gpu and
// --gpus, and are checked as cnnc plan checks them.
func TestBuildGPUChoosesOnTheInterconnect(t *testing.T) {
	nvcc.Require(t)
	const mnist = "../../examples/mnist.cnn"
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--gpus", "2", "--interconnect", "pcie", "--json", mnist)
	require.Equal(t, 0, code, errOut)
	var p struct {
		Step float64 `json:"predicted_step_seconds"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	dir := t.TempDir()
	code, out, errOut = cnnc("build", "--gpu", "h200", "--gpus", "2", "--interconnect", "pcie", "--emit-cuda", dir, mnist)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "predicted data-parallel step on 2 GPUs over PCIe Gen5 x16")
	assert.Contains(t, out, fmt.Sprintf(": %.1f µs with its all-reduces", 1e6*p.Step))
	assert.Contains(t, out, "cnnc plan --gpu h200 --gpus 2 --interconnect pcie shows it")

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--interconnect", "pcie", "--emit-cuda", dir}, "--interconnect and --nnodes describe the all-reduce's links for the performance model: they need --gpu and --gpus N"},
		{[]string{"--gpu", "h200", "--nnodes", "2", "--emit-cuda", dir}, "they need --gpu and --gpus N"},
		{[]string{"--gpu", "h200", "--gpus", "2", "--interconnect", "infiniband", "--emit-cuda", dir}, `--interconnect "infiniband": want nvlink, pcie or ib`},
		{[]string{"--gpu", "h200", "--gpus", "4", "--nnodes", "3", "--emit-cuda", dir}, "--gpus 4: the GPUs do not split evenly over --nnodes 3 machines"},
		{[]string{"--gpu", "l4", "--gpus", "2", "--interconnect", "nvlink", "--emit-cuda", dir}, "the L4 has no NVLink (use pcie)"},
	} {
		code, _, errOut := cnnc(append([]string{"build", mnist}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.msg, "%v", c.args)
	}
}
