package compiler

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// The reverse-mode engine. Each op's gradient rule is in its file in
// compiler/ops (Def.Grad); the engine walks a forward node list backwards
// from the loss, sums the gradients of a value read by several nodes with
// add, and calls each node's rule. Autodiff runs it over the unfused
// forward graph, the fuse pass over the fused one: one engine, two sets of
// rules (the fused ops' rules fuse the optimizer update into their weight
// gradients).

// gradBuilder implements ops.GradBuilder for one run of the engine.
type gradBuilder struct {
	g         *ir.Graph
	readers   map[*ir.Value][]*ir.Node
	needsGrad map[*ir.Value]bool
	marks     map[string]map[*ir.Value]bool
	err       error // the first ill-typed node a rule made
}

func newGradBuilder(g *ir.Graph, nodes []*ir.Node) *gradBuilder {
	b := &gradBuilder{g: g, readers: map[*ir.Value][]*ir.Node{}, needsGrad: map[*ir.Value]bool{}, marks: map[string]map[*ir.Value]bool{}}
	// needsGrad: parameters and everything computed from them
	for _, p := range g.Params {
		b.needsGrad[p.Value] = true
	}
	for _, n := range nodes {
		for _, v := range n.Ins {
			b.readers[v] = append(b.readers[v], n)
			if b.needsGrad[v] {
				for _, o := range n.Outs {
					b.needsGrad[o] = true
				}
			}
		}
	}
	return b
}

func (b *gradBuilder) Graph() *ir.Graph                    { return b.g }
func (b *gradBuilder) Readers(v *ir.Value) []*ir.Node      { return b.readers[v] }
func (b *gradBuilder) NeedsGrad(v *ir.Value) bool          { return b.needsGrad[v] }
func (b *gradBuilder) Marked(key string, v *ir.Value) bool { return b.marks[key][v] }

func (b *gradBuilder) Mark(key string, v *ir.Value) {
	if b.marks[key] == nil {
		b.marks[key] = map[*ir.Value]bool{}
	}
	b.marks[key][v] = true
}

// Emit appends a backward node computing the gradient with respect to wrt
// (an activation or a parameter) and returns its output.
func (b *gradBuilder) Emit(op ir.Op, fwd *ir.Node, attrs ir.Attrs, wrt *ir.Value, ins ...*ir.Value) *ir.Value {
	role := ir.RoleActGrad
	if wrt.Role == ir.RoleParam {
		role = ir.RoleGrad
	}
	n := b.Node(op, fwd, attrs, ins, []string{wrt.Name + ".grad"}, role)
	n.Out().Param = wrt.Param
	return n.Out()
}

// Node appends a backward node with the given outputs and infers its types.
func (b *gradBuilder) Node(op ir.Op, fwd *ir.Node, attrs ir.Attrs, ins []*ir.Value, outs []string, role ir.Role) *ir.Node {
	n := b.g.NewNode(op, fwd.Name, ir.Backward, fwd.Pos, ins, outs, role)
	n.Attrs = attrs
	b.g.Append(n)
	if err := inferNode(n); err != nil && b.err == nil {
		b.err = fmt.Errorf("the gradient rule of %s made an ill-typed node: %s: %v", fwd.Op, n.Text(), err)
	}
	return n
}

// reverse appends the backward nodes of the forward nodes (in schedule
// order) and returns, for every value that needs a gradient and got one,
// the gradients of its readers (to be summed: the parameters').
func reverse(b *gradBuilder, nodes []*ir.Node, loss *ir.Value) (map[*ir.Value][]*ir.Value, error) {
	partial := map[*ir.Value][]*ir.Value{}
	for i := len(nodes) - 1; i >= 0; i-- {
		n := nodes[i]
		out := n.Out()
		var dy *ir.Value
		if out != loss {
			dy = sumGradients(b, n, out, partial[out])
			if dy == nil {
				continue // nothing downstream needs it
			}
		}
		need := make([]bool, len(n.Ins))
		any := false
		for j, v := range n.Ins {
			need[j] = b.needsGrad[v]
			any = any || need[j]
		}
		if !any {
			continue
		}
		d := ops.Of(n.Op)
		if d == nil || d.Grad == nil {
			return nil, fmt.Errorf("autodiff: no gradient rule for %s", n.Op)
		}
		for j, gv := range d.Grad(b, n, dy, need) {
			if gv != nil && need[j] {
				partial[n.Ins[j]] = append(partial[n.Ins[j]], gv)
			}
		}
		if b.err != nil {
			return nil, fmt.Errorf("autodiff: %v", b.err)
		}
	}
	return partial, nil
}

// autodiffPass appends the backward phase (reverse-mode, one rule per op,
// fan-out gradients summed with add) and the update phase (one update per
// parameter, with its optimizer state).
func autodiffPass(ctx *Context, g *ir.Graph) error {
	if g.Loss == nil {
		return fmt.Errorf("autodiff: the graph has no loss")
	}
	if g.Opt == nil {
		return fmt.Errorf("autodiff: no optimizer configured")
	}
	forward := append([]*ir.Node(nil), g.Nodes...)
	b := newGradBuilder(g, forward)
	partial, err := reverse(b, forward, g.Loss)
	if err != nil {
		return err
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
		if err := addState(g, p); err != nil {
			return err
		}
	}
	return addUpdates(ctx, g, g.Params, grads)
}

// addUpdates appends the update of each parameter of params from its
// gradient, after the gradient clipping coefficient when the train block
// clips (ops.ClipGradients, which reads every gradient first).
func addUpdates(ctx *Context, g *ir.Graph, params []*ir.Param, grads map[*ir.Param]*ir.Value) error {
	var all []*ir.Value
	for _, p := range params {
		all = append(all, grads[p])
	}
	coef := ops.ClipGradients(g, all, ctx.Train.Pos["clip_grad_norm"])
	for _, p := range params {
		if err := addUpdate(g, p, grads[p], coef); err != nil {
			return err
		}
	}
	return nil
}

// sumGradients returns the gradient of v: its single contribution, or the
// sum of several (a value read by more than one layer).
func sumGradients(b *gradBuilder, at *ir.Node, v *ir.Value, parts []*ir.Value) *ir.Value {
	if len(parts) == 0 {
		return nil
	}
	sum := parts[0]
	for _, p := range parts[1:] {
		sum = b.Emit(ir.OpAdd, at, ir.Attrs{}, v, sum, p)
	}
	return sum
}

// addState creates parameter p's optimizer state.
func addState(g *ir.Graph, p *ir.Param) error {
	if _, err := g.Opt.Info(); err != nil {
		return fmt.Errorf("autodiff: %v", err)
	}
	for _, s := range g.Opt.StateNames() {
		v := g.NewValue(p.Name+"."+s, p.Value.Type, ir.RoleOptState, p.Value.Pos)
		v.Param = p
		p.State = append(p.State, v)
		g.State = append(g.State, v)
	}
	return nil
}

// addUpdate appends p's update from its gradient: the optimizer's update
// op, reading the clipping coefficient coef last unless it is nil.
func addUpdate(g *ir.Graph, p *ir.Param, grad, coef *ir.Value) error {
	info, err := g.Opt.Info()
	if err != nil {
		return fmt.Errorf("autodiff: %v", err)
	}
	ins := append([]*ir.Value{p.Value, grad}, p.State...)
	if coef != nil {
		ins = append(ins, coef)
	}
	n := g.NewNode(info.UpdateOp, p.Layer, ir.Update, p.Value.Pos, ins, nil, 0)
	n.Attrs.Opt = g.Opt
	g.Append(n)
	return nil
}
