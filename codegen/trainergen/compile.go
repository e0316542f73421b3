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

// PlanLayout places values where the memory plan put them, and the
// kernels' scratch buffers (split-K partial sums, live only while their
// node runs) in one workspace region after the plan's arena, shared by
// every node.
type PlanLayout struct {
	Plan      *plan.Plan
	Workspace int64
	scratch   map[*ir.Value]int64
}

// NewPlanLayout lays out prog's scratch buffers after the plan's arena.
func NewPlanLayout(p *plan.Plan, prog *codegen.Program) *PlanLayout {
	l := &PlanLayout{Plan: p, scratch: map[*ir.Value]int64{}}
	isScratch := map[*ir.Value]bool{}
	for _, v := range prog.Scratch {
		isScratch[v] = true
	}
	base := (p.ArenaBytes + 255) / 256 * 256
	perNode := map[*ir.Node]int64{}
	for _, ln := range prog.Launches {
		for _, a := range ln.Args {
			if a.Kind != codegen.ArgBuffer || !isScratch[a.Value] {
				continue
			}
			if _, ok := l.scratch[a.Value]; ok {
				continue
			}
			l.scratch[a.Value] = base + perNode[ln.Node]
			perNode[ln.Node] += (a.Value.Type.Bytes(prog.Batch) + 255) / 256 * 256
			l.Workspace = max(l.Workspace, perNode[ln.Node])
		}
	}
	if l.Workspace > 0 {
		l.Workspace += base - p.ArenaBytes
	}
	return l
}

func (l *PlanLayout) Offset(v *ir.Value) (int64, bool) {
	if o, ok := l.scratch[v]; ok {
		return o, true
	}
	return l.Plan.Offset(v)
}

// Bytes is the plan's arena plus the kernels' workspace.
func (l *PlanLayout) Bytes() int64 { return l.Plan.ArenaBytes + l.Workspace }

// Compiled is a model ready to become a trainer.
type Compiled struct {
	Spec  *trainer.Spec
	Plan  *plan.Plan
	Train *codegen.Program
	Eval  *codegen.Program
	// Kernels is the CUDA C of training and evaluation in one file.
	Kernels []byte
	// Workspace is the kernels' scratch region after the plan's arena.
	Workspace int64
}

// Compile plans memory for res at its batch size (under budget, if any),
// generates the training and evaluation kernels and assembles the Spec.
func Compile(res *compiler.Result, budget int64, budgetSource string) (*Compiled, error) {
	batch := res.Train.Batch
	cfg := plan.Config{Batch: batch, Budget: budget, BudgetSource: budgetSource}
	if budgetSource == "" && budget > 0 {
		cfg.BudgetPos = res.Train.Pos["memory_budget"]
	}
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
	place := NewPlanLayout(p, train)
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
	spec.PlanSummary = planSummary(p, place)
	kernels, err := mergeSources(train, eval)
	if err != nil {
		return nil, err
	}
	return &Compiled{Spec: spec, Plan: p, Train: train, Eval: eval, Kernels: kernels, Workspace: place.Workspace}, nil
}

func planSummary(p *plan.Plan, l *PlanLayout) string {
	var b strings.Builder
	fmt.Fprintf(&b, "memory plan: peak %d bytes (%.2f MB)", p.PeakBytes, float64(p.PeakBytes)/1e6)
	if l.Workspace > 0 {
		fmt.Fprintf(&b, " + %d bytes of kernel workspace", l.Workspace)
	}
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
