package codegen_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// exampleNodes are the nodes of kernelcases.Examples.
func exampleNodes(checks []kernelcases.Example) []*ir.Node {
	var nodes []*ir.Node
	for _, c := range checks {
		nodes = append(nodes, c.N)
	}
	return nodes
}

// Every kernel of every DSL op's examples runs on the CPU emulator with
// NaN-poisoned outputs against the float64 reference, at batches 1 and 3
// on the harness's odd shapes.
func TestEveryOpExampleKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		checks := kernelcases.Examples(t)
		prog, err := codegen.GenerateNodes("T", exampleNodes(checks), codegen.Options{Batch: batch})
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err)
		for i, c := range checks {
			ins := c.Inputs(batch, rand.New(rand.NewPCG(uint64(i)+1, uint64(batch))))
			o := reference.NodeOptions{Training: true, Update: true, Seed: 7, Step: 3}
			r, err := kernelcheck.Node(dev, prog, c.N, ins, kernelcheck.Scalars{LR: c.LR, Step: o.Step, Seed: o.Seed}, o)
			require.NoError(t, err, c.Name)
			require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s: %s", c.Name, r)
			t.Logf("b%d %s: %s", batch, c.Name, r)
		}
		dev.Close()
	}
}

// The same kernels compile with nvcc for every target without spills or
// local memory.
func TestPtxasEveryOpExample(t *testing.T) {
	nvcc.Require(t)
	prog, err := codegen.GenerateNodes("T", exampleNodes(kernelcases.Examples(t)), codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "examples.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}
