package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cnnc plan shows what the train block's clip_grad_norm costs: the norm's step, the gradients
// live until it, the separate updates, and the peak against the same model planned without
// clipping (SimpleCNN: fc1's 14.7 MB gradient, which its fused update never writes, is held to
// the norm); --json carries the same.
func TestPlanShowsClippingCost(t *testing.T) {
	src, err := os.ReadFile(simple)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "clip.cnn")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(src), "batch = 32", "batch = 32\n    clip_grad_norm = 1.0", 1)), 0o644))
	code, out, errOut := cnnc("plan", "--memory-budget", "none", path)
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `clip_grad_norm +max_norm 1: global norm at step \d+, 8 separate updates after it +14\.77 MB of gradients live until the norm at step \d+`, out)
	assert.Contains(t, out, "vs 47.37 MB without clipping (+")
	assert.NotContains(t, out, "fused updates")

	code, out, errOut = cnnc("plan", "--memory-budget", "none", "--json", path)
	require.Equal(t, 0, code, errOut)
	var p struct {
		PeakBytes int64 `json:"peak_bytes"`
		Clip      struct {
			GradientBytes      int64 `json:"gradient_bytes"`
			UnclippedPeakBytes int64 `json:"unclipped_peak_bytes"`
		} `json:"clip"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	assert.Equal(t, int64(47_373_828), p.Clip.UnclippedPeakBytes, "TestPlanReport's peak")
	assert.Equal(t, int64(61_615_108), p.PeakBytes, "docs/dsl.md's figure: fc1's 14.7 MB gradient among the extra bytes")
	assert.Equal(t, int64(14_771_624), p.Clip.GradientBytes, "every gradient: the parameters' bytes")
}

// cnnc plan --gpu adds up the clipping kernels' predicted time: the norm's launches (clip_norm_*)
// and the updates that read its coefficient (*_clip), against the step.
func TestClipTimeLine(t *testing.T) {
	pl := &plan.Plan{Clip: &plan.ClipCost{MaxNorm: 0.5}}
	pr := &perf.Prediction{PredictedStepSeconds: 100e-6, Launches: []perf.Launch{
		{Kernel: "conv_block_fwd_x", Seconds: 50e-6},
		{Kernel: "clip_norm_partial_n10_g2_abcd", Seconds: 3e-6},
		{Kernel: "clip_norm_coef_p1_max0p5", Seconds: 2e-6},
		{Kernel: "sgd_update_10_sgd_clip", Seconds: 5e-6},
		{Kernel: "sgd_update_4_sgd_clip", Seconds: 5e-6},
	}}
	var b strings.Builder
	writeClipTime(&b, pl, pr)
	assert.Equal(t, "\nclip_grad_norm = 0.5 (predicted): the norm's 2 launches 5.0 µs, the 2 separate updates reading its coefficient 10.0 µs: 15.0% of the step\n", b.String())
	b.Reset()
	writeClipTime(&b, &plan.Plan{}, pr)
	assert.Empty(t, b.String(), "nothing without clipping")
}
