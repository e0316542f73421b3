package ir_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
)

// A clone prints and verifies like the original, shares no node, value or
// parameter with it, and can be rewritten without touching it.
func TestCloneIsDeepAndEqual(t *testing.T) {
	src, err := os.ReadFile("../../examples/simplecnn.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("simplecnn.cnn", src, compiler.Options{})
	require.NoError(t, err)
	g := res.Graph
	c := g.Clone()
	require.NoError(t, c.Verify())
	assert.Equal(t, g.Text(), c.Text())
	orig := map[any]bool{}
	for _, n := range g.Nodes {
		orig[n] = true
		for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
			orig[v] = true
		}
	}
	for _, p := range g.Params {
		orig[p] = true
	}
	for i, n := range c.Nodes {
		assert.False(t, orig[n])
		assert.Equal(t, g.Nodes[i].ID, n.ID)
		for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
			assert.False(t, orig[v], "%s is shared", v)
			if v.Param != nil {
				assert.False(t, orig[v.Param])
				assert.Same(t, v.Param, c.ParamByName(v.Param.Name))
			}
		}
		for _, v := range n.Outs {
			assert.Same(t, n, v.Def)
		}
	}
	assert.Same(t, c.Loss, c.Loss.Def.Outs[0])
	// new names stay unique in the clone, and the original is unchanged
	before := g.Text()
	v := c.NewValue("pool1", ir.F32Fixed(1), ir.RoleActivation, c.Loss.Pos)
	assert.Equal(t, "pool1.1", v.Name)
	c.Nodes = c.Nodes[:1]
	assert.Equal(t, before, g.Text())
}

// In-place rules hold only where the types match and the op allows it.
func TestInPlaceInputs(t *testing.T) {
	src, err := os.ReadFile("../../examples/simplecnn.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("simplecnn.cnn", src, compiler.Options{})
	require.NoError(t, err)
	seen := map[string][]int{}
	for _, n := range res.Graph.Nodes {
		if n.Phase == ir.Backward && len(n.Outs) > 0 {
			seen[n.Out().Name] = n.InPlaceInputs()
		}
	}
	assert.Equal(t, []int{3}, seen["pool1.grad"], "conv2's masked input gradient may overwrite pool1")
	assert.Equal(t, []int{2}, seen["fc1.flatten.grad"], "fc1's may overwrite its flattened input")
	assert.Empty(t, seen["fc1.grad"], "fc2's input gradient has no mask epilogue")
}
