package plan_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
)

var updateGolden = flag.Bool("update", false, "rewrite golden files under testdata/")

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }

// checkBuckets verifies what a rank's plan promises about its buckets:
// every parameter's gradient (and the loss and correct count) in exactly
// one bucket; buckets in the order the backward pass writes them, each one
// contiguous range, back to back right after the persistent buffers; each
// closing once it holds its cap (never splitting a gradient); every
// bucket buffer live the whole step, so no other buffer overlaps the
// region; a bucket's all-reduce starts after its last write and is awaited
// before the first read; every update after the backward pass.
func checkBuckets(t *testing.T, p *plan.Plan, first, rest int64) {
	t.Helper()
	dp := p.DataParallel
	require.NotNil(t, dp)
	assert.Empty(t, p.Choices.FusedUpdates, "no update stays fused: each gradient must be summed first")
	var persistentEnd int64
	for _, b := range p.Buffers {
		if b.Persistent {
			persistentEnd = max(persistentEnd, b.Offset+b.Bytes)
		}
	}
	assert.Equal(t, alignUp(persistentEnd, p.Alignment), dp.BucketOffset, "the region starts after the persistent buffers")
	defStep := map[int]int{} // buffer -> the step writing its (first) value
	for _, s := range p.Steps {
		for _, o := range s.Outs {
			if _, ok := defStep[o.Buffer]; !ok {
				defStep[o.Buffer] = s.Index
			}
		}
	}
	inBucket := map[string]int{}
	end := dp.BucketOffset
	lastDef := -1
	for i, k := range dp.Buckets {
		assert.Equal(t, i, k.Index)
		assert.Equal(t, alignUp(end, p.Alignment), k.Offset, "bucket %d follows the previous one", i)
		require.NotEmpty(t, k.Buffers)
		assert.Equal(t, k.Offset, p.Buffers[k.Buffers[0]].Offset)
		var held, withoutLast int64
		maxDef := -1
		for j, id := range k.Buffers {
			b := p.Buffers[id]
			if j > 0 {
				prev := p.Buffers[k.Buffers[j-1]]
				assert.Equal(t, alignUp(prev.Offset+prev.Bytes, p.Alignment), b.Offset, "bucket %d is one range", i)
			}
			assert.Equal(t, 0, b.FirstStep)
			assert.Equal(t, len(p.Steps)-1, b.LastStep, "%s is reserved for the whole step", b.Name)
			assert.Equal(t, k.Values[j], b.Holds[0].Value)
			inBucket[b.Holds[0].Value] = i
			d := defStep[id]
			assert.GreaterOrEqual(t, d, lastDef, "%s: buckets fill in the order gradients are written", b.Name)
			lastDef, maxDef = d, max(maxDef, d)
			withoutLast = held
			held += alignUp(b.Bytes, p.Alignment)
		}
		end = k.Offset + k.Bytes
		last := p.Buffers[k.Buffers[len(k.Buffers)-1]]
		assert.Equal(t, last.Offset+last.Bytes, end)
		assert.Equal(t, k.Bytes/4, k.Elements)
		limit := rest
		if i == 0 {
			limit = first
		}
		assert.Less(t, withoutLast, limit, "bucket %d closed as soon as it held %d bytes", i, limit)
		if i < len(dp.Buckets)-1 {
			assert.GreaterOrEqual(t, held, limit, "bucket %d closed before it was full", i)
		}
		assert.GreaterOrEqual(t, k.ReadyStep, maxDef, "bucket %d's all-reduce starts after its last gradient", i)
		if l := p.Steps[k.ReadyStep].Loop; l < 0 {
			assert.Equal(t, maxDef, k.ReadyStep, "bucket %d starts right after its last gradient", i)
		} else {
			assert.Equal(t, p.Loops[l].LastStep, k.ReadyStep, "bucket %d waits for its loop", i)
		}
		if k.NeededStep >= 0 {
			assert.Greater(t, k.NeededStep, k.ReadyStep)
		}
	}
	assert.Equal(t, end-dp.BucketOffset, dp.BucketBytes)
	for _, pr := range p.Graph.Params {
		_, ok := inBucket[pr.Name+".grad"]
		assert.True(t, ok, "%s.grad is in a bucket", pr.Name)
	}
	assert.Equal(t, 0, inBucket["loss"], "the loss travels in the first bucket")
	assert.Equal(t, len(p.Graph.Params)+2, len(inBucket), "the gradients, the loss and the correct count")
	lastBackward := -1
	for _, s := range p.Steps {
		if s.Phase != "update" {
			lastBackward = s.Index
		}
	}
	for _, s := range p.Steps {
		if op, ok := ir.OpByName(s.Kernel); ok && op.Info().Update {
			assert.Greater(t, s.Index, lastBackward, "%s runs after the backward pass", s.Label())
		}
	}
	for _, k := range dp.Buckets {
		if k.NeededStep >= 0 {
			assert.Greater(t, k.NeededStep, k.ReadyStep)
		}
	}
	assert.Positive(t, dp.NCCLBytes)
	assert.Contains(t, dp.NCCLEstimate, "NCCL_BUFFSIZE")
}

// A rank of N plans B/N samples; buckets with PyTorch's default sizes and
// with small ones (so that SimpleCNN's gradients need several).
func TestDataParallelBuckets(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	for _, c := range []struct {
		ranks       int
		first, rest int64
		buckets     int
	}{
		{4, 0, 0, 2},              // 1 MiB first: fc2 and fc1's weight close it; the rest in the second
		{2, 4 << 10, 64 << 10, 3}, // loss, correct, fc2.weight; fc2.bias, fc1.weight; the other 5 (21 kB)
		{8, 1, 1, 10},             // one value per bucket (the loss and correct count too)
	} {
		p := build(t, g, plan.Config{Batch: 64, Ranks: c.ranks, FirstBucketBytes: c.first, BucketBytes: c.rest})
		assert.Equal(t, int64(64/c.ranks), p.Batch, "the rank's share")
		assert.Equal(t, int64(64), p.DataParallel.GlobalBatch)
		assert.Equal(t, c.ranks, p.DataParallel.Ranks)
		first, rest := c.first, c.rest
		if first == 0 {
			first, rest = plan.DefaultFirstBucketBytes, plan.DefaultBucketBytes
		}
		checkBuckets(t, p, first, rest)
		assert.Len(t, p.DataParallel.Buckets, c.buckets, "ranks %d", c.ranks)
		assert.Equal(t, p.ArenaBytes, p.PeakBytes)
	}
}

// The arena stays exact for a rank's plan on every example, through the
// planner's own checks (Build runs Plan.Check: the arena is the peak, no
// two live buffers overlap, every operand is live) and the bucket
// invariants; with micro-batch loops (accumulate, a budget) a bucket's
// all-reduce waits for the loop.
func TestDataParallelPlansEveryExample(t *testing.T) {
	paths, err := filepath.Glob("../../examples/*.cnn")
	require.NoError(t, err)
	for _, path := range paths {
		if strings.Contains(path, "seed_") {
			continue // the example with a deliberate error
		}
		t.Run(filepath.Base(path), func(t *testing.T) {
			g := compileFile(t, path).Graph
			one := build(t, g, plan.Config{Batch: 8})
			p := build(t, g, plan.Config{Batch: 16, Ranks: 2})
			checkBuckets(t, p, plan.DefaultFirstBucketBytes, plan.DefaultBucketBytes)
			assert.Equal(t, int64(8), p.Batch)
			assert.GreaterOrEqual(t, p.PeakBytes, one.PeakBytes-p.DataParallel.BucketBytes,
				"the rank keeps its gradients for the whole step")
		})
	}
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	p := build(t, g, plan.Config{Batch: 64, Ranks: 2, Accumulate: 4})
	require.Len(t, p.Loops, 1)
	assert.Equal(t, int64(8), p.Loops[0].MicroBatch, "64 over 2 ranks, in 4 micro-batches each")
	checkBuckets(t, p, plan.DefaultFirstBucketBytes, plan.DefaultBucketBytes)
	for _, k := range p.DataParallel.Buckets {
		assert.GreaterOrEqual(t, k.ReadyStep, p.Loops[0].LastStep)
	}
	budget := build(t, g, plan.Config{Batch: 256, Ranks: 2})
	tight := build(t, g, plan.Config{Batch: 256, Ranks: 2, Budget: budget.PeakBytes * 3 / 4})
	assert.LessOrEqual(t, tight.PeakBytes, budget.PeakBytes*3/4)
	assert.NotEqual(t, "fits", tight.Choices.Strategy)
	checkBuckets(t, tight, plan.DefaultFirstBucketBytes, plan.DefaultBucketBytes)
}

// One rank is the one-device plan unless data parallelism is asked for;
// bad rank counts are errors.
func TestDataParallelConfig(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	one := build(t, g, plan.Config{Batch: 32})
	r1 := build(t, g, plan.Config{Batch: 32, Ranks: 1})
	assert.Nil(t, r1.DataParallel)
	assert.Equal(t, one.PeakBytes, r1.PeakBytes)
	assert.Equal(t, one.Choices, r1.Choices)
	// asked for, one rank plans the data-parallel step all the same (the
	// NCCL path on one GPU): buckets, split updates, the whole batch
	dp1 := build(t, g, plan.Config{Batch: 32, Ranks: 1, DataParallel: true})
	require.NotNil(t, dp1.DataParallel)
	assert.Equal(t, 1, dp1.DataParallel.Ranks)
	assert.EqualValues(t, 32, dp1.DataParallel.GlobalBatch)
	assert.EqualValues(t, 32, dp1.Batch)
	assert.NotEmpty(t, dp1.DataParallel.Buckets)
	assert.Positive(t, dp1.DataParallel.SplitUpdates)
	checkBuckets(t, dp1, plan.DefaultFirstBucketBytes, plan.DefaultBucketBytes)
	for _, c := range []struct {
		cfg plan.Config
		msg string
	}{
		{plan.Config{Batch: 32, Ranks: 3}, "the batch 32 does not split evenly over 3 ranks (each rank takes an equal share; try a batch of 33)"},
		{plan.Config{Batch: 32, Ranks: -2}, "-2 ranks: at least 1"},
		{plan.Config{Batch: 32, Ranks: plan.MaxRanks + 1}, "at most 65536"},
		{plan.Config{Batch: 32, Ranks: 2, Accumulate: 3}, "not a multiple of accumulate = 3"},
	} {
		_, err := plan.Build(g, c.cfg)
		require.Error(t, err, "%+v", c.cfg)
		assert.Contains(t, err.Error(), c.msg)
	}
}

// The report's data-parallel section (golden: testdata/dp_simplecnn.txt;
// go test -update rewrites it).
func TestDataParallelReport(t *testing.T) {
	g := compileFile(t, "../../examples/simplecnn.cnn").Graph
	p := build(t, g, plan.Config{Batch: 256, Ranks: 8})
	p.DataParallel.OneDevicePeakBytes = build(t, g, plan.Config{Batch: 32}).PeakBytes
	var buf bytes.Buffer
	p.WriteReport(&buf, plan.ReportOptions{})
	out := buf.String()
	assert.True(t, strings.HasPrefix(out, "cnnc memory plan: SimpleCNN, batch 32 per rank of 8 (global batch 256)\n"), out[:100])
	start := strings.Index(out, "\nData parallelism")
	stop := strings.Index(out, "\nChoices")
	require.True(t, start >= 0 && stop > start)
	section := out[start+1 : stop]
	golden := filepath.Join("testdata", "dp_simplecnn.txt")
	if *updateGolden {
		require.NoError(t, os.WriteFile(golden, []byte(section), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), section)
}

// With clip_grad_norm the norm reads every gradient: it is each bucket's
// first reader after its all-reduce (so it waits for all of them), and the
// updates follow it.
func TestDataParallelClipWaitsForEveryBucket(t *testing.T) {
	src, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	clipped := strings.Replace(string(src), "seed = 1", "seed = 1\n    clip_grad_norm = 1.0", 1)
	require.NotEqual(t, string(src), clipped)
	res, err := compiler.CompileSource("mnist.cnn", []byte(clipped), compiler.Options{})
	require.NoError(t, err)
	p := build(t, res.Graph, plan.Config{Batch: 64, Ranks: 4, FirstBucketBytes: 1, BucketBytes: 1})
	checkBuckets(t, p, 1, 1)
	require.NotNil(t, p.Clip)
	require.Greater(t, len(p.DataParallel.Buckets), 2)
	for _, k := range p.DataParallel.Buckets {
		if !strings.HasSuffix(k.Values[0], ".grad") {
			continue // the loss and the correct count (one bucket each here): read by the host only
		}
		assert.Equal(t, p.Clip.NormStep, k.NeededStep, "bucket %d (%v)", k.Index, k.Values)
	}
}
