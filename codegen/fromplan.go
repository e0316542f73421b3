package codegen

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
)

// GenerateFromPlan produces the Program of a memory plan: the plan's steps
// in its order (recomputations included), on the plan's rewritten graph,
// so that each launch's buffers are those the plan placed (Plan.Offset).
// Micro-batch loops need kernels that address slices and accumulate, which
// codegen does not emit yet: such plans are refused with a message saying
// so.
func GenerateFromPlan(p *plan.Plan, opts Options) (*Program, error) {
	if len(p.Loops) > 0 {
		return nil, fmt.Errorf("codegen: the memory plan micro-batches (%s); trainers for micro-batched plans are not generated yet — raise the budget or lower the batch (cnnc plan --max-batch shows what fits)", p.Loops[0].What)
	}
	if opts.Batch != p.Batch {
		return nil, fmt.Errorf("codegen: plan is for batch %d, asked for %d", p.Batch, opts.Batch)
	}
	views := map[*ir.Value]*ir.Node{} // view output -> flatten/reshape node
	for _, n := range p.Graph.Nodes {
		if n.Op == ir.OpFlatten || n.Op == ir.OpReshape {
			views[n.Out()] = n
		}
	}
	var nodes []*ir.Node
	stepOf := map[int]int{} // index in nodes -> plan step
	placed := map[*ir.Node]bool{}
	var addViews func(v *ir.Value)
	addViews = func(v *ir.Value) {
		if vn, ok := views[v]; ok && !placed[vn] {
			addViews(vn.Ins[0])
			placed[vn] = true
			nodes = append(nodes, vn)
		}
	}
	for _, s := range p.Steps {
		if s.Node == nil {
			return nil, fmt.Errorf("codegen: plan step %d (%s) has no IR node", s.Index, s.Text)
		}
		if s.Samples != p.Batch {
			return nil, fmt.Errorf("codegen: plan step %d runs %d of %d samples", s.Index, s.Samples, p.Batch)
		}
		for _, v := range s.Node.Ins {
			addViews(v)
		}
		stepOf[len(nodes)] = s.Index
		nodes = append(nodes, s.Node)
	}
	prog, err := GenerateNodes(p.Graph.Name, nodes, opts)
	if err != nil {
		return nil, err
	}
	for _, l := range prog.Launches {
		l.Step = stepOf[l.Seq]
	}
	return prog, nil
}

// GenerateEval produces the Program of evaluation: the forward nodes of a
// fused graph, with dropout as the identity (a view of its input).
func GenerateEval(g *ir.Graph, opts Options) (*Program, error) {
	var nodes []*ir.Node
	for _, n := range g.Nodes {
		if n.Phase != ir.Forward {
			continue
		}
		if n.Op == ir.OpDropout {
			// evaluation keeps every element: the output is the input
			view := *n
			view.Op = ir.OpReshape
			nodes = append(nodes, &view)
			continue
		}
		nodes = append(nodes, n)
	}
	return GenerateNodes(g.Name, nodes, opts)
}
