package codegen_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// exampleCheck is one node of an op's example to check.
type exampleCheck struct {
	name  string
	n     *ir.Node
	scale float64 // of the random activations (ops.DSL.TestScale)
	lr    float32 // the graph's learning rate (fused updates: the reference's)
}

// exampleChecks are the nodes of every DSL op's examples in the ops'
// harness model, fused as the trainers compile it: the nodes of the op's
// layer, forward and backward. Ops that the fuse pass always replaces
// (conv2d, linear, cross_entropy) have their blocks' own tests.
func exampleChecks(t *testing.T) ([]exampleCheck, []*ir.Node) {
	var checks []exampleCheck
	var nodes []*ir.Node
	for _, d := range ops.DSLOps() {
		if d.View || d.Kernel.ReplacedBy != "" {
			continue
		}
		for _, call := range d.DSL.Examples {
			res, err := compiler.CompileSource("t.cnn", []byte(ops.ExampleModel(d, call)), compiler.Options{})
			require.NoError(t, err, call)
			for _, n := range res.Graph.Nodes {
				if n.Name != ops.ExampleLayer || n.Op.Info().View {
					continue
				}
				checks = append(checks, exampleCheck{name: call + ": " + n.Op.String(), n: n, scale: max(d.DSL.TestScale, 1), lr: float32(res.Graph.Opt.LR)})
				nodes = append(nodes, n)
			}
		}
	}
	return checks, nodes
}

// Every kernel of every DSL op's examples runs on the CPU emulator with
// NaN-poisoned outputs against the float64 reference, at batches 1 and 3
// on the harness's odd shapes.
func TestEveryOpExampleKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		checks, nodes := exampleChecks(t)
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err)
		for i, c := range checks {
			rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(batch)))
			ins := kernelcheck.RandomInputs(c.n, batch, rng)
			first := map[*ir.Value]int{}
			for j, v := range c.n.Ins {
				if k, seen := first[v]; seen {
					ins[j] = ins[k] // one value read twice (concat(x, x)): one buffer
					continue
				}
				first[v] = j
				if v.Role == ir.RoleActivation || v.Role == ir.RoleActGrad {
					for k := range ins[j] {
						ins[j][k] = float64(float32(ins[j][k] * c.scale))
					}
				}
			}
			o := reference.NodeOptions{Training: true, Update: true, Seed: 7, Step: 3}
			r, err := kernelcheck.Node(dev, prog, c.n, ins, kernelcheck.Scalars{LR: c.lr, Step: o.Step, Seed: o.Seed}, o)
			require.NoError(t, err, c.name)
			require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s: %s", c.name, r)
			t.Logf("b%d %s: %s", batch, c.name, r)
		}
		dev.Close()
	}
}

// The same kernels compile with nvcc for every target without spills or
// local memory.
func TestPtxasEveryOpExample(t *testing.T) {
	nvcc.Require(t)
	_, nodes := exampleChecks(t)
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "examples.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}
