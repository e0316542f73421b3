package trainergen

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/trainer"
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
			if a.Kind == codegen.ArgBuffer {
				stepOf[a.Value] = run{ln.Step, ln.Iter}
			}
		}
	}
	used := map[run]int64{}
	for _, v := range prog.Scratch { // creation order, as codegen.Workspace sizes them
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

// Compiled is a model ready to become a trainer.
type Compiled struct {
	Spec  *trainer.Spec
	Plan  *plan.Plan
	Train *codegen.Program
	Eval  *codegen.Program
	// Kernels is the CUDA C of training and evaluation in one file.
	Kernels []byte
}

// Compile plans memory for res at its batch size (under budget, if any),
// generates the training and evaluation kernels and assembles the Spec.
func Compile(res *compiler.Result, budget int64, budgetSource string) (*Compiled, error) {
	cfg := plan.Config{Budget: budget, BudgetSource: budgetSource}
	if budgetSource == "" && budget > 0 {
		cfg.BudgetPos = res.Train.Pos["memory_budget"]
	}
	return CompilePlan(res, cfg)
}

// CompilePlan is Compile with the planner's configuration given (e.g. a
// forced micro-batch); the batch and the workspace sizes are filled in.
func CompilePlan(res *compiler.Result, cfg plan.Config) (*Compiled, error) {
	batch := res.Train.Batch
	cfg.Batch, cfg.Workspace = batch, codegen.Workspace
	p, err := plan.Build(res.Graph, cfg)
	if err != nil {
		return nil, err
	}
	opts := codegen.Options{Batch: batch, SourceName: res.File.Name}
	train, err := codegen.GenerateFromPlan(p, opts)
	if err != nil {
		return nil, err
	}
	eval, err := codegen.GenerateEval(res.Graph, opts)
	if err != nil {
		return nil, err
	}
	place, err := NewPlanLayout(p, train)
	if err != nil {
		return nil, err
	}
	isParam := func(v *ir.Value) bool { return v.Role == ir.RoleParam || v.Role == ir.RoleOptState }
	evalPlace := NewNaiveLayout(eval, []*ir.Value{res.Graph.Inputs[0], res.Graph.Inputs[1]}, isParam)
	spec, err := BuildSpec(Programs{Result: res, Train: train, TrainPlace: place, Eval: eval, EvalPlace: evalPlace})
	if err != nil {
		return nil, err
	}
	if d := res.Data.Train; d != nil {
		spec.TrainData = trainer.DataSource{Kind: d.Kind, Path: d.Path}
	}
	if d := res.Data.Test; d != nil {
		spec.TestData = trainer.DataSource{Kind: d.Kind, Path: d.Path}
	}
	spec.PlanSummary = planSummary(p)
	kernels, err := mergeSources(train, eval)
	if err != nil {
		return nil, err
	}
	return &Compiled{Spec: spec, Plan: p, Train: train, Eval: eval, Kernels: kernels}, nil
}

func planSummary(p *plan.Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "memory plan: peak %d bytes (%.2f MB), kernel workspace included", p.PeakBytes, float64(p.PeakBytes)/1e6)
	fmt.Fprintf(&b, "; strategy %s; in place: %s; recomputed: %s\n", p.Choices.Strategy, orNone(p.Choices.InPlace), orNone(p.Choices.Recompute))
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
