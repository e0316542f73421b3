package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/nvcc"
)

func TestPlanGPUPredictsTheStep(t *testing.T) {
	nvcc.Require(t)
	const mnist = "../../examples/mnist.cnn"
	// under a budget (MNIST's peak is 2.03 MB) the model chooses among the
	// plans that meet it and says what the budget costs
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--json", "--memory-budget", "1.8MB", mnist)
	require.Equal(t, 0, code, errOut)
	type considered struct {
		Strategy  string  `json:"strategy"`
		PeakBytes int64   `json:"peak_bytes"`
		Step      float64 `json:"predicted_step_seconds"`
		Chosen    bool    `json:"chosen"`
	}
	var p struct {
		GPU        string       `json:"gpu"`
		Step       float64      `json:"predicted_step_seconds"`
		PeakBytes  int64        `json:"peak_bytes"`
		Strategy   string       `json:"strategy"`
		Note       string       `json:"note"`
		BudgetCost float64      `json:"budget_cost_seconds"`
		Alts       []considered `json:"alternatives"`
		Unbudgeted *considered  `json:"unbudgeted"`
		Launches   []struct {
			Kernel  string  `json:"kernel"`
			Bound   string  `json:"bound"`
			Seconds float64 `json:"predicted_seconds"`
		} `json:"launches"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, "H200 SXM", p.GPU)
	assert.Positive(t, p.PeakBytes)
	assert.LessOrEqual(t, p.PeakBytes, int64(1_800_000))
	require.NotEmpty(t, p.Alts)
	chosen := 0
	for _, a := range p.Alts {
		assert.LessOrEqual(t, a.PeakBytes, int64(1_800_000), a.Strategy)
		assert.GreaterOrEqual(t, a.Step, p.Step, "the chosen plan is the fastest")
		if a.Chosen {
			chosen++
			assert.Equal(t, p.Step, a.Step)
			assert.Equal(t, p.PeakBytes, a.PeakBytes)
			assert.Equal(t, p.Strategy, a.Strategy)
		}
	}
	assert.Equal(t, 1, chosen)
	require.NotNil(t, p.Unbudgeted)
	assert.Equal(t, "fits", p.Unbudgeted.Strategy)
	assert.Greater(t, p.Unbudgeted.PeakBytes, int64(1_800_000))
	assert.InDelta(t, p.Step-p.Unbudgeted.Step, p.BudgetCost, 1e-12)
	assert.Contains(t, p.Note, "prediction")
	require.NotEmpty(t, p.Launches)
	sum := 0.0
	for _, l := range p.Launches {
		assert.NotEmpty(t, l.Bound, l.Kernel)
		sum += l.Seconds
	}
	assert.Greater(t, p.Step, sum, "the step adds the graph launch to the launches")

	code, out, errOut = cnnc("plan", "--gpu", "A100", mnist)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "on A100 SXM4 80GB — a PREDICTION")
	assert.Contains(t, out, "predicted_step_seconds")
	assert.NotContains(t, out, "Plans that meet", "no budget, no choice")

	code, _, errOut = cnnc("plan", "--gpu", "v100", mnist)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown GPU "v100" (known: a100, h100, h200, l4, rtx4090)`)
}

// cnnc plan --gpu h200 --gpus 8: the rank's launches, its buckets'
// all-reduces overlapped with the backward pass, the step, throughput and
// scaling efficiency against one GPU at the rank's batch; --json carries
// them, predicted_step_seconds being the rank's step with its all-reduces.
func TestPlanGPUPredictsTheDataParallelStep(t *testing.T) {
	nvcc.Require(t)
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--gpus", "8", "--batch", "256", simple)
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"Predicted training step of SimpleCNN at batch 32 on H200 SXM",
		"Data-parallel step (PREDICTION): 8 GPUs over NVLink 4 (NVSwitch) (NCCL bus bandwidth 460 GB/s; link 450 GB/s each way); global batch 256, 32 per GPU",
		"hidden behind the backward pass",
		"one GPU at batch 32:",
		"scaling efficiency",
	} {
		assert.Contains(t, out, want)
	}
	code, out, errOut = cnnc("plan", "--gpu", "h200", "--gpus", "8", "--batch", "256", "--interconnect", "pcie", "--json", simple)
	require.Equal(t, 0, code, errOut)
	var p struct {
		Step     float64           `json:"predicted_step_seconds"`
		Launches []json.RawMessage `json:"launches"`
		DP       struct {
			Fabric struct {
				Ranks int `json:"ranks"`
				Intra struct {
					Key string `json:"key"`
				} `json:"intra_node"`
			} `json:"fabric"`
			GlobalBatch int     `json:"global_batch"`
			RankBatch   int     `json:"rank_batch"`
			Compute     float64 `json:"compute_seconds"`
			Buckets     []struct {
				ReadyAfter int     `json:"ready_after_launch"`
				NeededBy   int     `json:"needed_by_launch"`
				Seconds    float64 `json:"predicted_seconds"`
			} `json:"buckets"`
			AllReduce  float64 `json:"all_reduce_seconds"`
			Exposed    float64 `json:"exposed_all_reduce_seconds"`
			Hidden     float64 `json:"hidden_all_reduce_seconds"`
			Step       float64 `json:"predicted_step_seconds"`
			Samples    float64 `json:"samples_per_second"`
			OneDevice  float64 `json:"one_device_step_seconds"`
			Efficiency float64 `json:"scaling_efficiency"`
		} `json:"data_parallel"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	dp := p.DP
	assert.Equal(t, 8, dp.Fabric.Ranks)
	assert.Equal(t, "pcie5", dp.Fabric.Intra.Key)
	assert.Equal(t, 256, dp.GlobalBatch)
	assert.Equal(t, 32, dp.RankBatch)
	assert.Equal(t, dp.Step, p.Step)
	require.Len(t, dp.Buckets, 2) // fc1's weight gradient alone passes the first 1 MiB; the rest
	for _, b := range dp.Buckets {
		assert.Positive(t, b.Seconds)
		assert.Less(t, b.ReadyAfter, len(p.Launches))
	}
	assert.GreaterOrEqual(t, dp.Step, dp.Compute)
	assert.LessOrEqual(t, dp.Step, dp.Compute+dp.AllReduce)
	// over PCIe the 14.75 MB bucket alone takes 7/4 × 14.75 MB / 35 GB/s
	// ≈ 0.74 ms: more than the backward launches after it, so exposed
	assert.Greater(t, dp.Buckets[0].Seconds, 7.0/4*14.75e6/35e9)
	assert.Positive(t, dp.Exposed)
	assert.InDelta(t, dp.AllReduce, dp.Hidden+dp.Exposed, 1e-12)
	assert.InEpsilon(t, 256/dp.Step, dp.Samples, 1e-9)
	assert.Positive(t, dp.OneDevice)
	assert.InEpsilon(t, dp.OneDevice/dp.Step, dp.Efficiency, 1e-9)
	assert.Less(t, dp.Efficiency, 1.0)

	// the scaling table: one GPU is the ordinary plan, the others ranks
	code, out, errOut = cnnc("plan", "--gpu", "h200", "--scaling", "1,2,8", "--json", simple)
	require.Equal(t, 0, code, errOut)
	var s struct {
		Rows []struct {
			GPUs       int     `json:"gpus"`
			Global     int64   `json:"global_batch"`
			Step       float64 `json:"predicted_step_seconds"`
			Samples    float64 `json:"samples_per_second"`
			Efficiency float64 `json:"scaling_efficiency"`
		} `json:"scaling"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	require.Len(t, s.Rows, 3)
	assert.Equal(t, 1.0, s.Rows[0].Efficiency)
	for i, n := range []int{1, 2, 8} {
		r := s.Rows[i]
		assert.Equal(t, n, r.GPUs)
		assert.Equal(t, int64(32*n), r.Global)
		assert.InEpsilon(t, float64(r.Global)/r.Step, r.Samples, 1e-9)
		assert.InEpsilon(t, s.Rows[0].Step/r.Step, r.Efficiency, 1e-9)
	}
}

func TestPlanScalingBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--gpus", "2", "--interconnect", "pcie"}, "--interconnect and --nnodes describe the all-reduce's links: they need --gpu and --gpus N or --scaling"},
		{[]string{"--gpu", "h200", "--nnodes", "2"}, "they need --gpu and --gpus N or --scaling"},
		{[]string{"--scaling", "1,2"}, "--scaling predicts steps: it needs --gpu"},
		{[]string{"--gpu", "h200", "--gpus", "2", "--scaling", "1,2"}, "--scaling gives the GPU counts itself: drop --gpus"},
		{[]string{"--gpu", "h200", "--gpus", "2", "--interconnect", "infiniband"}, `--interconnect "infiniband": want nvlink, pcie or ib`},
		{[]string{"--gpu", "h200", "--scaling", "2,1"}, `--scaling "2,1": list the GPU counts in increasing order`},
		{[]string{"--gpu", "h200", "--scaling", "1,two"}, `--scaling "1,two": "two" is not a GPU count between 1 and 65536`},
		{[]string{"--gpu", "h200", "--scaling", "1,2,4", "--nnodes", "4"}, `--scaling "1,2,4": 2 GPUs do not split evenly over --nnodes 4`},
		{[]string{"--gpu", "h200", "--gpus", "2", "--nnodes", "0"}, "--nnodes 0: want between 1 and 65536 machines"},
		{[]string{"--gpu", "l4", "--scaling", "1,2", "--interconnect", "nvlink"}, "--interconnect: the L4 has no NVLink (use pcie)"},
		{[]string{"--gpu", "h200", "--gpus", "4", "--nnodes", "3"}, "--gpus 4: the GPUs do not split evenly over --nnodes 3 machines"},
		{[]string{"--gpu", "h200", "--shard-optimizer"}, "--shard-optimizer shares the optimizer state among data-parallel GPUs: it needs --gpus 2 or more (or --scaling)"},
	} {
		code, _, errOut := cnnc(append([]string{"plan", simple}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.msg, "%v", c.args)
	}
}

// cnnc build --gpu NAME under a budget builds the plan the performance
// model chooses — the one cnnc plan --gpu NAME reports (same budget, same
// GPU): the same peak and strategy, and the kernels sized for the GPU.
func TestBuildGPUBuildsTheFastestPlan(t *testing.T) {
	nvcc.Require(t)
	const mnist = "../../examples/mnist.cnn"
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--json", "--memory-budget", "1.8MB", mnist)
	require.Equal(t, 0, code, errOut)
	var p struct {
		PeakBytes int64   `json:"peak_bytes"`
		Strategy  string  `json:"strategy"`
		Step      float64 `json:"predicted_step_seconds"`
		Alts      []struct {
			Strategy string `json:"strategy"`
		} `json:"alternatives"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	dir := t.TempDir()
	code, out, errOut = cnnc("build", "--gpu", "h200", "--memory-budget", "1.8MB", "--emit-cuda", dir, mnist)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, fmt.Sprintf("predicted on H200 SXM: %s, %.1f µs a step, the fastest of %d plans that meet the budget", p.Strategy, 1e6*p.Step, len(p.Alts)))
	assert.Contains(t, out, p.Strategy+")\n", "the planned-memory line names the chosen plan's strategy")
	// the same build without --gpu keeps the planner's own order, and the
	// same --gpu without a budget the one plan there is
	code, out, errOut = cnnc("build", "--gpu", "h200", "--memory-budget", "none", "--emit-cuda", dir, mnist)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "the fastest of 1 plans that meet the budget")

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--gpu", "v100", "--emit-cuda", dir}, `cnnc build: --gpu: unknown GPU "v100"`},
		{[]string{"--gpu", "h200", "--target", "emu", "-o", filepath.Join(dir, "t")}, "cnnc build: --gpu h200 chooses among CUDA plans: it needs --target cuda"},
		{[]string{"--gpu", "h200", "--infer", "-o", filepath.Join(dir, "t")}, "no --emit-cuda, --memory-budget or --gpu"},
	} {
		code, _, errOut := cnnc(append([]string{"build", mnist}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.msg, "%v", c.args)
	}
}

// cnnc plan --gpu under a budget weighs split updates against time:
// SimpleCNN's 64MiB leaves room to keep every update fused in its
// weight-gradient kernel, fewer launches than the minimal-memory plan
// (the planner's own, first, still shown: 47.37 MB), and the model
// predicts it faster; --min-memory keeps the minimal-memory plan.
func TestPlanGPUWeighsSplitUpdates(t *testing.T) {
	nvcc.Require(t)
	type considered struct {
		PeakBytes int64    `json:"peak_bytes"`
		Launches  int      `json:"launches"`
		Split     []string `json:"split_updates"`
		Fused     []string `json:"fused_updates"`
		Step      float64  `json:"predicted_step_seconds"`
		Chosen    bool     `json:"chosen"`
	}
	var p struct {
		PeakBytes int64        `json:"peak_bytes"`
		Step      float64      `json:"predicted_step_seconds"`
		Alts      []considered `json:"alternatives"`
	}
	code, out, errOut := cnnc("plan", "--gpu", "h200", "--precision", "tf32", "--json", simple)
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	require.GreaterOrEqual(t, len(p.Alts), 2)
	minimal := p.Alts[0]
	// the minimal-memory plan is the planner's own under the GPU target's kernels (its scratch and
	// alignment can differ from the CPU target's plan in TestPlanReport by a few hundred bytes: 47,374,080 B
	// against 47,373,828 B with the classifier tail); the --min-memory run below must reproduce it exactly
	assert.InDelta(t, 47_373_828, minimal.PeakBytes, 4096, "the minimal-memory plan: TestPlanReport's peak, up to the targets' alignment")
	assert.NotEmpty(t, minimal.Split)
	var chosen *considered
	for i, a := range p.Alts {
		assert.LessOrEqual(t, a.PeakBytes, int64(64<<20))
		if a.Chosen {
			chosen = &p.Alts[i]
		}
	}
	require.NotNil(t, chosen)
	assert.Empty(t, chosen.Split, "every update fused")
	assert.NotEmpty(t, chosen.Fused)
	assert.Less(t, chosen.Launches, minimal.Launches)
	assert.Less(t, chosen.Step, minimal.Step, "predicted faster")
	assert.Greater(t, chosen.PeakBytes, minimal.PeakBytes)
	assert.Equal(t, chosen.PeakBytes, p.PeakBytes)

	code, out, errOut = cnnc("plan", "--gpu", "h200", "--precision", "tf32", simple)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "minimal-memory plan (the planner's own, as without --gpu; --min-memory keeps it): peak 47.37 MB")
	assert.Contains(t, out, "split updates: conv2") // fc2's update is inside the classifier tail (linear_cross_entropy)
	assert.Contains(t, out, "every update fused")

	code, out, errOut = cnnc("plan", "--gpu", "h200", "--precision", "tf32", "--min-memory", "--json", simple)
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, minimal.PeakBytes, p.PeakBytes, "--min-memory keeps the minimal-memory plan")
	require.Len(t, p.Alts, 1)
	assert.Equal(t, minimal.Split, p.Alts[0].Split)
}
