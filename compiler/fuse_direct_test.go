package compiler

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// mobilenet_small's depthwise convs (grouped: the direct kernels, no conv
// block) each feed only a batch norm, so in the training graph each writes
// the statistics' partials as its second output (Attrs.BNStats) and that
// batch norm's batchnorm_stats takes them as its fifth input; the
// evaluation graph's convs write none (the running statistics).
func TestDepthwiseConvsWriteBNPartials(t *testing.T) {
	src, err := os.ReadFile("../examples/mobilenet_small.cnn")
	require.NoError(t, err)
	res, err := CompileSource("mobilenet_small.cnn", src, Options{})
	require.NoError(t, err)
	writers := map[*ir.Value]*ir.Node{}
	var convs int
	for _, n := range res.Graph.Nodes {
		if n.Op != ir.OpConv2D {
			continue
		}
		convs++
		require.Greater(t, n.Attrs.GroupCount(), int64(1), n.Text())
		require.True(t, n.Attrs.BNStats, n.Text())
		require.Len(t, n.Outs, 2, n.Text())
		require.Equal(t, ops.BNPartialsType(n.Out().Type), n.Outs[1].Type, n.Text())
		require.Contains(t, n.Text(), "bnstats=true")
		writers[n.Outs[1]] = n
	}
	require.Equal(t, 4, convs, "dw1..dw4")
	var merged int
	for _, n := range res.Graph.Nodes {
		if n.Op != ops.BatchNormStats || len(n.Ins) != 5 {
			continue
		}
		if w := writers[n.Ins[4]]; w != nil {
			require.Same(t, w.Out(), n.Ins[0], "%s merges %s's partials of its own input", n.Text(), w.Text())
			merged++
		}
	}
	require.Equal(t, 4, merged, "each depthwise conv's batch norm merges its partials")

	eval, err := CompileSource("mobilenet_small.cnn", src, Options{Evaluation: true})
	require.NoError(t, err)
	for _, n := range eval.Graph.Nodes {
		require.False(t, n.Attrs.BNStats, n.Text())
	}
}
