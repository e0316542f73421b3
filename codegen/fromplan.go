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
	w := newPlanWalk(p)
	if err := w.walkSteps(); err != nil {
		return nil, err
	}
	prog, err := generate(p.Graph.Name, w.items, opts)
	if err != nil {
		return nil, err
	}
	for _, l := range prog.Launches {
		if err := w.placeLaunch(l); err != nil {
			return nil, err
		}
	}
	return prog, nil
}

// planWalk lays a plan's steps out as the nodes to generate, in order.
type planWalk struct {
	p      *plan.Plan
	views  map[*ir.Value]*ir.Node // view output -> flatten/reshape node
	values map[string]*ir.Value   // the graph's values by name
	placed map[*ir.Node]bool      // views already added
	items  []genItem
	at     []stepPlace // per item
}

// stepPlace is where a generated node's launches run in the plan: its step
// (-1: a view, no step), the loop iteration and the micro-batch's first
// sample.
type stepPlace struct {
	step, iter int
	first      int64
}

func newPlanWalk(p *plan.Plan) *planWalk {
	w := &planWalk{p: p, views: map[*ir.Value]*ir.Node{}, values: map[string]*ir.Value{}, placed: map[*ir.Node]bool{}}
	for _, v := range p.Graph.Inputs {
		w.values[v.Name] = v
	}
	for _, n := range p.Graph.Nodes {
		if n.Op.Info().View {
			w.views[n.Out()] = n
		}
		for _, v := range n.Outs {
			w.values[v.Name] = v
		}
	}
	return w
}

// walkSteps adds the plan's steps in order, a micro-batch loop's once per
// iteration.
func (w *planWalk) walkSteps() error {
	p := w.p
	for i := 0; i < len(p.Steps); {
		s := p.Steps[i]
		if s.Loop < 0 {
			if err := w.addStep(s, 0, 0, p.Batch, nil); err != nil {
				return err
			}
			i++
			continue
		}
		if err := w.addLoop(p.Loops[s.Loop]); err != nil {
			return err
		}
		i = p.Loops[s.Loop].LastStep + 1
	}
	return nil
}

// addLoop unrolls loop l: its steps once per micro-batch, the accumulators
// zeroed before the first.
func (w *planWalk) addLoop(l *plan.Loop) error {
	p := w.p
	var zero []*ir.Value
	for _, id := range l.Zero {
		v := w.values[p.Buffers[id].Holds[0].Value]
		if v == nil {
			return fmt.Errorf("codegen: loop accumulator %s is no value of the graph", p.Buffers[id].Name)
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
			if err := w.addStep(p.Steps[k], int(it), first, samples, z); err != nil {
				return err
			}
		}
	}
	return nil
}

// addStep adds step s's node (after the views it reads) over samples
// samples from first, accumulating where the plan says so.
func (w *planWalk) addStep(s *plan.Step, iter int, first, samples int64, zero []*ir.Value) error {
	n := s.Node
	if n == nil {
		return fmt.Errorf("codegen: plan step %d (%s) has no IR node", s.Index, s.Text)
	}
	accumulate := false
	if w.p.DataParallel != nil && n.Op.Info().Loss && s.Loop < 0 {
		// a data-parallel rank computes its rows of the global batch as
		// one micro-batch: the loss and logits' gradient scaled by the
		// global batch (the scalar block's valid), the loss and correct
		// count — and the classifier tail's weight gradients — added to
		// zeroed buffers (summed across ranks after)
		accumulate = true
		zero = append(append([]*ir.Value{}, zero...), accumulatedOuts(n)...)
	}
	if s.Loop >= 0 {
		// the loss and correct count are summed over micro-batches
		accumulate = s.Accumulate || n.Op.Info().Loss
		if s.Accumulate && n.Attrs.Opt != nil {
			return fmt.Errorf("codegen: step %d accumulates into a fused update", s.Index)
		}
	}
	for _, v := range n.Ins {
		w.addViews(v)
	}
	w.items = append(w.items, genItem{node: n, batch: samples, zero: zero, accumulate: accumulate})
	w.at = append(w.at, stepPlace{step: s.Index, iter: iter, first: first})
	return nil
}

// accumulatedOuts are the outputs node n adds to when it accumulates
// (genItem.accumulate): its unbatched ones — softmax_cross_entropy's loss
// and correct count, linear_cross_entropy's and its dW, dB? too — but not
// a batched one (the logits, their gradient, dX), which it writes.
func accumulatedOuts(n *ir.Node) []*ir.Value {
	var out []*ir.Value
	for _, v := range n.Outs {
		if !v.Type.Batched {
			out = append(out, v)
		}
	}
	return out
}

// addViews adds the views v is read through, each once, before its reader.
func (w *planWalk) addViews(v *ir.Value) {
	if vn, ok := w.views[v]; ok && !w.placed[vn] {
		w.addViews(vn.Ins[0])
		w.placed[vn] = true
		w.items = append(w.items, genItem{node: vn, batch: w.p.Batch})
		w.at = append(w.at, stepPlace{step: -1})
	}
}

// placeLaunch records l's step and iteration and, in a micro-batch after
// the first, offsets its sliced operands and its first-sample argument.
func (w *planWalk) placeLaunch(l *Launch) error {
	at := w.at[l.Seq]
	l.Step, l.Iter = max(at.step, 0), at.iter
	if at.step < 0 || at.first == 0 {
		return nil
	}
	if err := w.offsetSlices(l, at); err != nil {
		return err
	}
	if arg, per, ok := FirstSampleArg(l); ok {
		l.Args[arg].Int = at.first * per
	}
	return nil
}

// FirstSampleArg says which argument of l, if any, is the place of its
// first sample in the whole batch, and how many units one sample counts
// for (the op's binding says whether its kernels take it): dropout counts
// elements, the loss rows, a kernel drawing the data block's augmentation
// samples (codegen/cpu/augment.go keys each sample by its position). A
// micro-batch sets it (placeLaunch); so does a data-parallel rank, whose
// share starts at rank·B/N of the global batch (runtime/trainer).
func FirstSampleArg(l *Launch) (arg int, perSample int64, ok bool) {
	last := len(l.Args) - 1
	if last < 0 || l.Args[last].Kind != kernelarg.Int || l.Node == nil {
		return 0, 0, false
	}
	if l.Node.Attrs.Aug != nil {
		return last, 1, true
	}
	if d := ops.Of(l.Node.Op); d != nil {
		switch d.Kernel.FirstSample {
		case ops.FirstElement:
			return last, l.Node.Out().Type.SampleElems(), true
		case ops.FirstRow:
			return last, 1, true
		}
	}
	return 0, 0, false
}

// offsetSlices points l's operands that the plan slices at the
// micro-batch's first sample.
func (w *planWalk) offsetSlices(l *Launch, at stepPlace) error {
	step := w.p.Steps[at.step]
	sliced := map[string]bool{}
	for _, o := range append(append([]plan.Operand{}, step.Ins...), step.Outs...) {
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
			return fmt.Errorf("codegen: %s: a micro-batch slice of %s does not start on a 32-bit word", step.Text, a.Value)
		}
		per := t.Bytes(1)
		if t.DType == ir.Argmax {
			per = t.SampleElems() * t.Bits / 8
		}
		l.Args[i].Offset = at.first * per
	}
	return nil
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
