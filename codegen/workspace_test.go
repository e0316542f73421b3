package codegen_test

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	cnncexamples "github.com/cnnc/cnnc/examples"
)

// exampleGraphs are the fused training graphs of every example model
// that compiles.
func exampleGraphs(t *testing.T) map[string]*ir.Graph {
	t.Helper()
	names, err := fs.Glob(cnncexamples.Models, "*.cnn")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	out := map[string]*ir.Graph{}
	for _, name := range names {
		if name == "seed_simplecnn.cnn" {
			continue // the OOM guide's model exactly as written: an error at fc1 by design
		}
		src, err := fs.ReadFile(cnncexamples.Models, name)
		require.NoError(t, err)
		res, err := compiler.CompileSource(name, src, compiler.Options{})
		require.NoError(t, err, name)
		out[name] = res.Graph
	}
	return out
}

// The planner's scratch sizes (codegen.Workspace, computed from the
// node's shapes) are exactly the scratch generation allocates, for every
// node of every example model, at batches that split the reductions
// differently (1, an odd one, 32, 96) and at each precision (the tensor
// cores tile differently), for the default SM count and two others (the
// splits follow the SM count: Options.SMs): a node whose kernels fail to generate (a
// precision its shapes do not allow) is left out, generation reports it.
func TestWorkspaceIsTheGeneratedScratch(t *testing.T) {
	withScratch := 0
	for name, g := range exampleGraphs(t) {
		for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32, codegen.BF16} {
			batches := []int64{1, 7, 32, 96}
			if prec != codegen.FP32 {
				batches = []int64{7, 32}
			}
			for _, b := range batches {
				for _, sms := range []int64{0, 1, 1000} {
					for _, n := range g.Nodes {
						p, err := codegen.GenerateNodes(name, []*ir.Node{n}, codegen.Options{Batch: b, Precision: prec, SMs: sms})
						if err != nil {
							continue
						}
						want := p.ScratchBytes(p.Scratch)
						assert.Equal(t, want, codegen.ScratchBytesAt(n, b, prec, sms), "%s %s batch %d, %d SMs: %s", name, prec, b, sms, n.Text())
						assert.Equal(t, want, codegen.WorkspaceOn(prec, sms)(n, b))
						if prec == codegen.FP32 && sms == 0 {
							assert.Equal(t, want, codegen.Workspace(n, b))
						}
						if want > 0 {
							withScratch++
						}
					}
				}
			}
		}
	}
	assert.Positive(t, withScratch, "some kernels of the examples use scratch")
}
