package plan_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

// What clipping costs, in the plan: MNISTNet with clip_grad_norm = 1 keeps every parameter's
// gradient in a buffer until the norm (the gradient bytes at the norm's step are all the
// parameters' bytes), runs one separate update per parameter after it and fuses none; the
// report and the JSON say so. Without clipping the same model fuses updates and keeps fewer
// gradient bytes.
func TestClipPlanCost(t *testing.T) {
	src, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	clipped := strings.Replace(string(src), "seed = 1", "seed = 1\n    clip_grad_norm = 1.0", 1)
	require.NotEqual(t, string(src), clipped)
	res, err := compiler.CompileSource("mnist.cnn", []byte(clipped), compiler.Options{})
	require.NoError(t, err)
	p := build(t, res.Graph, plan.Config{Batch: res.Train.Batch})
	require.NotNil(t, p.Clip)
	cc := p.Clip
	var params int64
	for _, pr := range p.Params {
		params += p.Buffers[pr.Buffer].Bytes
	}
	assert.Equal(t, 1.0, cc.MaxNorm)
	assert.Equal(t, params, cc.GradientBytes, "every gradient is live at the norm")
	assert.Equal(t, len(p.Params), cc.Updates)
	assert.Empty(t, p.Choices.FusedUpdates)
	assert.GreaterOrEqual(t, cc.LiveBytes, 2*params+cc.GradientBytes, "parameters, momentum and gradients")
	assert.Equal(t, "clip_grad_norm", p.Steps[cc.NormStep].Kernel)

	cc.UnclippedPeakBytes = 1_234_567
	var b strings.Builder
	p.WriteReport(&b, plan.ReportOptions{})
	assert.Regexp(t, `clip_grad_norm +max_norm 1: global norm at step \d+, 8 separate updates after it +208\.55 kB of gradients live until the norm`, b.String())
	assert.Contains(t, b.String(), "vs 1.23 MB without clipping")
	js, err := json.Marshal(p)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"clip":{"max_norm":1,`)
	assert.Contains(t, string(js), `"gradient_bytes":208552`)

	plain, err := compiler.CompileSource("mnist.cnn", src, compiler.Options{})
	require.NoError(t, err)
	q := build(t, plain.Graph, plan.Config{Batch: plain.Train.Batch})
	assert.Nil(t, q.Clip)
	assert.NotEmpty(t, q.Choices.FusedUpdates)
}
