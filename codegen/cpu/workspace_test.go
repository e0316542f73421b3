package cpu_test

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/examples"
)

// The CPU kernels' scratch sizes the planner gets (computed from the node's shapes) are
// exactly the scratch the CPU target's generation allocates, for every node of every example
// model it generates, at batches that split the weight gradient differently; cpu.Workspace
// reserves the larger of that and the CUDA kernels' scratch.
func TestWorkspaceIsTheGeneratedScratch(t *testing.T) {
	names, err := fs.Glob(examples.Models, "*.cnn")
	require.NoError(t, err)
	withScratch := 0
	for _, name := range names {
		if name == "seed_simplecnn.cnn" {
			continue // the OOM guide's model exactly as written: an error at fc1 by design
		}
		src, err := fs.ReadFile(examples.Models, name)
		require.NoError(t, err)
		res, err := compiler.CompileSource(name, src, compiler.Options{})
		require.NoError(t, err, name)
		for _, b := range []int64{1, 7, 32, 96} {
			for _, n := range res.Graph.Nodes {
				own := cpu.OwnWorkspace(n, b)
				assert.Equal(t, max(own, codegen.Workspace(n, b)), cpu.Workspace(n, b))
				p, err := cpu.GenerateNodes(name, []*ir.Node{n}, codegen.Options{Batch: b})
				if err != nil {
					assert.Zero(t, own, "%s batch %d: %s is not generated for the CPU", name, b, n.Text())
					continue
				}
				want := p.ScratchBytes(p.Scratch)
				assert.Equal(t, want, own, "%s batch %d: %s", name, b, n.Text())
				if want > 0 {
					withScratch++
				}
			}
		}
	}
	assert.Positive(t, withScratch, "the CPU weight gradients of the examples use scratch")
}
