package codegen_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// node builds a one-node graph: op over inputs of the given types, its
// output type from the op's type rule.
func node(t *testing.T, op ir.Op, attrs ir.Attrs, ins ...ir.Type) *ir.Node {
	t.Helper()
	g := ir.NewGraph("T")
	var vals []*ir.Value
	for i, ty := range ins {
		vals = append(vals, g.NewValue(string(rune('a'+i)), ty, ir.RoleActivation, dsl.Pos{}))
	}
	n := g.NewNode(op, op.String(), ir.Forward, dsl.Pos{}, vals, []string{"out"}, ir.RoleActivation)
	n.Attrs = attrs
	outs, err := op.Info().Infer(n)
	require.NoError(t, err)
	for i, ty := range outs {
		n.Outs[i].Type = ty
	}
	return n
}

// checkNode generates n's kernels, runs them on the CPU emulator with
// random inputs and compares with the reference.
func checkNode(t *testing.T, n *ir.Node, batch int64, seed uint64, o reference.NodeOptions) kernelcheck.Report {
	t.Helper()
	prog, err := codegen.GenerateNodes("T", []*ir.Node{n}, codegen.Options{Batch: batch})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err, string(prog.Source))
	defer dev.Close()
	ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(seed, 1)))
	r, err := kernelcheck.Node(dev, prog, n, ins, kernelcheck.Scalars{LR: 0.05, Step: o.Step, Seed: o.Seed}, o)
	require.NoError(t, err)
	require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, r.String())
	t.Log(r)
	return r
}

func TestElementwiseKernels(t *testing.T) {
	u8 := ir.Type{DType: ir.U8, Batched: true, Dims: []int64{5, 7, 3}}
	for _, batch := range []int64{1, 3} {
		checkNode(t, node(t, ir.OpToTensor, ir.Attrs{}, u8), batch, 1, reference.NodeOptions{})
		x := ir.F32Batched(3, 5, 7)
		checkNode(t, node(t, ir.OpAdd, ir.Attrs{}, x, x), batch, 2, reference.NodeOptions{})
		checkNode(t, node(t, ir.OpReLU, ir.Attrs{}, x), batch, 3, reference.NodeOptions{})
		checkNode(t, node(t, ir.OpReLUGrad, ir.Attrs{}, x, x), batch, 4, reference.NodeOptions{})
	}
}
