package codegen_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
)

// An optimizer the table does not know is an error naming it — in the
// update kernels and in a weight gradient's fused update — never compiled
// as another optimizer.
func TestUnknownOptimizerIsAnError(t *testing.T) {
	g := ir.NewGraph("T")
	w := g.AddParam("fc", "weight", ir.Init{}, dsl.Pos{})
	w.Value.Type = ir.F32Fixed(3, 4)
	grad := g.NewValue("fc.weight.grad", w.Value.Type, ir.RoleGrad, dsl.Pos{})
	unknown := &ir.Optimizer{Kind: ir.OptimizerKind(99), LR: 0.1}
	u := g.NewNode(ir.OpSGDUpdate, "fc", ir.Update, dsl.Pos{}, []*ir.Value{w.Value, grad}, nil, 0)
	u.Attrs.Opt = unknown
	_, err := codegen.GenerateNodes("T", []*ir.Node{u}, codegen.Options{Batch: 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown optimizer optimizer99")

	// a fused update: the unknown optimizer keeps no state, so the layout
	// types; its kernel does not generate
	l := kernelcases.NewLinear(g, "l", 5, 3, true, false)
	dw := l.GradWeight(t, unknown)
	_, err = codegen.GenerateNodes("T", []*ir.Node{dw}, codegen.Options{Batch: 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "optimizer99")
}
