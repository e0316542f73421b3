package plan_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/dsl"
)

// compileTestdata compiles testdata/file.
func compileTestdata(t *testing.T, file string) *compiler.Result {
	t.Helper()
	src, err := os.ReadFile("testdata/" + file)
	require.NoError(t, err)
	res, err := compiler.CompileSource(file, src, compiler.Options{})
	require.NoError(t, err)
	return res
}

// Batch norm's statistics write its running buffers: recomputation never
// runs them again. A batch norm's input may be dropped and recomputed (its
// gradient then reads the recomputed input with the saved statistics;
// planexec's TestRecomputeIsBitIdentical checks that this is exact): in
// bnrelu.cnn's tightest plan c1 is. bnact.cnn's batch norms have the other
// activations folded in (its tightest recomputes a1's normalisation).
// bn.cnn no longer serves: with its hardswish folded into bn2 (no saved
// pre-activation), its plan that recomputes nothing is already its
// smallest (36,100 B at batch 6).
func TestBatchNormStatisticsAreNeverRecomputed(t *testing.T) {
	bnInput := false
	for _, file := range []string{"bnact.cnn", "bnrelu.cnn"} {
		res := compileTestdata(t, file)
		// budgets below the plan that recomputes nothing (as planexec's cases)
		base, err := plan.Build(res.Graph, plan.Config{Batch: 6, NoRecompute: true})
		require.NoError(t, err)
		// tighter and tighter budgets, as long as recomputation meets them
		var plans int
		var p *plan.Plan
		for budget := base.ArenaBytes - 1; ; budget -= base.ArenaBytes / 50 {
			q, err := plan.Build(res.Graph, plan.Config{Batch: 6, Budget: budget})
			if err != nil || q.Choices.Strategy != "recompute" {
				break
			}
			p = q
			plans++
			for _, s := range q.Steps {
				if !s.Recompute {
					continue
				}
				assert.NotEqual(t, ops.BatchNormStats.String(), s.Kernel, "%s: step %d recomputes %s", file, s.Index, s.Text)
				bnInput = bnInput || s.Layer == "c1"
			}
		}
		require.Positive(t, plans, "%s: recomputation meets a budget below the peak", file)
		assert.NotEmpty(t, p.ModelBuffers)
		for _, b := range p.Buffers {
			if b.Category == plan.CatBuffer {
				assert.True(t, b.Persistent, b.Name)
			}
		}
	}
	assert.True(t, bnInput, "bn1's input c1 is recomputed")
}

// No micro-batch loop crosses a batch norm: asked for one, the planner
// names the layer; a budget only such a loop would meet fails naming it.
func TestBatchNormIsNeverMicroBatchedAcross(t *testing.T) {
	res := compileTestdata(t, "bn.cnn")
	_, err := plan.Build(res.Graph, plan.Config{Batch: 6, MicroBatch: 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bn1 (batchnorm_stats at bn.cnn:8:11) computes statistics over the whole batch")
	// r1 is folded into bn1's normalisation (the fuse pass): a trunk ending
	// there crosses bn1's statistics
	_, err = plan.Build(res.Graph, plan.Config{Batch: 6, MicroBatch: 2, Trunk: "bn1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bn1 (batchnorm_stats")

	// a budget above the parameters' bytes that only micro-batching
	// through the batch norms could meet
	_, err = plan.Build(res.Graph, plan.Config{Batch: 6, Budget: 1})
	var be *plan.BudgetError
	require.True(t, errors.As(err, &be), "%v", err)
	_, err = plan.Build(res.Graph, plan.Config{Batch: 6, Budget: be.Persistent + 256, BudgetPos: dsl.Pos{File: "bn.cnn", Line: 19, Col: 5}})
	require.True(t, errors.As(err, &be), "%v", err)
	out := be.Diagnostic().Render(nil)
	assert.Contains(t, out, "micro-batches cannot cross bn1 (batchnorm_stats at bn.cnn:8:11)")
}

// Without a budget the planner recomputes a batch norm's normalisation and
// the activation after it from the saved conv output and batch statistics
// (cheap recomputation, cheap.go) instead of saving them: the plan is
// smaller than the one that recomputes nothing, recomputes only
// memory-bound kernels (never the statistics, never a conv), and each
// recomputed value reads the saved statistics. planexec's
// TestRecomputeIsBitIdentical runs this plan (case "bn relu fits") and
// requires the recomputed values to be the forward pass's bit for bit.
func TestBatchNormNormalisationIsRecomputedNotSaved(t *testing.T) {
	res := compileTestdata(t, "bnrelu.cnn")
	cfg := plan.Config{Batch: res.Train.Batch}
	p, err := plan.Build(res.Graph, cfg)
	require.NoError(t, err)
	cfg.NoRecompute = true
	saving, err := plan.Build(res.Graph, cfg)
	require.NoError(t, err)
	assert.Empty(t, saving.Choices.Recompute)
	assert.Less(t, p.ArenaBytes, saving.ArenaBytes, "recomputing the normalisation lowers the peak")
	assert.Equal(t, "fits", p.Choices.Strategy)
	assert.Contains(t, p.Choices.Recompute, "bn1")
	var bn1ReLU bool // r1 is folded into bn1's normalisation: recomputed with it
	cheapKernels := map[string]bool{"batchnorm2d": true, "relu": true, "hardswish": true, "maxpool2d": true}
	var normalised int
	for _, s := range p.Steps {
		if !s.Recompute {
			continue
		}
		assert.True(t, cheapKernels[s.Kernel], "step %d recomputes %s, not a memory-bound kernel", s.Index, s.Text)
		if s.Kernel == "batchnorm2d" {
			normalised++
			assert.Contains(t, s.Text, s.Layer+".mean, %"+s.Layer+".invstd", "the saved batch statistics")
			bn1ReLU = bn1ReLU || (s.Layer == "bn1" && strings.Contains(s.Text, "%r1") && strings.Contains(s.Text, "relu=true"))
		}
	}
	assert.True(t, bn1ReLU, "bn1's normalisation, r1 folded in, is recomputed")
	assert.Positive(t, normalised)
	assert.Positive(t, p.ExtraFLOPs)
	assert.Less(t, float64(p.ExtraFLOPs), 0.05*float64(p.FLOPs), "memory-bound work only")
}

// Without a budget the planner may recompute compute-bound kernels too, at
// most 1/20 of the step's FLOPs, where that lowers the arena by at least 1%
// more than memory-bound recomputation alone: VGG-small's stem conv (3
// input channels: a 16.78 MB output for 1% of the step's FLOPs) is
// recomputed from the saved image batch rather than kept for bn1's
// gradient. planexec's TestRecomputeIsBitIdentical checks that a
// recomputed conv is the forward pass's bit for bit.
func TestNoBudgetRecomputesConvsThatCostFewFLOPs(t *testing.T) {
	src, err := os.ReadFile("../../examples/vgg_small.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("vgg_small.cnn", src, compiler.Options{})
	require.NoError(t, err)
	p, err := plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch})
	require.NoError(t, err)
	assert.Equal(t, "fits", p.Choices.Strategy)
	assert.Contains(t, p.Choices.Recompute, "conv1")
	var convFLOPs int64
	for _, s := range p.Steps {
		if s.Recompute && (s.Kernel == "conv2d_block" || s.Kernel == "linear_block") {
			convFLOPs += s.FLOPs
		}
	}
	assert.Positive(t, convFLOPs)
	assert.LessOrEqual(t, convFLOPs, (p.FLOPs-p.ExtraFLOPs)/20, "compute-bound recomputation within 1/20 of the step")

	// without recomputation of any kind the peak is at least 1% higher
	saving, err := plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch, NoRecompute: true})
	require.NoError(t, err)
	assert.Less(t, p.ArenaBytes, saving.ArenaBytes-saving.ArenaBytes/100)

	// mobilenet_small's convs would lower its arena by less than 1%: it
	// recomputes memory-bound kernels only
	src, err = os.ReadFile("../../examples/mobilenet_small.cnn")
	require.NoError(t, err)
	res, err = compiler.CompileSource("mobilenet_small.cnn", src, compiler.Options{})
	require.NoError(t, err)
	p, err = plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch})
	require.NoError(t, err)
	for _, s := range p.Steps {
		if s.Recompute {
			assert.NotEqual(t, "conv2d_block", s.Kernel, "step %d recomputes %s", s.Index, s.Text)
		}
	}
}

// ResNet-18's first block is recomputed from the image in the backward
// pass (conv1 .. l1_0_out). The residual gradient sum at l1_0_out and
// l1_1_conv1's input gradient read no recomputed value, so they run before
// the recomputation starts and their operands are not live beside the
// recomputed chain: the peak is under half of PyTorch's 780,506,140 B
// (saved-for-backward + parameters, gradients, momentum and buffers, from
// scripts/bench/torch_memory.py; bytes, the same on every machine).
func TestReadyNodesRunBeforeRecomputation(t *testing.T) {
	src, err := os.ReadFile("../../examples/resnet18.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("resnet18.cnn", src, compiler.Options{})
	require.NoError(t, err)
	p, err := plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch})
	require.NoError(t, err)
	assert.LessOrEqual(t, p.ArenaBytes, int64(780_506_140/2))
	at := map[string]int{}
	for _, s := range p.Steps {
		key := s.Phase + " " + s.Kernel + " " + s.Layer
		if s.Recompute {
			key = "recompute " + s.Kernel + " " + s.Layer
		}
		if _, ok := at[key]; !ok {
			at[key] = s.Index
		}
	}
	rc, ok := at["recompute conv2d_block conv1"]
	require.True(t, ok, "conv1 is recomputed")
	for _, k := range []string{"backward add l1_0_out", "backward conv2d_block_grad_input l1_1_conv1"} {
		require.Contains(t, at, k)
		assert.Less(t, at[k], rc, "%s runs before conv1's recomputation", k)
	}
	assert.Greater(t, at["backward conv2d_block_grad_weight l1_1_conv1"], rc, "the weight gradient reads the recomputed l1_0_out")
}

// VGG-small's max-pools fold into the batch norms before them (the fuse
// pass: Attrs.Pool): no maxpool2d is left, bn2, bn4 and bn5 write pool1,
// pool2 and pool3 and their argmax, and the full-resolution normalised and
// activated values (relu2, relu4, relu5) never exist — so the plan never
// holds them. The planned peaks drop below those before the fusion
// (c3f7b30, this test's configurations: 60,261,380 B, and 126,323,716 B
// without recomputation, where relu2, relu4 and relu5 — 16.78 + 8.39 +
// 4.19 MB at batch 128 — were saved for the pools' gradients).
func TestVGGSmallBatchNormPoolsFused(t *testing.T) {
	src, err := os.ReadFile("../../examples/vgg_small.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("vgg_small.cnn", src, compiler.Options{})
	require.NoError(t, err)
	pooled := map[string]string{}
	for _, n := range res.Graph.Nodes {
		require.NotEqual(t, ir.OpMaxPool2D, n.Op, "a max-pool after batch norm is not folded: %s", n.Text())
		require.NotEqual(t, ir.OpMaxPool2DGrad, n.Op, n.Text())
		for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
			require.NotContains(t, []string{"relu2", "relu4", "relu5"}, v.Name, "the full-resolution batch norm output exists: %s", n.Text())
		}
		if n.Op == ops.BatchNorm2D && n.Attrs.Pool != nil {
			require.Len(t, n.Outs, 2, n.Text())
			assert.Equal(t, n.Out().Name+".argmax", n.Outs[1].Name)
			pooled[n.Name] = n.Out().Name
		}
	}
	assert.Equal(t, map[string]string{"bn2": "pool1", "bn4": "pool2", "bn5": "pool3"}, pooled)
	p, err := plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch})
	require.NoError(t, err)
	assert.Less(t, p.ArenaBytes, int64(60_261_380))
	saving, err := plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch, NoRecompute: true})
	require.NoError(t, err)
	assert.Less(t, saving.ArenaBytes, int64(126_323_716-25_000_000), "relu2, relu4 and relu5 are no longer saved")
	t.Logf("arena %d B, without recomputation %d B", p.ArenaBytes, saving.ArenaBytes)
}
