package compiler

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// Context is what a pass may read and report to besides the graph.
type Context struct {
	File  *dsl.File
	Train TrainConfig
	Data  DataConfig
	Diags dsl.Diagnostics
	// Evaluation: the infer pass keeps the loss (Options.Evaluation).
	Evaluation bool
}

// Pass is one row of the passes table.
type Pass struct {
	Name string
	Fn   func(*Context, *ir.Graph) error
	// Required passes always run; the others can be disabled (tests,
	// debugging, measuring what a pass buys).
	Required bool
	Doc      string
	// Mode says which compilations run the pass: both (0), training's
	// only, or inference's only (Options.Infer).
	Mode PassMode
}

// PassMode is which compilations run a pass.
type PassMode uint8

const (
	BothModes PassMode = iota
	TrainOnly
	InferOnly
)

func (m PassMode) String() string {
	return [...]string{"both", "training", "inference"}[m]
}

// runsIn says whether a pass of mode m runs in a compilation for inference
// (infer) or training.
func (m PassMode) runsIn(infer bool) bool {
	return m == BothModes || (m == InferOnly) == infer
}

// Passes run in this order; passOrder states (and init checks) what that
// order must respect. Memory planning (package compiler/plan) follows the
// whole table: it reads the fused graph and produces a Plan, not IR,
// leaving Result.Graph untouched — plan.Build(res.Graph, ...).
var Passes = []Pass{
	{Name: "shapes", Fn: shapesPass, Required: true, Doc: "infer every tensor's type, fill in parameter shapes, check each op's constraints"},
	{Name: "dce", Fn: dcePass, Doc: "warn about layers the loss does not depend on, and remove them"},
	{Name: "autodiff", Fn: autodiffPass, Required: true, Mode: TrainOnly, Doc: "add the backward graph (one gradient rule per op) and the optimizer update"},
	{Name: "infer", Fn: inferPass, Required: true, Mode: InferOnly, Doc: "make an inference graph: the logits are the output (no loss, labels or optimizer state), dropout is the identity"},
	{Name: "bnfold", Fn: bnfoldPass, Mode: InferOnly, Doc: "fold each batch norm after a conv into the conv's weight and bias (computed from a checkpoint when it is loaded)"},
	{Name: "fuse", Fn: fusePass, Doc: "fuse conv+bias+relu+maxpool, linear+bias+relu, softmax+cross-entropy, ReLU/pool gradients and optimizer updates into kernels (inference: forward blocks without argmax)"},
}

// passOrder lists the constraints on the order of Passes: each pair's first
// pass must run before its second (as Go's SSA backend checks its table).
var passOrder = []struct{ before, after, why string }{
	{"shapes", "dce", "dce reads types"},
	{"shapes", "autodiff", "gradients need every tensor's type and parameter shapes"},
	{"shapes", "fuse", "fusion rules match on types"},
	{"dce", "autodiff", "no gradient is derived for dead layers"},
	{"autodiff", "fuse", "fuse re-derives the backward over fused blocks and needs the optimizer state autodiff created"},
	{"dce", "infer", "dead layers are found from the loss, which infer removes"},
	{"infer", "bnfold", "a batch norm is folded only as evaluation computes it (on its running statistics)"},
	{"bnfold", "fuse", "fuse would make the conv a block before its batch norm is folded into it"},
	{"infer", "fuse", "fuse makes forward-only blocks (no argmax) for an inference graph"},
}

func init() {
	if err := checkPassOrder(Passes); err != nil {
		panic(err)
	}
}

// checkPassOrder reports every constraint of passOrder that passes break;
// a constraint naming a pass that is not in the table is an error too (a
// renamed pass must not silently drop its constraints).
func checkPassOrder(passes []Pass) error {
	index := map[string]int{}
	for i, p := range passes {
		index[p.Name] = i
	}
	var errs []error
	for _, c := range passOrder {
		b, okB := index[c.before]
		a, okA := index[c.after]
		switch {
		case !okB || !okA:
			errs = append(errs, fmt.Errorf("compiler: pass order constraint %s before %s names a pass not in the table", c.before, c.after))
		case b >= a:
			errs = append(errs, fmt.Errorf("compiler: pass %s must run before %s (%s)", c.before, c.after, c.why))
		}
	}
	return errors.Join(errs...)
}

// PassNames lists the passes in order.
func PassNames() []string {
	var names []string
	for _, p := range Passes {
		names = append(names, p.Name)
	}
	return names
}

// Options tune Compile.
type Options struct {
	// Disable lists optional passes to skip.
	Disable []string
	// StopAfter ends the pipeline after the named pass ("" runs them all).
	StopAfter string
	// AfterPass, when set, is called with each pass's name and the graph
	// after it ran (for --dump-after and for tests that verify every pass).
	AfterPass func(pass string, g *ir.Graph) error
	// Batch overrides the train block's batch size when > 0, and
	// BatchSource names where it comes from in errors (e.g. "--batch").
	Batch       int64
	BatchSource string
	// Infer compiles for inference (cnnc build --infer): the passes of
	// mode InferOnly instead of TrainOnly; Result.Graph is then an
	// inference graph (ir.Graph.Infer).
	Infer bool
	// Evaluation compiles a trainer's evaluation step: the inference
	// passes (batch norm folded, dropout gone, forward blocks without
	// argmax) keeping the loss and labels; Result.Graph is then an
	// evaluation graph (ir.Graph.Eval).
	Evaluation bool
	// NoClip compiles the model as if its train block had no
	// clip_grad_norm (cnnc plan compares the peak with and without).
	NoClip bool
}

// Result is a compiled model.
type Result struct {
	File     *dsl.File
	Graph    *ir.Graph
	Train    TrainConfig
	Data     DataConfig
	Warnings dsl.Diagnostics
	// Summary describes the model layer by layer, as written (taken before
	// fusion), at the train block's batch size.
	Summary *Summary
	// BatchLimit is the largest batch the model's step allows (the size
	// limits of limits.go, at most MaxBatch).
	BatchLimit int64
}

// CompileSource parses src (named filename in diagnostics) and compiles it.
func CompileSource(filename string, src []byte, opts Options) (*Result, error) {
	f, err := dsl.Parse(filename, src)
	if err != nil {
		return nil, err
	}
	return Compile(f, opts)
}

// Compile parses nothing: it lowers f and runs the passes. Errors are
// dsl.Diagnostics (sorted by position); warnings come back in Result even
// on success.
func Compile(f *dsl.File, opts Options) (*Result, error) {
	opts.Infer = opts.Infer || opts.Evaluation // the inference passes
	if err := checkPassNames(opts); err != nil {
		return nil, err
	}
	g, diags := Lower(f)
	train, d := ParseTrain(f.Section("train"))
	diags = append(diags, d...)
	if opts.Batch > 0 {
		train.Batch = opts.Batch
	}
	var image, label ir.Type
	for _, in := range g.Inputs {
		switch in.Role {
		case ir.RoleInput:
			image = in.Type
		case ir.RoleLabel:
			label = in.Type
		}
	}
	data, d := ParseData(f.Section("data"), image, label)
	diags = append(diags, d...)
	for _, s := range f.Sections {
		if first := f.Section(s.Kind); first != s {
			diags = append(diags, dsl.Errorf(s.Pos, "second %s block (the first is at line %d)", s.Kind, first.Pos.Line).Span(len(s.Kind)))
		}
	}
	if diags.HasErrors() {
		diags.Sort()
		return nil, diags
	}
	batchSource := ""
	if opts.Batch > 0 {
		batchSource = cmp.Or(opts.BatchSource, "the compiler's options")
	}
	if d := checkAccumulate(g, train, batchSource); d != nil && !opts.Infer {
		diags = append(diags, d)
		return nil, diags
	}
	g.Opt = &train.Optimizer
	if opts.NoClip {
		train.ClipGradNorm = 0
	}
	g.ClipGradNorm = train.ClipGradNorm
	ctx := &Context{File: f, Train: train, Data: data, Diags: diags, Evaluation: opts.Evaluation}
	res := &Result{File: f, Graph: g, Train: train, Data: data}
	user := opts.AfterPass
	opts.AfterPass = func(pass string, g *ir.Graph) error {
		if pass == "autodiff" || (opts.Infer && pass == "infer") {
			// every tensor and FLOP of the step exists now: check the
			// batch against them before anything multiplies by it
			if d := checkBatch(g, train.Batch, train, opts.BatchSource, f.Model.Pos); d != nil {
				return dsl.Diagnostics{d}
			}
			if d := checkBatchStatistics(g, train.Batch, train, opts.BatchSource); d != nil && !opts.Infer {
				return dsl.Diagnostics{d}
			}
			res.Summary = Summarize(g, train.Batch)
			res.Summary.Inference = opts.Infer
			res.BatchLimit = BatchLimit(g)
		}
		if user != nil {
			return user(pass, g)
		}
		return nil
	}
	if err := RunPasses(ctx, g, opts); err != nil {
		return nil, err
	}
	ctx.Diags.Sort()
	res.Warnings = ctx.Diags
	return res, nil
}

// RunPasses runs the passes table over g.
func RunPasses(ctx *Context, g *ir.Graph, opts Options) error {
	disabled := map[string]bool{}
	for _, n := range opts.Disable {
		disabled[n] = true
	}
	for _, p := range Passes {
		if (disabled[p.Name] && !p.Required) || !p.Mode.runsIn(opts.Infer) {
			continue
		}
		if err := p.Fn(ctx, g); err != nil {
			return err
		}
		if ctx.Diags.HasErrors() {
			ctx.Diags.Sort()
			return ctx.Diags.Errors()
		}
		// the graphs are small (the verifier is linear in them): a pass that
		// breaks an invariant is caught here, named, not by a later pass
		if err := g.Verify(); err != nil {
			return fmt.Errorf("internal error: the IR after pass %s is invalid (please report it with the model): %w", p.Name, err)
		}
		if opts.AfterPass != nil {
			if err := opts.AfterPass(p.Name, g); err != nil {
				return err
			}
		}
		if p.Name == opts.StopAfter {
			break
		}
	}
	return nil
}

func checkPassNames(opts Options) error {
	known := map[string]*Pass{}
	for i := range Passes {
		known[Passes[i].Name] = &Passes[i]
	}
	check := func(n string) error {
		if known[n] == nil {
			return fmt.Errorf("unknown pass %q (passes: %s)", n, strings.Join(PassNames(), ", "))
		}
		return nil
	}
	for _, n := range opts.Disable {
		if err := check(n); err != nil {
			return err
		}
		if known[n].Required {
			return fmt.Errorf("pass %q is required and cannot be disabled", n)
		}
	}
	if opts.StopAfter != "" {
		if err := check(opts.StopAfter); err != nil {
			return err
		}
		if p := known[opts.StopAfter]; !p.Mode.runsIn(opts.Infer) {
			return fmt.Errorf("pass %q runs only in %s compilations", opts.StopAfter, p.Mode)
		}
	}
	return nil
}
