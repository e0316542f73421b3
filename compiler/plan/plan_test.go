package plan_test

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/dsl"
)

func compileFile(t testing.TB, path string) *compiler.Result {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(path, src, compiler.Options{})
	require.NoError(t, err)
	return res
}

func build(t *testing.T, g *ir.Graph, cfg plan.Config) *plan.Plan {
	t.Helper()
	// Planning time (SimpleCNN well under 100 ms) is a benchmark,
	// BenchmarkPlanSimpleCNN, recorded in BENCHMARKS.md: a wall-clock
	// bound here fails on a loaded machine and says nothing of the code.
	p, err := plan.Build(g, cfg)
	require.NoError(t, err)
	require.NoError(t, p.Check())
	return p
}

func has(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// The targets for the guide's model (SimpleCNN, 3x128x128, SGD
// with momentum, fp32), against PyTorch's measured 148.6 MB at batch 32.
func TestSimpleCNNTargets(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph

	t.Run("batch 32, no recomputation: at most 50 MB", func(t *testing.T) {
		p := build(t, g, plan.Config{Batch: 32})
		assert.LessOrEqual(t, p.PeakBytes, int64(50e6))
		assert.Equal(t, "fits", p.Choices.Strategy)
		assert.Empty(t, p.Loops)
		assert.Zero(t, p.ExtraFLOPs)
		// conv2 computes its weight gradient first so its input gradient
		// overwrites pool1 in place; fc1's 14.7 MB of weights keep the
		// fused update (a gradient buffer would cost more than it saves)
		assert.Equal(t, []string{"conv2"}, p.Choices.SplitUpdates)
		assert.True(t, has(p.Choices.FusedUpdates, "fc1"))
		assert.True(t, has(p.Choices.InPlace, "pool1.grad over pool1"), "%v", p.Choices.InPlace)
	})

	t.Run("batch 32 within 40 MB: the conv trunk micro-batched", func(t *testing.T) {
		p := build(t, g, plan.Config{Batch: 32, Budget: 40e6})
		assert.LessOrEqual(t, p.PeakBytes, int64(40e6))
		assert.Equal(t, "micro-batch", p.Choices.Strategy)
		assert.Equal(t, "trunk", p.Choices.MicroBatched)
		assert.Equal(t, []string{"conv1", "conv2"}, p.Choices.Trunk)
		assert.Less(t, p.Choices.MicroBatch, int64(32))
		// fc1 runs once on the whole batch with its update fused: no
		// 14.7 MB gradient buffer
		assert.True(t, has(p.Choices.FusedUpdates, "fc1"))
		for _, b := range p.Buffers {
			if b.Category == plan.CatGrad {
				assert.Less(t, b.Bytes, int64(20000), "only the convs' small gradients are accumulated: %s", b.Name)
			}
		}
		require.Len(t, p.Loops, 2)
		assert.NotEmpty(t, p.Loops[1].Zero, "the backward loop accumulates into zeroed gradients")
		// the backward loop recomputes conv1 per micro-batch
		assert.Positive(t, p.ExtraFLOPs)
	})

	t.Run("recomputation alone cannot reach 40 MB, nor whole-step micro-batching", func(t *testing.T) {
		_, err := plan.Build(g, plan.Config{Batch: 32, Budget: 40e6, NoMicroBatch: true})
		var be *plan.BudgetError
		require.ErrorAs(t, err, &be)
		assert.Greater(t, be.Min, int64(40e6))
		_, err = plan.Build(g, plan.Config{Batch: 32, Budget: 40e6, MicroBatch: 1})
		assert.ErrorContains(t, err, "over the budget")
	})

	t.Run("batch 256: at most a quarter of PyTorch's 775 MB", func(t *testing.T) {
		p := build(t, g, plan.Config{Batch: 256})
		assert.LessOrEqual(t, p.PeakBytes, int64(194e6))
	})
}

// Categories: parameters and optimizer state are fixed blocks at the
// bottom of the arena; the image batch is uint8; argmax is 2 bits.
func TestSimpleCNNBuffers(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	p := build(t, g, plan.Config{Batch: 32})
	bytes := map[plan.Category]int64{}
	byName := map[string]*plan.Buffer{}
	var top int64
	for _, b := range p.Buffers {
		bytes[b.Category] += b.Bytes
		byName[b.Name] = b
		if b.Persistent {
			top = max(top, b.Offset+b.Bytes)
			assert.Equal(t, 0, b.FirstStep)
			assert.Equal(t, len(p.Steps)-1, b.LastStep)
		}
	}
	assert.Equal(t, int64(3692906*4), bytes[plan.CatParam])
	assert.Equal(t, int64(3692906*4), bytes[plan.CatState])
	assert.Equal(t, int64(32*128*128*3), byName["image"].Bytes, "uint8 HWC")
	assert.Equal(t, int64(32*16*63*63*2/8), byName["pool1.argmax"].Bytes, "2-bit argmax")
	assert.Equal(t, int64(32*16*63*63*4), byName["pool1"].Bytes)
	assert.Equal(t, plan.CatSaved, byName["pool1"].Category)
	// the position of the line that names it, although the fused
	// conv1-relu1-pool1 block (at conv1's line) computes it
	assert.Equal(t, 6, byName["pool1"].Pos.Line)
	assert.Equal(t, 6, byName["pool1.argmax"].Pos.Line)
	assert.Equal(t, "conv1", p.Steps[0].Layer, "the block is conv1's")
	// parameters and state take the bottom of the arena, contiguously
	assert.Less(t, top, int64(3692906*8+20*plan.DefaultAlignment))
	// pool1's buffer goes on to hold pool1.grad, written in place
	require.Len(t, byName["pool1"].Holds, 2)
	assert.Equal(t, "pool1.grad", byName["pool1"].Holds[1].Value)
	assert.True(t, byName["pool1"].Holds[1].InPlace)
	for _, pr := range p.Params {
		assert.Equal(t, pr.Name, p.Buffers[pr.Buffer].Name)
		assert.Len(t, pr.State, 1, "sgd momentum")
	}
}

// The JSON form is complete and names the peak peak_bytes.
func TestPlanJSON(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	p := build(t, g, plan.Config{Batch: 32, Budget: 40e6})
	data, err := json.Marshal(p)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m))
	assert.Equal(t, float64(p.PeakBytes), m["peak_bytes"])
	assert.Equal(t, float64(40e6), m["budget_bytes"])
	for _, k := range []string{"arena_bytes", "buffers", "steps", "loops", "params", "choices", "flops", "extra_flops"} {
		assert.Contains(t, m, k)
	}
	var back plan.Plan
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, p.Buffers, back.Buffers)
	assert.Equal(t, p.Choices, back.Choices)
	assert.Equal(t, p.Loops, back.Loops)
	buf := m["buffers"].([]any)[p.Params[0].Buffer].(map[string]any)
	assert.Equal(t, "param", buf["category"])
	assert.Equal(t, "conv1.weight", buf["name"])
}

// A budget no plan meets fails at planning time, at the budget's position,
// naming the smallest budget that works — and that budget does work.
func TestImpossibleBudget(t *testing.T) {
	res := compileFile(t, "../../examples/simplecnn.cnn")
	pos := res.Train.Pos["memory_budget"]
	_, err := plan.Build(res.Graph, plan.Config{Batch: 32, Budget: 35e6, BudgetPos: pos})
	var be *plan.BudgetError
	require.True(t, errors.As(err, &be), "%v", err)
	assert.Greater(t, be.Min, int64(29543248), "at least the parameters and momentum")
	d := be.Diagnostic()
	assert.Equal(t, pos, d.Pos)
	assert.Contains(t, d.Message, "memory_budget 35.00 MB is too small for SimpleCNN at batch 32: the smallest plan needs")
	assert.Contains(t, strings.Join(d.Hints, "\n"), "or more works, or lower the batch")
	p, err := plan.Build(res.Graph, plan.Config{Batch: 32, Budget: be.Min})
	require.NoError(t, err, "the minimum the error names works")
	assert.LessOrEqual(t, p.PeakBytes, be.Min)
	_, err = plan.Build(res.Graph, plan.Config{Batch: 32, Budget: be.Min - 1})
	assert.ErrorAs(t, err, &be)
}

// A budget below what the parameters and the optimizer state take says
// so, and does not suggest a smaller batch (no batch helps).
func TestBudgetBelowTheParameters(t *testing.T) {
	res := compileFile(t, "../../examples/simplecnn.cnn")
	for _, budget := range []int64{1, 20e6} {
		_, err := plan.Build(res.Graph, plan.Config{Batch: 32, Budget: budget, BudgetSource: "--memory-budget"})
		var be *plan.BudgetError
		require.ErrorAs(t, err, &be)
		d := be.Diagnostic()
		assert.Contains(t, d.Message, "is too small for SimpleCNN: its parameters and optimizer state alone need 29.54 MB (29,544,448 B), at any batch")
		hints := strings.Join(d.Hints, "\n")
		assert.NotContains(t, hints, "lower the batch")
		assert.Contains(t, hints, "a smaller batch does not help")
		assert.Contains(t, hints, "MB or more works")
	}
	_, err := plan.Build(res.Graph, plan.Config{Batch: 32, Budget: 1, BudgetSource: "--memory-budget"})
	assert.ErrorContains(t, err, "--memory-budget 1 B is too small", "1 B, not 0.00 MB")
}

// The suggested budget is rounded up in the unit that fits, and reads back
// as a DSL size.
func TestSuggestedBudgetsReadBack(t *testing.T) {
	for _, n := range []int64{1, 999, 1000, 1001, 12345, 999_994, 999_995, 38_737_156, 999_999_999, 2_500_000_001, 7_000_000_000_000} {
		d := (&plan.BudgetError{Model: "M", Batch: 1, Budget: n - 1, Min: n}).Diagnostic()
		hint := d.Hints[len(d.Hints)-1]
		size := strings.Fields(strings.TrimPrefix(hint, "a budget of "))[0]
		got, err := dsl.ParseSize(size)
		require.NoError(t, err, hint)
		assert.GreaterOrEqual(t, got, n, hint)
		assert.LessOrEqual(t, float64(got-n), 0.01*float64(n)+1, "rounded up by less than 1%%: %s", hint)
	}
}

// Tight budgets pick the cheapest strategy that fits: recomputation before
// micro-batching, and the largest micro-batch that fits.
func TestBudgetsPickStrategies(t *testing.T) {
	g := compileFile(t, "testdata/small.cnn").Graph
	free := build(t, g, plan.Config{Batch: 8})
	rec := build(t, g, plan.Config{Batch: 8, Budget: free.PeakBytes - 1})
	assert.Equal(t, "recompute", rec.Choices.Strategy)
	assert.NotEmpty(t, rec.Choices.Recompute)
	assert.Less(t, rec.PeakBytes, free.PeakBytes)
	mb := build(t, g, plan.Config{Batch: 8, Budget: free.PeakBytes - 4000})
	assert.Equal(t, "micro-batch", mb.Choices.Strategy)
	assert.LessOrEqual(t, mb.PeakBytes, free.PeakBytes-4000)
	// one sample more per micro-batch would not fit
	if mb.Choices.MicroBatch < 7 {
		bigger, err := plan.Build(g, plan.Config{Batch: 8, MicroBatch: mb.Choices.MicroBatch + 1, Trunk: mb.Choices.Trunk[len(mb.Choices.Trunk)-1]})
		require.NoError(t, err)
		assert.Greater(t, bigger.PeakBytes, free.PeakBytes-4000)
	}
}

// Forced micro-batching: bad requests are errors, not panics.
func TestForcedMicroBatchErrors(t *testing.T) {
	g := compileFile(t, "testdata/small.cnn").Graph
	_, err := plan.Build(g, plan.Config{Batch: 8, MicroBatch: 9})
	assert.ErrorContains(t, err, "larger than the batch")
	_, err = plan.Build(g, plan.Config{Batch: 8, MicroBatch: 2, Trunk: "loss"})
	assert.ErrorContains(t, err, `no layer "loss" before the loss`)
	_, err = plan.Build(g, plan.Config{Batch: 0})
	assert.ErrorContains(t, err, "the batch must be between 1 and 1,048,576, got 0")
	_, err = plan.Build(g, plan.Config{Batch: 1 << 62})
	assert.ErrorContains(t, err, "the batch must be between 1 and 1,048,576, got 4,611,686,018,427,387,904")
}

// The largest batch for a budget, per strategy, is monotone in the
// strategies allowed, and each answer's plan fits while one more sample
// does not.
func TestFindMaxBatch(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	start := time.Now()
	m, err := plan.FindMaxBatch(g, 40e6, 0, nil)
	require.NoError(t, err)
	t.Logf("max batch in 40 MB: %+v (%v)", m, time.Since(start))
	assert.Positive(t, m.Plain.Batch)
	assert.GreaterOrEqual(t, m.Recompute.Batch, m.Plain.Batch)
	assert.Greater(t, m.MicroBatch.Batch, m.Recompute.Batch)
	assert.Less(t, m.Recompute.Batch, int64(32), "batch 32 needs micro-batching in 40 MB")
	for _, c := range []struct {
		e   plan.MaxBatchEntry
		cfg plan.Config
	}{
		{m.Plain, plan.Config{NoRecompute: true, NoMicroBatch: true}},
		{m.Recompute, plan.Config{NoMicroBatch: true}},
		{m.MicroBatch, plan.Config{}},
	} {
		cfg := c.cfg
		cfg.Budget, cfg.Batch = 40e6, c.e.Batch
		p, err := plan.Build(g, cfg)
		require.NoError(t, err)
		assert.LessOrEqual(t, p.PeakBytes, int64(40e6))
		cfg.Batch++
		_, err = plan.Build(g, cfg)
		var be *plan.BudgetError
		assert.ErrorAs(t, err, &be, "batch %d", cfg.Batch)
	}
	_, err = plan.FindMaxBatch(g, 0, 0, nil)
	assert.Error(t, err)
	none, err := plan.FindMaxBatch(g, 1e6, 0, nil)
	require.NoError(t, err)
	assert.Zero(t, none.MicroBatch.Batch, "1 MB holds not even the parameters")
}

// Planning leaves the compiled graph alone, and plans deterministically.
func TestBuildIsPure(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	before := g.Text()
	a := build(t, g, plan.Config{Batch: 32, Budget: 40e6})
	b := build(t, g, plan.Config{Batch: 32, Budget: 40e6})
	assert.Equal(t, before, g.Text())
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	assert.Equal(t, string(ja), string(jb))
	assert.NotEqual(t, before, a.Graph.Text(), "the plan's graph has the split updates")
}

// A plan answers "where does this value live" for code that follows it.
func TestPlanOffsets(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	p := build(t, g, plan.Config{Batch: 32, Budget: 44e6})
	require.Equal(t, "recompute", p.Choices.Strategy)
	byName := map[string]*ir.Value{}
	for _, n := range p.Graph.Nodes {
		for _, v := range n.Outs {
			byName[v.Name] = v
		}
	}
	for _, pr := range p.Graph.Params {
		byName[pr.Name] = pr.Value
	}
	off, ok := p.Offset(byName["fc1.weight"])
	assert.True(t, ok)
	assert.Equal(t, p.Buffers[p.Params[4].Buffer].Offset, off)
	a, ok1 := p.Offset(byName["pool2"])
	b, ok2 := p.Offset(byName["fc1.flatten"])
	assert.True(t, ok1 && ok2)
	assert.Equal(t, a, b, "a view shares its value's buffer")
	_, ok = p.Offset(byName["pool1"])
	assert.False(t, ok, "pool1 is recomputed: two buffers")
	assert.Equal(t, p.ArenaBytes, p.Bytes())
}

// The report names what each update step updates (conv2 has a separate
// update for its weight and one for its bias) and prints every size in
// the unit that fits.
func TestReportLabelsUpdatesAndSizes(t *testing.T) {
	res := compileFile(t, "../../examples/simplecnn.cnn")
	p, err := plan.Build(res.Graph, plan.Config{Batch: 32})
	require.NoError(t, err)
	var b strings.Builder
	p.WriteReport(&b, plan.ReportOptions{})
	out := b.String()
	assert.Regexp(t, `update +sgd_update +conv2 bias +32 .* updates conv2\.bias\n`, out)
	assert.Regexp(t, `update +sgd_update +conv2 weight +32 .* updates conv2\.weight\n`, out)
	assert.Regexp(t, `backward +linear_block_grad_weight +fc1 .* updates fc1\.weight, fc1\.bias`, out)
	assert.Regexp(t, `conv2\.bias +param +128 B +128 B`, out)
	assert.Regexp(t, `argmax bits +738,432 B +738\.43 kB`, out)
	assert.NotRegexp(t, `(^|[^0-9.])0\.00 MB`, out)
	for _, s := range p.Steps {
		if s.Kernel == "sgd_update" {
			assert.Len(t, s.Updates, 1)
			assert.Contains(t, []string{"conv2 weight update", "conv2 bias update"}, s.Label())
		}
	}
}

// Gradient accumulation plans the update's samples as the whole step in
// micro-batches of the batch, reports it, and refuses a second forced
// micro-batch or a batch that is not a multiple.
func TestAccumulatePlan(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	p := build(t, g, plan.Config{Batch: 128, Accumulate: 4})
	one := build(t, g, plan.Config{Batch: 32})
	assert.Equal(t, int64(4), p.Accumulate)
	assert.Equal(t, "accumulate", p.Choices.Strategy)
	require.Len(t, p.Loops, 1)
	assert.Equal(t, plan.Loop{FirstStep: 0, LastStep: p.Loops[0].LastStep, MicroBatch: 32, Count: 4, Zero: p.Loops[0].Zero, What: p.Loops[0].What}, *p.Loops[0])
	// every activation is sized for 32 samples: beyond the batch of 32's
	// plan, only the 128 samples' input and the gradient buffers of the
	// split updates
	var grads int64
	for _, b := range p.Buffers {
		if b.Category == plan.CatGrad {
			grads += b.Bytes
		}
	}
	input := int64(3*128*128+4) * 96 // 96 more samples of uint8 pixels and an int32 label
	assert.LessOrEqual(t, p.PeakBytes, one.PeakBytes+grads+input+8*plan.DefaultAlignment)
	var b strings.Builder
	p.WriteReport(&b, plan.ReportOptions{})
	out := b.String()
	assert.Contains(t, out, "batch 128 per update (accumulate = 4 batches of 32)")
	assert.Contains(t, out, "each update trains on 128 samples in 4 micro-batches of 32")
	assert.Regexp(t, `loop 0 +steps 0\.\.\d+ +4 micro-batches of 32: the whole step`, out)
	js, err := json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"accumulate":4`)

	// a budget the fixed micro-batch misses is a budget error at the budget
	_, err = plan.Build(g, plan.Config{Batch: 128, Accumulate: 4, Budget: 30e6, BudgetSource: "--memory-budget"})
	var be *plan.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, p.PeakBytes, be.Min, "the fixed plan's arena is the budget that works")
	assert.Contains(t, be.Error(), "--memory-budget 30.00 MB is too small for SimpleCNN at accumulate = 4 batches of 32")
	assert.Contains(t, be.Diagnostic().Render(nil), "lower the batch and raise accumulate")
	fits, err := plan.Build(g, plan.Config{Batch: 128, Accumulate: 4, Budget: p.PeakBytes})
	require.NoError(t, err)
	assert.Equal(t, p.PeakBytes, fits.PeakBytes)
	_, err = plan.Build(g, plan.Config{Batch: 130, Accumulate: 4})
	assert.ErrorContains(t, err, "the update's batch 130 is not a multiple of accumulate = 4")
	_, err = plan.Build(g, plan.Config{Batch: 128, Accumulate: 4, MicroBatch: 8})
	assert.ErrorContains(t, err, "accumulate = 4 fixes the micro-batch")
}
