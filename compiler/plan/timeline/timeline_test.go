package timeline

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

func simplePlan(t *testing.T, budget int64) *plan.Plan {
	t.Helper()
	src, err := os.ReadFile("../../../examples/simplecnn.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("simplecnn.cnn", src, compiler.Options{})
	require.NoError(t, err)
	p, err := plan.Build(res.Graph, plan.Config{Batch: 32, Budget: budget})
	require.NoError(t, err)
	return p
}

func TestTimelineSVG(t *testing.T) {
	p := simplePlan(t, 40e6)
	file := filepath.Join(t.TempDir(), "t.svg")
	require.NoError(t, Write(p, file))
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	svg := string(data)
	for _, want := range []string{"SimpleCNN, batch 32", "parameters", "saved activations", "budget, 40.00 MB", "arena = peak, 39.91 MB", "6 conv1 fwd (re)*", "4 fc1 dX"} {
		assert.Contains(t, svg, want)
	}
}

func TestTimelineFormats(t *testing.T) {
	p := simplePlan(t, 0)
	dir := t.TempDir()
	require.NoError(t, Write(p, filepath.Join(dir, "t.png")))
	data, err := os.ReadFile(filepath.Join(dir, "t.png"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(data), "\x89PNG"))
	err = Write(p, filepath.Join(dir, "t.gif"))
	assert.ErrorContains(t, err, "write .svg, .png or .pdf")
	fig, err := Figure(p)
	require.NoError(t, err)
	assert.InDelta(t, 1.8*float64(p.ArenaBytes)/1e6, fig.Y.Max, 1e-9, "no budget line: room above the arena")
}

// Separate updates say which parameter they update (a layer has two), and
// the axis takes the unit that fits the plan.
func TestTimelineLabelsUpdatesAndScalesTheAxis(t *testing.T) {
	p := simplePlan(t, 0)
	var labels []string
	for _, s := range p.Steps {
		labels = append(labels, stepLabel(s))
	}
	assert.Contains(t, labels, "7 conv2 bias update")
	assert.Contains(t, labels, "9 conv2 weight update")
	assert.NotContains(t, strings.Join(labels, "\n"), "conv2 update")
	fig, err := Figure(p)
	require.NoError(t, err)
	assert.Equal(t, "MB live (1 MB = 1,000,000 bytes)", fig.Y.Label.Text)

	tiny := *p
	tiny.ArenaBytes, tiny.BudgetBytes = 900, 0
	fig, err = Figure(&tiny)
	require.NoError(t, err)
	assert.Equal(t, "bytes live", fig.Y.Label.Text)
	tiny.ArenaBytes = 8e9
	fig, err = Figure(&tiny)
	require.NoError(t, err)
	assert.Equal(t, "GB live (1 GB = 1,000,000,000 bytes)", fig.Y.Label.Text)
}
