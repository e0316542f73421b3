package planexec

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
)

// withClip compiles the model at path with clip_grad_norm = maxNorm added to its train block.
func withClip(t *testing.T, path, maxNorm string) *compiler.Result {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(src)
	if strings.Contains(s, "train {") {
		s = strings.Replace(s, "train {", "train {\n    clip_grad_norm = "+maxNorm, 1)
	} else {
		s += "\ntrain {\n    clip_grad_norm = " + maxNorm + "\n}\n"
	}
	opts := compiler.Options{AfterPass: func(pass string, g *ir.Graph) error { return g.Verify() }}
	res, err := compiler.CompileSource(path, []byte(s), opts)
	require.NoError(t, err)
	require.Positive(t, res.Graph.ClipGradNorm)
	return res
}

// Clipped plans run as planned: the norm after every gradient (after a micro-batch loop's
// accumulated ones), every update after it; in one byte arena of exactly the planned size
// (buffers poisoned when they become live) within fp32 rounding of the float64 reference's
// unplanned step, and on float64 storage — the whole step or a trunk in micro-batches — equal
// to it to float64 rounding. max_norm 0.05 clips every step of these models.
func TestClippedPlans(t *testing.T) {
	for _, c := range []struct {
		name, path string
		cfg        plan.Config
		kind       Kind
		tol        float64
	}{
		{"small fits", "../testdata/small.cnn", plan.Config{}, Arena, 2e-5},
		{"small whole step", "../testdata/small.cnn", plan.Config{MicroBatch: 3}, Float64, 1e-12},
		{"deep trunk", "../testdata/deep.cnn", plan.Config{MicroBatch: 4, Trunk: "c4"}, Float64, 1e-12},
		{"mnist", "../../../examples/mnist.cnn", plan.Config{Batch: 5}, Arena, 2e-5},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := withClip(t, c.path, "0.05")
			cfg := c.cfg
			if cfg.Batch == 0 {
				cfg.Batch = res.Train.Batch
			}
			p, err := plan.Build(res.Graph, cfg)
			require.NoError(t, err)
			require.NotNil(t, p.Clip)
			norm := p.Clip.NormStep
			for i, s := range p.Steps {
				if len(s.Updates) > 0 {
					require.Greater(t, i, norm, "%s updates before the norm", s.Text)
				}
				for _, o := range s.Outs {
					if p.Buffers[o.Buffer].Category == plan.CatGrad {
						require.Less(t, i, norm, "%s writes a gradient after the norm", s.Text)
					}
				}
			}
			r := runBoth(t, res.Graph, p, c.kind, 3)
			r.compare(t, c.tol)
			// the reference clipped: its coefficient on a fresh batch is below 1
			ref := reference.New(res.Graph, 11)
			out, err := ref.Run(pixelBatch(res.Graph, cfg.Batch, rand.New(rand.NewPCG(5, 6))), reference.Train)
			require.NoError(t, err)
			for _, n := range res.Graph.Nodes {
				if n.Op.Info().UpdateInput {
					require.Less(t, out.Values[n.Out()][0], 1.0, "max_norm 0.05 clips")
				}
			}
		})
	}
}
