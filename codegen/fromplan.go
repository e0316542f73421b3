package codegen

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/plan"
)

// GenerateFromPlan produces the Program of a memory plan: the plan's steps
// in its order (recomputations included), on the plan's rewritten graph,
// so that each launch's buffers are those the plan placed (Plan.Offset).
// A micro-batch loop is unrolled: its steps run once per micro-batch, with
// kernels specialised for the micro-batch's samples, operands that the plan
// slices offset to the micro-batch's first sample, weight-gradient kernels
// adding into accumulators that are zeroed before the loop.
func GenerateFromPlan(p *plan.Plan, opts Options) (*Program, error) {
	if opts.Batch != p.Batch {
		return nil, fmt.Errorf("codegen: plan is for batch %d, asked for %d", p.Batch, opts.Batch)
	}
	views := map[*ir.Value]*ir.Node{} // view output -> flatten/reshape node
	values := map[string]*ir.Value{}
	for _, v := range p.Graph.Inputs {
		values[v.Name] = v
	}
	for _, n := range p.Graph.Nodes {
		if n.Op.Info().View {
			views[n.Out()] = n
		}
		for _, v := range n.Outs {
			values[v.Name] = v
		}
	}
	type where struct {
		step, iter int
		first      int64 // the micro-batch's first sample
	}
	var items []genItem
	var at []where // per item
	placed := map[*ir.Node]bool{}
	var addViews func(v *ir.Value)
	addViews = func(v *ir.Value) {
		if vn, ok := views[v]; ok && !placed[vn] {
			addViews(vn.Ins[0])
			placed[vn] = true
			items = append(items, genItem{node: vn, batch: p.Batch})
			at = append(at, where{step: -1})
		}
	}
	add := func(s *plan.Step, iter int, first, samples int64, zero []*ir.Value) error {
		n := s.Node
		if n == nil {
			return fmt.Errorf("codegen: plan step %d (%s) has no IR node", s.Index, s.Text)
		}
		accumulate := false
		if s.Loop >= 0 {
			// the loss and correct count are summed over micro-batches
			accumulate = s.Accumulate || n.Op.Info().Loss
			if s.Accumulate && n.Attrs.Opt != nil {
				return fmt.Errorf("codegen: step %d accumulates into a fused update", s.Index)
			}
		}
		for _, v := range n.Ins {
			addViews(v)
		}
		items = append(items, genItem{node: n, batch: samples, zero: zero, accumulate: accumulate})
		at = append(at, where{step: s.Index, iter: iter, first: first})
		return nil
	}
	for i := 0; i < len(p.Steps); {
		s := p.Steps[i]
		if s.Loop < 0 {
			if err := add(s, 0, 0, p.Batch, nil); err != nil {
				return nil, err
			}
			i++
			continue
		}
		l := p.Loops[s.Loop]
		var zero []*ir.Value
		for _, id := range l.Zero {
			v := values[p.Buffers[id].Holds[0].Value]
			if v == nil {
				return nil, fmt.Errorf("codegen: loop accumulator %s is no value of the graph", p.Buffers[id].Name)
			}
			zero = append(zero, v)
		}
		for it := int64(0); it < l.Count; it++ {
			first := it * l.MicroBatch
			samples := min(l.MicroBatch, p.Batch-first)
			for k := l.FirstStep; k <= l.LastStep; k++ {
				z := zero
				if it > 0 || k > l.FirstStep {
					z = nil
				}
				if err := add(p.Steps[k], int(it), first, samples, z); err != nil {
					return nil, err
				}
			}
		}
		i = l.LastStep + 1
	}
	prog, err := generate(p.Graph.Name, items, opts)
	if err != nil {
		return nil, err
	}
	for _, l := range prog.Launches {
		w := at[l.Seq]
		l.Step, l.Iter = max(w.step, 0), w.iter
		if w.step < 0 || w.first == 0 {
			continue
		}
		sliced := map[string]bool{}
		for _, o := range append(append([]plan.Operand{}, p.Steps[w.step].Ins...), p.Steps[w.step].Outs...) {
			if o.Slice {
				sliced[o.Value] = true
			}
		}
		for i, a := range l.Args {
			if a.Kind != kernelarg.Buffer || !sliced[a.Value.Name] {
				continue
			}
			t := a.Value.Type
			if t.DType == ir.Argmax && (t.SampleElems()*t.Bits)%32 != 0 {
				return nil, fmt.Errorf("codegen: %s: a micro-batch slice of %s does not start on a 32-bit word", p.Steps[w.step].Text, a.Value)
			}
			per := t.Bytes(1)
			if t.DType == ir.Argmax {
				per = t.SampleElems() * t.Bits / 8
			}
			l.Args[i].Offset = w.first * per
		}
		// the micro-batch's place in the whole batch (the op's binding says
		// whether its kernels take it): dropout counts elements, the loss rows
		if d := ops.Of(l.Node.Op); d != nil {
			switch d.Kernel.FirstSample {
			case ops.FirstElement:
				l.Args[len(l.Args)-1].Int = w.first * l.Node.Out().Type.SampleElems()
			case ops.FirstRow:
				l.Args[len(l.Args)-1].Int = w.first
			}
		}
	}
	return prog, nil
}

// GenerateEval produces the Program of evaluation: the forward nodes of a
// fused graph, with dropout as the identity (a view of its input).
func GenerateEval(g *ir.Graph, opts Options) (*Program, error) {
	var nodes []*ir.Node
	for _, n := range g.Nodes {
		if n.Phase == ir.Forward {
			nodes = append(nodes, n)
		}
	}
	opts.Eval = true
	return GenerateNodes(g.Name, nodes, opts)
}
