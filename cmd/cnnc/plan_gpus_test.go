package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cnnc plan --gpus N plans one rank: the rank's share of the batch, the
// buckets, what data parallelism adds to one device's peak and NCCL's
// buffers; --json carries the same.
func TestPlanGPUs(t *testing.T) {
	code, out, errOut := cnnc("plan", "--gpus", "8", "--batch", "256", simple)
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"cnnc memory plan: SimpleCNN, batch 32 per rank of 8 (global batch 256)",
		"Data parallelism: 8 ranks × batch 32 = global batch 256 (the peak above is one rank's)",
		"bucket region (every gradient, the loss and the correct count, for the whole step); 4 layers' updates split",
		"on one device at batch 32 (+",
		"per rank outside the arena (an estimate: 16 channels",
		"loss, loss.correct, fc2.weight.grad, fc2.bias.grad, fc1.weight.grad",
		"split updates  fc2, fc1, conv2, conv1",
	} {
		assert.Contains(t, out, want)
	}
	code, out, errOut = cnnc("plan", "--gpus", "4", "--batch", "64", "--json", simple)
	require.Equal(t, 0, code, errOut)
	var p struct {
		Batch        int64 `json:"batch"`
		Peak         int64 `json:"peak_bytes"`
		DataParallel struct {
			Ranks       int   `json:"ranks"`
			GlobalBatch int64 `json:"global_batch"`
			Buckets     []struct {
				Bytes  int64    `json:"bytes"`
				Values []string `json:"values"`
			} `json:"buckets"`
			BucketBytes int64 `json:"bucket_bytes"`
			NCCLBytes   int64 `json:"nccl_bytes"`
			OneDevice   int64 `json:"one_device_peak_bytes"`
		} `json:"data_parallel"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, int64(16), p.Batch)
	assert.Equal(t, 4, p.DataParallel.Ranks)
	assert.Equal(t, int64(64), p.DataParallel.GlobalBatch)
	assert.Len(t, p.DataParallel.Buckets, 2)
	assert.Positive(t, p.DataParallel.NCCLBytes)
	assert.Positive(t, p.DataParallel.OneDevice)
	assert.Greater(t, p.Peak, p.DataParallel.OneDevice, "the buckets persist")
	code, out, errOut = cnnc("plan", "--gpus", "4", "--shard-optimizer", simple)
	require.Equal(t, 0, code, errOut)
	// fc1.weight's momentum, nearly all of the state, split in element ranges: about a quarter each
	assert.Regexp(t, `--shard-optimizer +optimizer state at most 3\.70 MB per rank instead of 14\.77 MB \(fc1\.weight's state split in element ranges, the other parameters' whole over 4 ranks, ZeRO stage 1\): peak 39\.94 MB instead of 51\.00 MB \(-11,067,392 B\)`, out)
	// the CUDA target's rank allocates that peak (its arena: trainer.NewSession allocates
	// exactly Spec.ArenaBytes), its update kernels taking the element ranges
	code, out, errOut = cnnc("plan", "--gpus", "4", "--shard-optimizer", "--json", simple)
	require.Equal(t, 0, code, errOut)
	var sharded struct {
		Peak int64 `json:"peak_bytes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &sharded))
	require.Equal(t, int64(39_936_768), sharded.Peak, "39.94 MB, as above")
	dir := t.TempDir()
	code, out, errOut = cnnc("build", "--emit-cuda", dir, "--gpus", "4", "--shard-optimizer", "--target", "cuda", simple)
	require.Equal(t, 0, code, out+errOut)
	assert.Contains(t, out+errOut, "planned memory: arena 39,936,768 B", "the CUDA rank's arena is the plan's peak")
	cu, err := os.ReadFile(filepath.Join(dir, "simplecnn.cu"))
	require.NoError(t, err)
	assert.Regexp(t, `void sgd_update_\w+\([^)]*long long first, long long end\)`, string(cu))
	// one GPU is the ordinary plan
	code, out, errOut = cnnc("plan", "--gpus", "1", simple)
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "Data parallelism")
}

func TestPlanGPUsBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--gpus", "0"}, "--gpus 0: want between 1 and 65536 GPUs"},
		{[]string{"--gpus=-3"}, "--gpus -3: want between 1 and 65536 GPUs"},
		{[]string{"--gpus", "100000"}, "--gpus 100000: want between 1 and 65536 GPUs"},
		{[]string{"--gpus", "eight"}, `--gpus "eight": want a whole number`},
		{[]string{"--gpus", "3"}, "--gpus 3: the batch 32 does not split evenly over 3 GPUs (each takes an equal share; a batch of 33 does)"},
		{[]string{"--gpus", "2", "--infer"}, "--gpus plans one rank of data-parallel training: not with --infer or --max-batch"},
		{[]string{"--shard-optimizer"}, "--shard-optimizer shares the optimizer state among data-parallel GPUs: it needs --gpus 2 or more"},
	} {
		code, _, errOut := cnnc(append([]string{"plan", simple}, c.args...)...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.msg, "%v", c.args)
	}
}
