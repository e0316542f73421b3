package ir_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
)

// tiny builds image -> linear -> cross_entropy by hand.
func tiny(t *testing.T) (*Graph, *Node) {
	g := NewGraph("Tiny")
	x := g.AddInput("x", F32Batched(4), RoleInput, dsl.Pos{})
	y := g.AddInput("y", Type{DType: Class, Batched: true, Classes: 3}, RoleLabel, dsl.Pos{})
	w := g.AddParam("fc", "weight", Init{Kind: InitKaimingUniform, FanIn: 4}, dsl.Pos{})
	w.Value.Type = F32Fixed(3, 4)
	fc := g.NewNode(OpLinear, "fc", Forward, dsl.Pos{}, []*Value{x, w.Value}, []string{"fc"}, RoleActivation)
	fc.Attrs.Out = 3
	fc.Out().Type = F32Batched(3)
	g.Append(fc)
	ce := g.NewNode(OpCrossEntropy, "loss", Forward, dsl.Pos{}, []*Value{fc.Out(), y}, []string{"loss"}, RoleLoss)
	ce.Out().Type = F32Fixed()
	g.Append(ce)
	g.Loss, g.Logits = ce.Out(), fc.Out()
	require.NoError(t, g.Verify())
	return g, fc
}

func TestVerifierAcceptsAWellFormedGraph(t *testing.T) {
	g, _ := tiny(t)
	assert.Equal(t, "graph Tiny\ninput %x: f32[B,4]\ninput %y: class3[B]\nparam %fc.weight: f32[3,4] init=kaiming_uniform(a=sqrt5,fan_in=4)\nforward:\n  %fc = linear(%x, %fc.weight) out=3 : f32[B,3]\n  %loss = cross_entropy(%fc, %y) : f32[]\nloss %loss\n", g.Text())
}

func TestVerifierCatchesBrokenIR(t *testing.T) {
	cases := map[string]struct {
		breakIt func(g *Graph, fc *Node)
		want    string
	}{
		"wrong output type": {func(g *Graph, fc *Node) { fc.Out().Type = F32Batched(5) }, "output %fc is f32[B,5] but linear infers f32[B,3]"},
		"use before def":    {func(g *Graph, fc *Node) { g.Nodes[0], g.Nodes[1] = g.Nodes[1], g.Nodes[0] }, "cross_entropy reads %fc before it is defined"},
		"duplicate name":    {func(g *Graph, fc *Node) { fc.Out().Name = "x" }, "two values are named %x"},
		"unknown type":      {func(g *Graph, fc *Node) { g.Params[0].Value.Type = Type{} }, "%fc.weight has no type"},
		"no loss":           {func(g *Graph, fc *Node) { g.Loss = nil }, "graph has no loss"},
		"loss not scalar":   {func(g *Graph, fc *Node) { g.Loss = fc.Out() }, "loss %fc is f32[B,3], want f32[]"},
		"phase order":       {func(g *Graph, fc *Node) { fc.Phase = Backward }, "comes after the backward phase"},
		"bad attribute":     {func(g *Graph, fc *Node) { fc.Attrs.In = 7 }, "linear expects 7 input features"},
		"update twice": {func(g *Graph, fc *Node) {
			opt := &Optimizer{Kind: SGD, LR: 0.1}
			for i := 0; i < 2; i++ {
				u := g.NewNode(OpSGDUpdate, "fc", Update, dsl.Pos{}, []*Value{g.Params[0].Value, g.Params[0].Value}, nil, 0)
				u.Attrs.Opt = opt
				g.Append(u)
			}
		}, "parameter %fc.weight is updated 2 times"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			g, fc := tiny(t)
			c.breakIt(g, fc)
			err := g.Verify()
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestTypes(t *testing.T) {
	ty := F32Batched(16, 126, 126)
	assert.Equal(t, "f32[B,16,126,126]", ty.String())
	assert.Equal(t, int64(32*16*126*126), ty.Elems(32))
	assert.Equal(t, int64(4*32*16*126*126), ty.Bytes(32))
	assert.Equal(t, "16x126x126", ty.DimsString())
	assert.Equal(t, int64(16*3*3*3), F32Fixed(16, 3, 3, 3).Elems(32), "parameters do not scale with the batch")
	assert.Equal(t, "class10[B]", Type{DType: Class, Batched: true, Classes: 10}.String())
	assert.Equal(t, "?", Type{}.String())
	assert.True(t, ty.Equal(F32Batched(16, 126, 126)))
	assert.False(t, ty.Equal(F32Fixed(16, 126, 126)))
}

func TestMulChecked(t *testing.T) {
	n, ok := MulChecked(32, 124, 124)
	assert.True(t, ok)
	assert.Equal(t, int64(492032), n)
	_, ok = MulChecked(1<<21, 1<<20)
	assert.False(t, ok, "past 2^40")
	_, ok = MulChecked(1<<62, 4)
	assert.False(t, ok, "int64 overflow")
	_, ok = MulChecked(-1)
	assert.False(t, ok)
}

func TestConvOut(t *testing.T) {
	for _, c := range []struct{ size, k, s, p, want int64 }{
		{128, 3, 1, 0, 126}, {126, 2, 2, 0, 63}, {61, 2, 2, 0, 30}, {28, 3, 1, 1, 28}, {7, 3, 2, 1, 4},
	} {
		got, ok := ConvOut(c.size, c.k, c.s, c.p)
		assert.True(t, ok)
		assert.Equal(t, c.want, got, "%+v", c)
	}
	_, ok := ConvOut(2, 3, 1, 0)
	assert.False(t, ok)
}

// Every op of the IR's table has a row that the registry filled.
func TestOpTableIsComplete(t *testing.T) {
	for i := 0; i < NumOps(); i++ {
		op := Op(i)
		require.True(t, op.Defined(), "op %d has no table row", i)
		info := op.Info()
		assert.NotNil(t, info.Infer, info.Name)
		assert.NotNil(t, info.FLOPs, info.Name)
		back, ok := OpByName(info.Name)
		assert.True(t, ok)
		assert.Equal(t, op, back)
		assert.NotNil(t, ops.Of(op), info.Name)
	}
}

func TestUnknownOptimizersAreErrors(t *testing.T) {
	g, _ := tiny(t)
	u := g.NewNode(OpSGDUpdate, "fc", Update, dsl.Pos{}, []*Value{g.Params[0].Value, g.Params[0].Value}, nil, 0)
	u.Attrs.Opt = &Optimizer{Kind: OptimizerKind(200), LR: 0.1}
	g.Append(u)
	err := g.Verify()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown optimizer optimizer200")
	assert.Nil(t, u.Attrs.Opt.StateNames(), "no state is invented for an unknown optimizer")
}
