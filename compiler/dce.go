package compiler

import (
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// dcePass removes forward nodes the loss does not depend on, with a warning
// at each removed statement, and parameters nothing reads any more.
func dcePass(ctx *Context, g *ir.Graph) error {
	live := map[*ir.Node]bool{}
	var mark func(v *ir.Value)
	mark = func(v *ir.Value) {
		if v.Def == nil || live[v.Def] {
			return
		}
		live[v.Def] = true
		for _, in := range v.Def.Ins {
			mark(in)
		}
	}
	if g.Loss != nil {
		mark(g.Loss)
	}
	warned := map[string]bool{}
	for _, n := range g.Nodes {
		if n.Phase == ir.Forward && !live[n] && !warned[n.Name] {
			warned[n.Name] = true
			ctx.Diags = append(ctx.Diags, dsl.Warnf(n.Pos, "%s is not used by the loss; it is not computed", n.Out().Name).Span(len(n.Op.String())))
		}
	}
	g.RemoveNodes(func(n *ir.Node) bool { return n.Phase == ir.Forward && !live[n] })
	read := map[*ir.Value]bool{}
	for _, n := range g.Nodes {
		for _, v := range n.Ins {
			read[v] = true
		}
	}
	kept := g.Params[:0]
	for _, p := range g.Params {
		if read[p.Value] {
			kept = append(kept, p)
		}
	}
	g.Params = kept
	return nil
}
