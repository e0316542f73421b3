package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const simple = "../../examples/simplecnn.cnn"

func TestPlanReport(t *testing.T) {
	code, out, errOut := cnnc("plan", simple)
	require.Equal(t, 0, code, errOut)
	assert.Empty(t, errOut)
	for _, want := range []string{
		"cnnc memory plan: SimpleCNN, batch 32",
		"peak        47,373,828 B (47.37 MB): the arena",
		"memory_budget at ../../examples/simplecnn.cnn:19:21): fits",
		"Memory by category",
		"optimizer state    14,771,624 B   14.77 MB",
		"Live at the peak (step 4: linear_block_grad_input fc1)", // fc2 and the loss: one step, the classifier tail
		"forward   linear_cross_entropy      fc2",
		"pool1.grad over pool1",
		"split updates  conv2",
		"../../examples/simplecnn.cnn:4:13", // a tensor's DSL position
		"pool1, then pool1.grad (in place)",
		"the whole batch of 32 at once",
	} {
		assert.Contains(t, out, want)
	}
}

func TestPlanBudgetMicroBatchesTheTrunk(t *testing.T) {
	dir := t.TempDir()
	svg := filepath.Join(dir, "timeline.svg")
	code, out, errOut := cnnc("plan", "--memory-budget", "40MB", simple, "--plot", svg)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "budget      40,000,000 B (40.00 MB, --memory-budget): fits")
	assert.Contains(t, out, "strategy    micro-batch: conv1..conv2 run in micro-batches of")
	assert.Contains(t, out, "recompute      conv1")
	assert.Contains(t, out, "memory timeline: "+svg)
	data, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(data), "<?xml"), "an SVG")
	assert.Contains(t, string(data), "budget, 40.00 MB")
	png := filepath.Join(dir, "timeline.png")
	code, _, errOut = cnnc("plan", simple, "--plot="+png)
	require.Equal(t, 0, code, errOut)
	data, err = os.ReadFile(png)
	require.NoError(t, err)
	assert.Equal(t, "\x89PNG", string(data[:4]))
}

func TestPlanJSONAndBatch(t *testing.T) {
	code, out, errOut := cnnc("plan", "--json", "--batch", "256", "--memory-budget", "none", simple)
	require.Equal(t, 0, code, errOut)
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, float64(256), p["batch"])
	assert.LessOrEqual(t, p["peak_bytes"].(float64), 194e6)
	assert.Equal(t, p["peak_bytes"], p["arena_bytes"])
	assert.Equal(t, float64(0), p["budget_bytes"])
}

func TestPlanMaxBatch(t *testing.T) {
	code, out, errOut := cnnc("plan", "--max-batch", "--memory-budget", "40MB", simple)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "largest batch of SimpleCNN within 40.00 MB (40,000,000 B):")
	assert.Regexp(t, `with micro-batching +[0-9,]+   peak [0-9.]+ MB `, out)
	assert.NotRegexp(t, `(^|[^0-9.])0\.00 MB`, out)
	assert.Contains(t, out, "without recomputation")
	assert.Contains(t, out, "with micro-batching")
	code, out, errOut = cnnc("plan", simple, "--max-batch", "--memory-budget=40MB", "--json")
	require.Equal(t, 0, code, errOut)
	var m struct {
		Budget      int64                            `json:"budget_bytes"`
		NoRecompute struct{ Batch, PeakBytes int64 } `json:"no_recompute"`
		MicroBatch  struct{ Batch int64 }            `json:"micro_batch"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	assert.Equal(t, int64(40e6), m.Budget)
	assert.Greater(t, m.MicroBatch.Batch, m.NoRecompute.Batch)
	// the train block's 64MiB is the default budget
	code, out, _ = cnnc("plan", "--max-batch", simple)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "within 67.11 MB")
}

// A budget no plan meets fails at compile time, at the memory_budget
// line, with the smallest budget that works; exit status 1.
func TestPlanImpossibleBudget(t *testing.T) {
	src, err := os.ReadFile(simple)
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, "tight.cnn")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(src), "memory_budget = 64MiB", "memory_budget = 20MB", 1)), 0o644))
	code, out, errOut := cnnc("plan", path)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	// below the parameters and momentum: no batch helps, and it says so
	assert.Contains(t, errOut, path+":19:21: memory_budget 20.00 MB is too small for SimpleCNN: its parameters and optimizer state alone need 29.54 MB (29,544,448 B), at any batch")
	assert.Contains(t, errOut, "        memory_budget = 20MB\n                        ^~~~")
	assert.Contains(t, errOut, "the smallest plan at batch 32 needs 38,737,156 B (38.74 MB, conv1..conv2 in micro-batches of 1): a budget of 38.74MB or more works; a smaller batch does not help")
	assert.NotContains(t, errOut, "lower the batch")
	// above them: a smaller batch would fit
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(src), "memory_budget = 64MiB", "memory_budget = 35MB", 1)), 0o644))
	code, _, errOut = cnnc("plan", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, path+":19:21: memory_budget 35.00 MB is too small for SimpleCNN at batch 32: the smallest plan needs 38,737,156 B (38.74 MB")
	assert.Contains(t, errOut, "a budget of 38.74MB or more works, or lower the batch")
	code, _, errOut = cnnc("plan", simple, "--memory-budget", "1MB")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "cnnc: --memory-budget 1.00 MB is too small")
	code, _, errOut = cnnc("plan", simple, "--memory-budget", "1B")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "cnnc: --memory-budget 1 B is too small for SimpleCNN", "1 B, not 0.00 MB")
	// the minimum it names works
	code, _, errOut = cnnc("plan", simple, "--memory-budget", "38.74MB")
	assert.Equal(t, 0, code, errOut)
}

func TestPlanBadCommandLines(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"plan"}, 2, "plan takes one model file"},
		{[]string{"plan", simple, "--memory-budget", "lots"}, 2, `--memory-budget "lots": want a size`},
		{[]string{"plan", simple, "--plot", "x.gif"}, 2, "must end in .svg, .png or .pdf"},
		{[]string{"plan", simple, "--max-batch", "--memory-budget", "none"}, 2, "--max-batch needs a budget"},
		{[]string{"plan", simple, "--max-batch", "--memory-budget", "1GB", "--plot", "x.svg"}, 2, "--plot draws one plan's memory timeline; --max-batch compares several"},
		{[]string{"plan", simple, "--plot", "/does/not/exist/x.svg"}, 1, "cnnc: --plot: open /does/not/exist/x.svg"},
		{[]string{"plan", simple, "--trunk", "conv2"}, 2, "--trunk needs --micro-batch"},
		{[]string{"plan", simple, "--micro-batch", "4", "--trunk", "fc9"}, 1, `no layer "fc9" before the loss`},
		{[]string{"plan", simple, "--batch=-1"}, 2, "--batch -1: the batch must be between 1 and 1,048,576"},
		{[]string{"plan", simple, "--batch", "0"}, 2, "--batch 0: the batch must be between 1 and 1,048,576"},
		{[]string{"plan", simple, "--batch", "4611686018427387904"}, 2, "--batch 4611686018427387904: the batch must be between 1 and 1,048,576"},
		{[]string{"plan", simple, "--micro-batch", "-2"}, 2, "--micro-batch -2: a micro-batch must be at least 1 sample"},
		{[]string{"plan", "/dev/zero"}, 1, "cnnc: /dev/zero is a character device, not a model file"},
		{[]string{"plan", "does/not/exist.cnn"}, 1, "does/not/exist.cnn"},
		{[]string{"plan", "../../examples/seed_simplecnn.cnn"}, 1, "seed_simplecnn.cnn:11:13: fc1: linear expects 28800"},
	} {
		code, _, errOut := cnnc(c.args...)
		assert.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.msg, "%v", c.args)
		assert.NotContains(t, errOut, "goroutine")
	}
}

func TestPlanForcedMicroBatch(t *testing.T) {
	code, out, errOut := cnnc("plan", simple, "--micro-batch", "8", "--trunk", "conv2", "--memory-budget", "none")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "4 micro-batches of 8: forward of conv1..conv2")
	// the budget line says the micro-batching was asked for, not that there is none
	assert.Contains(t, out, "budget      none: micro-batches of 8 as asked (the search micro-batches only under a budget)")
	assert.NotContains(t, out, "no micro-batching")
}

// A train block's accumulate shows in the plan: the update's batch, the
// loop of micro-batches; --micro-batch and --max-batch say why they cannot
// be given with it.
func TestPlanAccumulate(t *testing.T) {
	src, err := os.ReadFile(simple)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "acc.cnn")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(src), "batch = 32", "batch = 32\n    accumulate = 4", 1)), 0o644))
	code, out, errOut := cnnc("plan", "--memory-budget", "none", path)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "cnnc memory plan: SimpleCNN, batch 128 per update (accumulate = 4 batches of 32)")
	assert.Contains(t, out, "strategy    accumulate: gradient accumulation (the train block's accumulate = 4): each update trains on 128 samples in 4 micro-batches of 32")
	assert.Regexp(t, `loop 0 +steps 0\.\.\d+ +4 micro-batches of 32: the whole step`, out)
	for _, flag := range []string{"--micro-batch=8", "--max-batch"} {
		code, _, errOut = cnnc("plan", flag, path)
		assert.Equal(t, 2, code, flag)
		assert.Contains(t, errOut, "the train block's accumulate = 4 ("+path+":", flag)
	}
}
