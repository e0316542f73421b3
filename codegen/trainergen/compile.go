package trainergen

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"sort"
	"strings"

	"github.com/cnnc/cnnc/runtime/device"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/units"
)

// PlanLayout places values where the memory plan put them, including the
// kernels' scratch buffers (split-K partial sums): each in its step's
// workspace buffer, which the plan keeps live during that step only.
type PlanLayout struct {
	Plan    *plan.Plan
	scratch map[*ir.Value]int64
}

// NewPlanLayout maps prog's scratch buffers (prog from
// codegen.GenerateFromPlan) into the plan's workspace buffers.
func NewPlanLayout(p *plan.Plan, prog *codegen.Program) (*PlanLayout, error) {
	l := &PlanLayout{Plan: p, scratch: map[*ir.Value]int64{}}
	type run struct{ step, iter int } // a step's launches in one loop iteration
	stepOf := map[*ir.Value]run{}
	for _, ln := range prog.Launches {
		for _, a := range ln.Args {
			if a.Kind == kernelarg.Buffer {
				stepOf[a.Value] = run{ln.Step, ln.Iter}
			}
		}
	}
	used := map[run]int64{}
	for _, v := range prog.Scratch { // creation order, as the target's workspace function sizes them
		r, ok := stepOf[v]
		if !ok {
			continue
		}
		st := r.step
		ws := p.Steps[st].Workspace
		if ws < 0 {
			return nil, fmt.Errorf("trainergen: step %d (%s) uses scratch %s but the plan gave it no workspace", st, p.Steps[st].Text, v.Name)
		}
		b := p.Buffers[ws]
		l.scratch[v] = b.Offset + used[r]
		used[r] += (v.Type.Bytes(prog.Batch) + 255) / 256 * 256
		if used[r] > b.Bytes {
			return nil, fmt.Errorf("trainergen: step %d's scratch needs %d bytes, its workspace holds %d", st, used[r], b.Bytes)
		}
	}
	return l, nil
}

func (l *PlanLayout) Offset(v *ir.Value) (int64, bool) {
	if o, ok := l.scratch[v]; ok {
		return o, true
	}
	return l.Plan.Offset(v)
}

// OffsetIn is where v lives for launch l: by the operands of l's plan step
// (a value recomputed, or local to a micro-batch loop, has more than one
// buffer over the step), else by name.
func (l *PlanLayout) OffsetIn(v *ir.Value, ln *codegen.Launch) (int64, bool) {
	if o, ok := l.scratch[v]; ok {
		return o, true
	}
	s := l.Plan.Steps[ln.Step]
	for _, ops := range [][]plan.Operand{s.Ins, s.Outs} {
		for _, o := range ops {
			if o.Value == v.Name {
				return l.Plan.Buffers[o.Buffer].Offset, true
			}
		}
	}
	return l.Plan.Offset(v)
}

// Bytes is the plan's arena: the trainer allocates exactly this.
func (l *PlanLayout) Bytes() int64 { return l.Plan.ArenaBytes }

// gapLayout places evaluation's values in the training arena, in the space
// that only holds the step's own temporaries: between training steps only
// the parameters and optimizer state (persistent buffers) hold anything, so
// evaluation can borrow the rest and needs no memory beyond the plan.
type gapLayout struct {
	offsets map[*ir.Value]int64
	size    int64
}

func (l *gapLayout) Offset(v *ir.Value) (int64, bool) {
	o, ok := l.offsets[v]
	return o, ok
}

func (l *gapLayout) Bytes() int64 { return l.size }

// newGapLayout fits evaluation's buffers (no reuse among them) into the
// training arena's non-persistent space, largest first, around the step's
// scalar block at scalars (which evaluation uses too); ok is false when
// they do not fit.
func newGapLayout(p *plan.Plan, eval *NaiveLayout, scalars int64) (*gapLayout, bool) {
	type gap struct{ start, end int64 }
	gaps := []gap{{0, p.ArenaBytes}}
	kept := []span{{scalars, device.StepScalarsBytes}}
	for _, b := range p.Buffers {
		if b.Persistent {
			kept = append(kept, span{b.Offset, b.Bytes})
		}
	}
	for _, k := range kept {
		var next []gap
		for _, g := range gaps {
			lo, hi := k.off, k.off+k.bytes
			if hi <= g.start || lo >= g.end {
				next = append(next, g)
				continue
			}
			if lo > g.start {
				next = append(next, gap{g.start, lo})
			}
			if hi < g.end {
				next = append(next, gap{hi, g.end})
			}
		}
		gaps = next
	}
	type item struct {
		v     *ir.Value
		bytes int64
	}
	var items []item
	for v := range eval.offsets {
		items = append(items, item{v, eval.sizes[v]})
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].bytes != items[j].bytes {
			return items[i].bytes > items[j].bytes
		}
		return items[i].v.Name < items[j].v.Name
	})
	l := &gapLayout{offsets: map[*ir.Value]int64{}, size: p.ArenaBytes}
	for _, it := range items {
		placed := false
		for i := range gaps {
			start := (gaps[i].start + 255) / 256 * 256
			if start+it.bytes <= gaps[i].end {
				l.offsets[it.v] = start
				gaps[i].start = start + it.bytes
				placed = true
				break
			}
		}
		if !placed {
			return nil, false
		}
	}
	return l, true
}

// span is a byte range of an arena.
type span struct{ off, bytes int64 }

// scalarsPlace is where the step's scalar block (device.StepScalarsBytes,
// 8-byte aligned) goes in the planned arena: in bytes that no buffer of the
// plan ever holds — the alignment padding after a buffer whose size is
// not a multiple of the plan's alignment (a bias, the loss) — so that it
// is never overwritten, preferring the bytes right after the labels or the
// images, so that one copy brings both. When the plan leaves no such
// bytes, it goes after the arena, which then grows by at most 39 bytes
// (grown is the new size, else 0).
func scalarsPlace(p *plan.Plan, inputs []span) (at, grown int64) {
	used := make([]span, 0, len(p.Buffers))
	for _, b := range p.Buffers {
		used = append(used, span{b.Offset, b.Bytes})
	}
	sort.Slice(used, func(i, j int) bool { return used[i].off < used[j].off })
	var holes []span
	end := int64(0) // the end of the bytes held so far
	for _, u := range append(used, span{p.ArenaBytes, 0}) {
		if u.off > end {
			holes = append(holes, span{end, u.off - end})
		}
		end = max(end, u.off+u.bytes)
	}
	fits := func(at int64) bool {
		for _, h := range holes {
			if at >= h.off && at+device.StepScalarsBytes <= h.off+h.bytes {
				return true
			}
		}
		return false
	}
	for _, in := range inputs { // right after an input: one copy for both
		if at := in.off + in.bytes; at%8 == 0 && fits(at) {
			return at, 0
		}
	}
	for _, h := range holes {
		if at := (h.off + 7) &^ 7; fits(at) {
			return at, 0
		}
	}
	at = (p.ArenaBytes + 7) &^ 7
	return at, at + device.StepScalarsBytes
}

// Compiled is a model ready to become a trainer.
type Compiled struct {
	Spec  *trainer.Spec
	Plan  *plan.Plan
	Train *codegen.Program
	Eval  *codegen.Program
	// Kernels is the CUDA C of training and evaluation in one file (the
	// CPU target's C++ for the CPU target).
	Kernels []byte
}

// Assemble generates the training step's kernels from p (res's memory
// plan, which package driver builds with target's workspace sizes: it is
// the one place that wires the planner to codegen), evaluation's kernels
// and the Spec; target nil is CUDA. eval, when not nil, is the model's
// evaluation compilation (compiler.Options.Evaluation) with batch norm
// folded into convs: evaluation then runs its forward kernels, the folded
// parameters (Spec.EvalFolds) computed from the trained ones before each
// evaluation, instead of the training graph's forward nodes.
func Assemble(res *compiler.Result, p *plan.Plan, target codegen.Target, eval *compiler.Result) (*Compiled, error) {
	evalGraph := res.Graph
	if eval != nil {
		evalGraph = eval.Graph
	}
	// with accumulate = N a step is one update of batch×N samples, in N
	// micro-batches of the batch (the plan's loop)
	batch := res.Train.StepBatch()
	if p.DataParallel != nil { // a rank's share of the step's batch
		batch = p.Batch
	}
	opts := codegen.Options{Batch: batch, SourceName: res.File.Name, Precision: codegen.Precision(res.Train.Precision), Target: target, SMs: res.Train.SMs, Arch: res.Train.Arch}
	train, err := codegen.GenerateFromPlan(p, opts)
	if err != nil {
		return nil, err
	}
	evalProg, err := codegen.GenerateEval(evalGraph, opts)
	if err != nil {
		return nil, err
	}
	isParam := trainedValue
	inputs := []*ir.Value{evalGraph.Inputs[0], evalGraph.Inputs[1]}
	place, err := NewPlanLayout(p, train)
	if err != nil {
		return nil, err
	}
	naive := NewNaiveLayout(evalProg, inputs, isParam)
	var ins []span
	for _, v := range inputs {
		if o, ok := p.Offset(v); ok {
			ins = append(ins, span{o, v.Type.Bytes(batch)})
		}
	}
	scalars, grown := scalarsPlace(p, ins)
	progs := Programs{Result: res, Train: train, TrainPlace: place, Eval: evalProg, EvalPlace: naive, EvalGraph: evalGraph, Scalars: scalars, ArenaBytes: grown}
	// evaluation borrows the training arena's temporary space, at the
	// largest batch (halving) whose forward pass fits there
	for m := batch; m >= 1; m /= 2 {
		ev, nv := evalProg, naive
		if m != batch {
			if ev, err = codegen.GenerateEval(evalGraph, codegen.Options{Batch: m, SourceName: res.File.Name, Precision: opts.Precision, Target: target, SMs: opts.SMs, Arch: opts.Arch}); err != nil {
				return nil, err
			}
			nv = NewNaiveLayout(ev, inputs, isParam)
		}
		if gl, ok := newGapLayout(p, nv, scalars); ok {
			progs.Eval, progs.EvalPlace, progs.EvalInTrainArena = ev, gl, true
			break
		}
	}
	evalProg = progs.Eval
	spec, err := BuildSpec(progs)
	if err != nil {
		return nil, err
	}
	if d := res.Data.Train; d != nil {
		spec.TrainData = trainer.DataSource{Kind: d.Kind, Path: d.Path, Where: d.Pos.String()}
	}
	if d := res.Data.Test; d != nil {
		spec.TestData = trainer.DataSource{Kind: d.Kind, Path: d.Path, Where: d.Pos.String()}
	}
	spec.PlanSummary = planSummary(p)
	if spec.DataParallel, err = dataParallel(p, train, spec); err != nil {
		return nil, err
	}
	kernels, err := mergeSources(train, evalProg)
	if err != nil {
		return nil, err
	}
	return &Compiled{Spec: spec, Plan: p, Train: train, Eval: evalProg, Kernels: kernels}, nil
}

func planSummary(p *plan.Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "memory plan: peak %s (%d bytes), kernel workspace included", units.FormatBytes(p.PeakBytes), p.PeakBytes)
	fmt.Fprintf(&b, "; strategy %s; in place: %s; recomputed: %s\n", p.Choices.Strategy, orNone(p.Choices.InPlace), orNone(p.Choices.Recompute))
	if p.Accumulate > 1 {
		fmt.Fprintf(&b, "gradient accumulation: a step is one update of up to %d samples, trained as %d micro-batches of %d (the train block's accumulate)\n",
			p.Batch, p.Accumulate, p.Batch/p.Accumulate)
	}
	return b.String()
}

// mergeSources puts evaluation's kernels after training's in one file:
// equal names are equal kernels, so each appears once.
func mergeSources(train, eval *codegen.Program) ([]byte, error) {
	seen := map[string]bool{}
	for _, k := range train.Kernels {
		seen[k.Name] = true
	}
	src := append([]byte(nil), train.Source...)
	for _, k := range eval.Kernels {
		if !seen[k.Name] {
			src = append(src, '\n')
			src = append(src, k.Text...)
		}
	}
	return src, nil
}

func orNone(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}
