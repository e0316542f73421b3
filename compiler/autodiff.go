package compiler

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// gradRule emits the backward nodes of forward node n given dy, the
// gradient of its output (nil for the loss, whose gradient is 1), and
// returns one gradient per input. need[i] says whether input i needs one;
// a rule returns nil where it does not.
type gradRule func(b *gradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value

// gradRules holds one rule per differentiable op.
var gradRules = map[ir.Op]gradRule{
	ir.OpConv2D: func(b *gradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
		x, w := n.Ins[0], n.Ins[1]
		gs := make([]*ir.Value, len(n.Ins))
		if need[0] {
			a := n.Attrs
			a.Dims = x.Type.Dims
			gs[0] = b.emit(ir.OpConv2DGradInput, n, a, x, dy, w)
		}
		gs[1] = b.emit(ir.OpConv2DGradWeight, n, n.Attrs, w, dy, x)
		if len(n.Ins) > 2 {
			gs[2] = b.emit(ir.OpConv2DGradBias, n, ir.Attrs{}, n.Ins[2], dy)
		}
		return gs
	},
	ir.OpReLU: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		// the mask is read from the output, y > 0, as PyTorch does
		return []*ir.Value{b.emit(ir.OpReLUGrad, n, ir.Attrs{}, n.Ins[0], dy, n.Out())}
	},
	ir.OpMaxPool2D: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.emit(ir.OpMaxPool2DGrad, n, n.Attrs, n.Ins[0], dy, n.Ins[0])}
	},
	ir.OpAvgPool2D: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		a := n.Attrs
		a.Dims = n.Ins[0].Type.Dims
		return []*ir.Value{b.emit(ir.OpAvgPool2DGrad, n, a, n.Ins[0], dy)}
	},
	ir.OpFlatten: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.emit(ir.OpReshape, n, ir.Attrs{Dims: n.Ins[0].Type.Dims}, n.Ins[0], dy)}
	},
	ir.OpLinear: func(b *gradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
		x, w := n.Ins[0], n.Ins[1]
		gs := make([]*ir.Value, len(n.Ins))
		if need[0] {
			gs[0] = b.emit(ir.OpLinearGradInput, n, ir.Attrs{}, x, dy, w)
		}
		gs[1] = b.emit(ir.OpLinearGradWeight, n, ir.Attrs{}, w, dy, x)
		if len(n.Ins) > 2 {
			gs[2] = b.emit(ir.OpLinearGradBias, n, ir.Attrs{}, n.Ins[2], dy)
		}
		return gs
	},
	ir.OpDropout: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		// the same counter-based mask as the forward pass, regenerated
		return []*ir.Value{b.emit(ir.OpDropoutGrad, n, n.Attrs, n.Ins[0], dy)}
	},
	ir.OpAdd: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{dy, dy}
	},
	ir.OpCrossEntropy: func(b *gradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.emit(ir.OpCrossEntropyGrad, n, ir.Attrs{Smoothing: n.Attrs.Smoothing}, n.Ins[0], n.Ins[0], n.Ins[1]), nil}
	},
}

// updateOps maps each optimizer to its update op.
var updateOps = map[ir.OptimizerKind]ir.Op{
	ir.SGD:   ir.OpSGDUpdate,
	ir.Adam:  ir.OpAdamUpdate,
	ir.AdamW: ir.OpAdamUpdate,
}

type gradBuilder struct{ g *ir.Graph }

// emit appends a backward node computing the gradient with respect to wrt
// (an activation or a parameter) and returns its output.
func (b *gradBuilder) emit(op ir.Op, fwd *ir.Node, attrs ir.Attrs, wrt *ir.Value, ins ...*ir.Value) *ir.Value {
	role := ir.RoleActGrad
	if wrt.Role == ir.RoleParam {
		role = ir.RoleGrad
	}
	n := b.g.NewNode(op, fwd.Name, ir.Backward, fwd.Pos, ins, []string{wrt.Name + ".grad"}, role)
	n.Attrs = attrs
	n.Out().Param = wrt.Param
	b.g.Append(n)
	if err := inferNode(n); err != nil {
		panic(fmt.Sprintf("autodiff: gradient rule for %s made an ill-typed %s: %v", fwd.Op, op, err))
	}
	return n.Out()
}

// autodiffPass appends the backward phase (reverse-mode, one rule per op
// from gradRules, fan-out gradients summed with add) and the update phase
// (one update per parameter, with its optimizer state).
func autodiffPass(ctx *Context, g *ir.Graph) error {
	if g.Loss == nil {
		return fmt.Errorf("autodiff: the graph has no loss")
	}
	// needsGrad: parameters and everything computed from them.
	needsGrad := map[*ir.Value]bool{}
	for _, p := range g.Params {
		needsGrad[p.Value] = true
	}
	forward := append([]*ir.Node(nil), g.Nodes...)
	for _, n := range forward {
		for _, v := range n.Ins {
			if needsGrad[v] {
				for _, o := range n.Outs {
					needsGrad[o] = true
				}
			}
		}
	}
	b := &gradBuilder{g: g}
	partial := map[*ir.Value][]*ir.Value{}
	for i := len(forward) - 1; i >= 0; i-- {
		n := forward[i]
		out := n.Out()
		var dy *ir.Value
		if out != g.Loss {
			dy = sumGradients(b, n, out, partial[out])
			if dy == nil {
				continue // nothing downstream needs it
			}
		}
		rule, ok := gradRules[n.Op]
		if !ok {
			return fmt.Errorf("autodiff: no gradient rule for %s", n.Op)
		}
		need := make([]bool, len(n.Ins))
		any := false
		for j, v := range n.Ins {
			need[j] = needsGrad[v]
			any = any || need[j]
		}
		if !any {
			continue
		}
		for j, gv := range rule(b, n, dy, need) {
			if gv != nil && need[j] {
				partial[n.Ins[j]] = append(partial[n.Ins[j]], gv)
			}
		}
	}
	return addUpdates(g, b, partial)
}

// sumGradients returns the gradient of v: its single contribution, or the
// sum of several (a value read by more than one layer).
func sumGradients(b *gradBuilder, at *ir.Node, v *ir.Value, parts []*ir.Value) *ir.Value {
	if len(parts) == 0 {
		return nil
	}
	sum := parts[0]
	for _, p := range parts[1:] {
		sum = b.emit(ir.OpAdd, at, ir.Attrs{}, v, sum, p)
	}
	return sum
}

func addUpdates(g *ir.Graph, b *gradBuilder, partial map[*ir.Value][]*ir.Value) error {
	opt := g.Opt
	if opt == nil {
		return fmt.Errorf("autodiff: no optimizer configured")
	}
	grads := map[*ir.Param]*ir.Value{}
	for _, p := range g.Params {
		parts := partial[p.Value]
		if len(parts) == 0 {
			return fmt.Errorf("autodiff: parameter %s gets no gradient", p.Name)
		}
		// the parameter's last reader is where the sum belongs
		grads[p] = sumGradients(b, parts[len(parts)-1].Def, p.Value, parts)
	}
	for _, p := range g.Params {
		ins := []*ir.Value{p.Value, grads[p]}
		for _, s := range opt.StateNames() {
			v := g.NewValue(p.Name+"."+s, p.Value.Type, ir.RoleOptState, p.Value.Pos)
			v.Param = p
			p.State = append(p.State, v)
			g.State = append(g.State, v)
			ins = append(ins, v)
		}
		n := g.NewNode(updateOps[opt.Kind], p.Layer, ir.Update, p.Value.Pos, ins, nil, 0)
		n.Attrs.Opt = opt
		g.Append(n)
	}
	return nil
}
