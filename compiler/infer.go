package compiler

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// The inference passes (Options.Infer): instead of autodiff, `infer`
// makes the forward graph an inference graph, and `bnfold` folds each
// batch norm in evaluation into the conv before it, so that fuse then
// makes one conv block (conv + folded bias + activation + pool, no argmax)
// of what training runs as a conv, a statistics node and a normalisation.

// inferPass turns the forward graph into an inference graph: the loss's
// logits become the output (the loss and the labels go), and the ops that
// are the identity in evaluation (dropout) are removed, their readers
// reading their input. Batch norm stays, on its running statistics (an
// inference graph is always evaluated so), unless bnfold folds it.
//
// For a trainer's evaluation step (Context.Evaluation) the loss and labels
// stay: the graph is an evaluation graph (ir.Graph.Eval).
func inferPass(ctx *Context, g *ir.Graph) error {
	if g.Logits == nil || g.Loss == nil {
		return fmt.Errorf("infer: %s has no loss whose logits could be the output", g.Name)
	}
	if ctx.Evaluation {
		removeEvalIdentities(g)
		dropState(g)
		g.Eval = true
		return nil
	}
	loss := g.Loss.Def
	g.RemoveNodes(func(n *ir.Node) bool { return n == loss || n.Phase != ir.Forward })
	removeEvalIdentities(g)
	g.Loss = nil
	inputs := g.Inputs[:0]
	for _, v := range g.Inputs {
		if v.Role != ir.RoleLabel {
			inputs = append(inputs, v)
		}
	}
	g.Inputs = inputs
	dropState(g)
	g.Infer = true
	return nil
}

// dropState removes the optimizer state (none exists before autodiff; a
// graph given to the pass with it must not keep it).
func dropState(g *ir.Graph) {
	g.State = nil
	for _, p := range g.Params {
		p.State = nil
	}
}

// removeEvalIdentities removes the ops that are the identity in
// evaluation (dropout), their readers reading their input.
func removeEvalIdentities(g *ir.Graph) {
	repl := map[*ir.Value]*ir.Value{}
	val := func(v *ir.Value) *ir.Value {
		for repl[v] != nil {
			v = repl[v]
		}
		return v
	}
	g.RemoveNodes(func(n *ir.Node) bool {
		if n.Op.Info().EvalIdentity {
			repl[n.Out()] = n.Ins[0]
			return true
		}
		for i, v := range n.Ins {
			n.Ins[i] = val(v)
		}
		return false
	})
	g.Logits = val(g.Logits)
}

// bnfoldPass folds every batch norm whose input is a conv2d output read by
// nothing else into that conv: conv2d(x, w, b?) -> batchnorm_stats ->
// batchnorm2d becomes conv2d(x, w', b') with the parameters w' and b'
// (ir.Fold) that a loaded checkpoint's conv weight and bias, batch norm
// weight and bias and running statistics give. The batch norm's output
// keeps its name and position; the folded parameters are named
// CONV+BN.weight and CONV+BN.bias (not state_dict names: no checkpoint
// holds them). A batch norm after anything else stays as it is.
func bnfoldPass(_ *Context, g *ir.Graph) error {
	uses := g.Uses()
	folded := map[*ir.Node]*ir.Node{} // batchnorm2d -> the folded conv
	drop := map[*ir.Node]bool{}
	for _, n := range g.Nodes {
		if n.Op != ops.BatchNorm2D {
			continue
		}
		conv, stats := n.Ins[0].Def, n.Ins[1].Def
		if conv == nil || conv.Op != ir.OpConv2D || stats == nil || stats.Op != ops.BatchNormStats || !onlyReadBy(uses[conv.Out()], n, stats) {
			continue
		}
		folded[n] = foldConv(g, conv, stats, n)
		drop[conv], drop[stats] = true, true
	}
	if len(folded) == 0 {
		return nil
	}
	var nodes []*ir.Node
	for _, n := range g.Nodes {
		switch {
		case drop[n]:
		case folded[n] != nil:
			nodes = append(nodes, folded[n])
		default:
			nodes = append(nodes, n)
		}
	}
	g.Nodes = nodes
	removeUnread(g)
	return nil
}

// onlyReadBy: the readers are exactly a and b.
func onlyReadBy(readers []*ir.Node, a, b *ir.Node) bool {
	for _, r := range readers {
		if r != a && r != b {
			return false
		}
	}
	return len(readers) == 2
}

// foldConv is conv with bn (and its statistics node) folded in: a conv2d
// with the folded weight and bias, whose output is bn's output value (so
// its readers, name and position stay).
func foldConv(g *ir.Graph, conv, stats, bn *ir.Node) *ir.Node {
	layer := conv.Name + "+" + bn.Name
	w := conv.Ins[1]
	f := ir.Fold{Weight: w.Param.Name, Mean: stats.Ins[1].Param.Name, Var: stats.Ins[2].Param.Name, Eps: stats.Attrs.Eps}
	if len(conv.Ins) > 2 {
		f.ConvBias = conv.Ins[2].Param.Name
	}
	if len(bn.Ins) == 5 {
		f.Gamma, f.Beta = bn.Ins[3].Param.Name, bn.Ins[4].Param.Name
	}
	fw, fb := f, f
	fb.Bias = true
	pw := foldedParam(g, layer, "weight", w, &fw)
	pb := foldedParam(g, layer, "bias", w, &fb)
	pb.Value.Type = ir.F32Fixed(w.Type.Dims[0])
	n := &ir.Node{ID: conv.ID, Op: ir.OpConv2D, Name: conv.Name, Phase: ir.Forward, Pos: conv.Pos, Attrs: conv.Attrs,
		Ins: []*ir.Value{conv.Ins[0], pw.Value, pb.Value}, Outs: []*ir.Value{bn.Out()}}
	n.Attrs.Bias = true
	bn.Out().Def = n
	return n
}

// foldedParam adds a folded parameter of layer, placed in g.Params where
// the conv weight like is (the model's order).
func foldedParam(g *ir.Graph, layer, suffix string, like *ir.Value, f *ir.Fold) *ir.Param {
	p := &ir.Param{Name: layer + "." + suffix, Layer: layer, Init: like.Param.Init, Fold: f}
	p.Value = g.NewValue(p.Name, like.Type, ir.RoleParam, like.Pos)
	p.Value.Param = p
	at := len(g.Params)
	for i, q := range g.Params {
		if q == like.Param {
			at = i
		}
	}
	for i, q := range g.Params { // after the weight's earlier folded companions
		if i > at && q.Fold != nil && q.Layer == layer {
			at = i
		}
	}
	g.Params = append(g.Params[:at+1], append([]*ir.Param{p}, g.Params[at+1:]...)...)
	return p
}

// removeUnread drops the parameters and buffers no node reads any more.
func removeUnread(g *ir.Graph) {
	read := map[*ir.Value]bool{}
	for _, n := range g.Nodes {
		for _, v := range n.Ins {
			read[v] = true
		}
	}
	keep := func(ps []*ir.Param) []*ir.Param {
		var out []*ir.Param
		for _, p := range ps {
			if read[p.Value] {
				out = append(out, p)
			}
		}
		return out
	}
	g.Params, g.Buffers = keep(g.Params), keep(g.Buffers)
}
