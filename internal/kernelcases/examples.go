package kernelcases

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Example is one node of a DSL op's example to check: Op is the example's op, Scale the range of
// its random activations (ops.DSL.TestScale), LR the graph's learning rate (fused updates read
// the reference's).
type Example struct {
	Name  string
	Op    *ops.Def
	N     *ir.Node
	Scale float64
	LR    float32
}

// Examples are the nodes of every DSL op's examples in the ops' harness model (ops.ExampleModel),
// fused as the trainers compile it: the nodes of the op's layer, forward and backward. Ops that
// the fuse pass always replaces (conv2d, linear, cross_entropy) have their blocks' own cases.
func Examples(t testing.TB) []Example {
	var out []Example
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
				out = append(out, Example{Name: call + ": " + n.Op.String(), Op: d, N: n, Scale: max(d.DSL.TestScale, 1), LR: float32(res.Graph.Opt.LR)})
			}
		}
	}
	return out
}

// Inputs are random inputs of the example's node at batch (kernelcheck.RandomInputs), the
// activations and their gradients scaled by the example's Scale, one value read twice
// (concat(x, x)) given the same data.
func (c Example) Inputs(batch int64, rng *rand.Rand) [][]float64 {
	ins := kernelcheck.RandomInputs(c.N, batch, rng)
	first := map[*ir.Value]int{}
	for j, v := range c.N.Ins {
		if k, seen := first[v]; seen {
			ins[j] = ins[k]
			continue
		}
		first[v] = j
		if v.Role == ir.RoleActivation || v.Role == ir.RoleActGrad {
			for k := range ins[j] {
				ins[j][k] = float64(float32(ins[j][k] * c.Scale))
			}
		}
	}
	return ins
}
