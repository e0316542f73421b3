// Package ops is cnnc's op registry: one file per op holds everything the
// pipeline needs of it.
//
// In:  nothing — each op's file registers a Def at initialisation.
// Out: the table every stage reads: lowering (the DSL signature, argument
// kinds and bounds, the parameters and buffers a call owns with their
// initialisation and PyTorch names), the IR (type rule, FLOPs, printed
// attributes and properties: ir.OpInfo, which Register puts in the IR's ops
// table), autodiff and the fuse pass (the gradient rule), the float64
// reference (the op's kernel), codegen (the kernel binding: an elementwise
// template, or the family whose rule codegen holds), the ONNX exporter and
// the docs (the op table of docs/dsl.md is generated from here). The
// optimizers are a table the same way (optimizer.go).
//
// Why it is shaped so: adding an op used to mean editing a dozen files in
// five packages, with op-specific branches in the passes, the planner and
// codegen. Now what an op means sits in one place, the stages ask for
// properties (a view, in place, random, batch-coupled, ...) instead of
// testing for particular ops, and Missing (run by this package's tests over
// every op) names what an op lacks. docs/adding-an-op.md walks through one.
package ops

import (
	"fmt"
	"sort"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Def is everything cnnc knows of one op.
type Def struct {
	// OpInfo is what the IR keeps: name, printed attributes, type rule,
	// FLOPs and properties.
	ir.OpInfo
	// Op is the op's identity, set by Register.
	Op ir.Op
	// Doc says what the op computes, in a sentence.
	Doc string
	// DSL is how models write the op; nil for ops only the compiler makes
	// (gradients, updates, fused kernels).
	DSL *DSL

	// Grad emits the op's backward nodes (see GradRule). Ops that are not
	// differentiated say why in NoGrad instead.
	Grad   GradRule
	NoGrad string

	// Ref is the op's float64 reference kernel.
	Ref RefKernel

	// Kernel binds the op to its generated kernels; views run none.
	Kernel Kernel

	// ONNX maps the op onto ONNX operators for export (forward ops of the
	// DSL); NoONNX says why an op has no mapping.
	ONNX   *ONNX
	NoONNX string
}

var (
	defs   = map[ir.Op]*Def{}
	byName = map[string]*Def{}
	order  []*Def
)

// Register adds an op with a fixed identity (ir.OpConv2D, ...) to the
// registry and the IR's ops table.
func Register(op ir.Op, d *Def) ir.Op {
	d.Op = ir.Define(op, d.OpInfo)
	add(d)
	return d.Op
}

// New adds an op that gets its identity now, and returns it.
func New(d *Def) ir.Op {
	d.Op = ir.NewOp(d.OpInfo)
	add(d)
	return d.Op
}

func add(d *Def) {
	defs[d.Op] = d
	order = append(order, d)
	if d.DSL == nil {
		return
	}
	for _, name := range append([]string{d.DSL.Name}, d.DSL.Aliases...) {
		if _, dup := byName[name]; dup {
			panic(fmt.Sprintf("ops: two ops are written %s", name))
		}
		byName[name] = d
	}
}

// Of returns op's definition, or nil.
func Of(op ir.Op) *Def { return defs[op] }

// All lists every registered op in the order of the IR's table.
func All() []*Def {
	out := append([]*Def(nil), order...)
	sort.Slice(out, func(i, j int) bool { return out[i].Op < out[j].Op })
	return out
}

// DSLOps lists the ops models can write, in the order the docs show them.
func DSLOps() []*Def {
	var out []*Def
	for _, d := range All() {
		if d.DSL != nil {
			out = append(out, d)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].DSL.Order < out[j].DSL.Order })
	return out
}

// ByDSLName finds the op a model writes as name (or an alias).
func ByDSLName(name string) *Def { return byName[name] }

// DSLNames lists every spelling of every DSL op (names, then aliases).
func DSLNames() []string {
	var names []string
	for _, d := range DSLOps() {
		names = append(names, d.DSL.Name)
		names = append(names, d.DSL.Aliases...)
	}
	return names
}

// Missing names what d lacks: the pieces every op needs (name, doc, type
// rule, FLOPs, reference kernel, kernel binding or view), and for DSL
// ops their signature, documentation, gradient rule (or a reason for none)
// and ONNX mapping (or a reason for none). Pieces other packages hold
// (codegen's rules for custom kernels) are checked by their tests.
func Missing(d *Def) []string {
	var m []string
	need := func(ok bool, what string) {
		if !ok {
			m = append(m, what)
		}
	}
	need(d.Name != "", "a name")
	need(d.Doc != "", "a doc string (Def.Doc)")
	need(d.Infer != nil, "a type rule (Infer)")
	need(d.FLOPs != nil, "a FLOPs rule")
	need(d.Ref != nil, "a float64 reference kernel (Ref)")
	need(d.View || d.Kernel.Elementwise != "" || d.Kernel.Custom != "" || d.Kernel.ReplacedBy != "",
		"a kernel binding (Kernel.Elementwise, Kernel.Custom or Kernel.ReplacedBy), or View")
	if d.Grad != nil && d.NoGrad != "" {
		m = append(m, "either a gradient rule or NoGrad, not both")
	}
	for _, a := range d.Attrs {
		need(a.Name != "" && a.Text != nil, fmt.Sprintf("a printer for attribute %q", a.Name))
	}
	if s := d.DSL; s != nil {
		need(s.Name != "", "a DSL name")
		need(s.Shape != "", "the DSL shape rule for the docs (DSL.Shape)")
		need(s.Tensors > 0, "its tensor arguments (DSL.Tensors)")
		need(d.Grad != nil || d.NoGrad != "", "a gradient rule (Grad) or a reason for none (NoGrad)")
		need(d.ONNX != nil || d.NoONNX != "", "an ONNX mapping (ONNX) or a reason for none (NoONNX)")
		need(len(s.Examples) > 0, "example calls for the generic tests (DSL.Examples)")
		need(len(s.Torch) == 0 || len(s.Torch) == len(s.Examples), "one PyTorch expression per example (DSL.Torch)")
		for _, a := range s.Args {
			need(a.Doc != "", fmt.Sprintf("a doc string for argument %s", a.Name))
		}
		if (s.Params != nil || s.Buffers != nil) && d.ParamTypes == nil {
			m = append(m, "the types of its parameters (ParamTypes)")
		}
	}
	return m
}
