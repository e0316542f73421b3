package codegen_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// Whole steps with gradient clipping on the CUDA kernels (clip_norm_partial, clip_norm_coef, the
// updates reading the coefficient) against the float64 reference within kernelcheck.Tolerance,
// SGD with momentum and weight decay, and Adam; the reference's coefficient shows clipping is
// active (far below 1), so the updates' scaling is checked.
func TestClipGradNormSteps(t *testing.T) {
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9, weight_decay=0.01)", "adam(lr=0.01)"} {
		t.Run(opt, func(t *testing.T) {
			src := []byte(kernelcases.ClipModel(opt))
			res, err := compiler.CompileSource("clip.cnn", src, compiler.Options{Batch: 3})
			require.NoError(t, err)
			g := res.Graph
			ref := reference.New(g, 3)
			r, err := ref.Run(randomBatch(g, 3, rand.New(rand.NewPCG(3, 99))), reference.Train)
			require.NoError(t, err)
			for _, n := range g.Nodes {
				if n.Op == ops.ClipGradNormOp {
					require.Less(t, r.Values[n.Out()][0], 0.5, "clipping is active")
				}
			}
			checkSteps(t, "clip.cnn", src, 3, 3, 3)
		})
	}
}

// clip_grad_norm's kernels and the clipped updates, one node at a time against the float64
// reference (NaN-poisoned outputs, odd sizes).
func TestClipKernels(t *testing.T) {
	for variant := range 2 {
		var cases []nodeCase
		for _, c := range kernelcases.ClipChecks(t, variant) {
			cases = append(cases, nodeCase{c.N, c.O})
		}
		checkNodes(t, 1, 31, cases)
	}
}

// clip_grad_norm's kernels and the clipped updates compile for sm_80 and sm_90 without spills or
// local memory.
func TestPtxasClip(t *testing.T) {
	nvcc.Require(t)
	var nodes []*ir.Node
	for _, c := range kernelcases.ClipChecks(t, 0) {
		nodes = append(nodes, c.N)
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 1})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "kernels.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}

// The clipped step's kernels (the norm's tree reductions in shared memory among them) give the
// same bits in every thread order (TestKernelsAreRaceFree's race mode), the model planned as is
// and with a micro-batch loop before the norm.
func TestClipKernelsAreRaceFree(t *testing.T) {
	src := []byte(kernelcases.ClipModel("adam(lr=0.01)"))
	checkRaceFree(t, "clip.cnn", src, 3, plan.Config{}, codegen.FP32, 0)
	checkRaceFree(t, "clip.cnn", src, 3, plan.Config{MicroBatch: 2}, codegen.FP32, 0)
}
