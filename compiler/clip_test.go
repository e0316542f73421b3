package compiler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
)

// clip_grad_norm takes a positive number, and says so at the value.
func TestClipGradNormErrors(t *testing.T) {
	for _, c := range []struct{ train, want string }{
		{"clip_grad_norm = 0", "m.cnn:6:20: train block: clip_grad_norm must be positive, got 0"},
		{"clip_grad_norm = -1.5", "m.cnn:6:20: train block: clip_grad_norm must be positive, got -1.5"},
		{"clip_grad_norm = \"1\"", "m.cnn:6:20: train block: clip_grad_norm must be a number, got a string"},
		{"clip_grad_norm = one", "m.cnn:6:20: train block: clip_grad_norm must be a number, got the name one"},
		{"clip_grad_norm = [1]", "m.cnn:6:20: train block: clip_grad_norm must be a number, got a list"},
		{"clip_grad_norm = 1e999", "m.cnn:6:20: number 1e999 is out of range"},
		{"clip_grad_norm = 1\n  clip_grad_norm = 2", "m.cnn:7:3: train block: argument clip_grad_norm given twice"},
	} {
		src := scheduleModel + "train {\n  " + c.train + "\n}\n"
		_, err := CompileSource("m.cnn", []byte(src), Options{})
		require.Error(t, err, c.train)
		var ds dsl.Diagnostics
		require.ErrorAs(t, err, &ds)
		assert.Contains(t, ds.RenderAll(map[string][]byte{"m.cnn": []byte(src)}), c.want, c.train)
	}
}

// With clip_grad_norm no update is fused into a weight gradient: every layer's weight gradient
// writes its gradients, one clip_grad_norm node (in the update phase, at the setting's line)
// reads all of them, and every update reads its coefficient; the unfused graph (autodiff's) has
// the same clipping, so the float64 reference clips too.
func TestClipGradNormGraph(t *testing.T) {
	src := scheduleModel + "train {\n  optimizer = sgd(lr=0.1, momentum=0.9)\n  clip_grad_norm = 2.5\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{})
	require.NoError(t, err)
	g := res.Graph
	assert.Equal(t, 2.5, g.ClipGradNorm)
	var clip *ir.Node
	updates := 0
	for _, n := range g.Nodes {
		assert.False(t, n.Attrs.Opt != nil && !n.Op.Info().Update, "%s fuses an update", n.Text())
		if n.Op == ops.ClipGradNormOp {
			require.Nil(t, clip, "one clip_grad_norm")
			clip = n
			assert.Equal(t, ir.Update, n.Phase)
			assert.Equal(t, 7, n.Pos.Line)
			assert.Len(t, n.Ins, len(g.Params), "every parameter's gradient")
			assert.Equal(t, 2.5, n.Attrs.MaxNorm)
		}
		if n.Op.Info().Update {
			updates++
			require.NotNil(t, clip, "%s before the norm", n.Text())
			assert.Equal(t, clip.Out(), ops.UpdateClip(n), n.Text())
		}
	}
	assert.Equal(t, len(g.Params), updates)

	plain, err := CompileSource("m.cnn", []byte(scheduleModel+"train {\n  optimizer = sgd(lr=0.1, momentum=0.9)\n}\n"), Options{})
	require.NoError(t, err)
	fused := 0
	for _, n := range plain.Graph.Nodes {
		assert.NotEqual(t, ops.ClipGradNormOp, n.Op)
		if n.Attrs.Opt != nil && !n.Op.Info().Update {
			fused++
		}
	}
	assert.Positive(t, fused, "without clipping, updates are fused")
}
