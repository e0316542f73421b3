// Package codegen turns a fused training graph into CUDA C kernels and the
// list of launches that runs one training step.
//
// In:  the compiler's fused *ir.Graph and a batch size.
// Out: a Program — one .cu source (every kernel extern "C", shapes compiled
// in), the kernels by name, and the launches in schedule order, each with
// grid, block, dynamic shared bytes, arguments (IR values standing for
// device buffers, or the block of run-time scalars: learning rate, step,
// seed, valid count), and the FLOPs and minimum bytes it must move (for
// profiling and roofline checks).
//
// Why it is shaped so: kernels come from text templates (templates/), one
// per family. Each op's binding is in its file in compiler/ops: an
// elementwise template, which runs with no rule here (so adding an
// elementwise op is its op file and its template), or a family whose rule
// a file of this package registers (kernelRules). Buffers are named by IR value, not
// address: the memory plan decides where each lives, and the same Program
// drives the CPU emulator and the GPU through device.Device.
package codegen

import (
	"bytes"
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"sort"
	"strings"
	"text/template"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/internal/gentext"
	"github.com/cnnc/cnnc/templates"
)

// Arg is one kernel argument.
type Arg struct {
	Kind  kernelarg.Kind
	Value *ir.Value // for kernelarg.Buffer
	// Offset is added to the buffer's address, in bytes: a micro-batch's
	// slice of a whole-batch buffer.
	Offset int64
	Int    int64
	Float  float32
}

func (a Arg) String() string {
	switch a.Kind {
	case kernelarg.Buffer:
		return a.Value.String()
	case kernelarg.Int:
		return fmt.Sprint(a.Int)
	case kernelarg.Float:
		return fmt.Sprint(a.Float)
	}
	return "scalars"
}

// Kernel is one generated kernel.
type Kernel struct {
	Name   string
	Family string // the template it came from
	Text   string
	Params []Param // its signature
}

// Launch is one kernel launch of the step.
type Launch struct {
	Node        *ir.Node
	Kernel      string
	Grid, Block [3]uint32
	SharedBytes int
	Args        []Arg
	FLOPs       int64 // floating-point operations of this launch
	MinBytes    int64 // bytes it must read and write at least (each input and output once)
	// Seq is the index, in the node list given to GenerateNodes, of the
	// node this launch belongs to.
	Seq int
	// Step is the memory plan's step index (GenerateFromPlan), or 0, and
	// Iter the micro-batch loop iteration it runs in (0 outside loops).
	Step, Iter int
}

// Program is the generated code of one training step.
type Program struct {
	Model    string
	Batch    int64
	Source   []byte
	Kernels  []*Kernel
	Launches []*Launch
	// Views are values that share another value's buffer (flatten,
	// reshape): no kernel runs for them.
	Views map[*ir.Value]*ir.Value
	// Scratch lists temporary buffers that one node's launches pass
	// between them (split-K partial sums). They are not values of the
	// graph: each is live only while its node runs, is allocated like a
	// value (Type.Bytes(Batch)), and needs no initial contents.
	Scratch []*ir.Value
	// BNTiles: the tiling of the batch norm partials a conv block writes
	// (its output value) where it is not flat (ops.BNTiling), for the
	// reference (reference.NodeOptions.BNTiles).
	BNTiles map[*ir.Value]ops.BNTiling
}

// NoRuleError is Generate's error for an op that has no kernel rule, or
// whose rule on a target other than CUDA cannot generate the node's form
// (Reason says which).
type NoRuleError struct {
	Op   ir.Op
	Node string // the node's text
	// Target names the target (Target.Name) when it is not CUDA.
	Target string
	// Reason is what the target lacks for this node, when it has a rule
	// for the op ("groups=2").
	Reason string
}

func (e *NoRuleError) Error() string {
	if e.Target == "" {
		return fmt.Sprintf("codegen: no kernel for %s (%s)", e.Op, e.Node)
	}
	if e.Reason != "" {
		return fmt.Sprintf("codegen: the %s target cannot generate %s with %s (%s)", e.Target, e.Op, e.Reason, e.Node)
	}
	return fmt.Sprintf("codegen: the %s target has no kernel for %s (%s)", e.Target, e.Op, e.Node)
}

// Options tune Generate.
type Options struct {
	Batch int64
	// SourceName is the model file named in the generated header.
	SourceName string
	// Eval generates evaluation: dropout keeps every element, so its
	// output is a view of its input and runs no kernel.
	Eval bool
	// Accumulate lists the nodes whose kernels add their unbatched outputs
	// (weight gradients, the loss, the correct count) to what the buffers
	// hold, for GenerateNodes (kernel tests); GenerateFromPlan takes it
	// from the plan's steps (plan.Step.Accumulate).
	Accumulate map[*ir.Node]bool
	// Precision of the GEMM-shaped kernels' multiplications (linear and
	// conv blocks): FP32 (the default: FFMA) or, on tensor cores, TF32 or
	// BF16 — inputs rounded to it, products and sums in fp32. Targets
	// other than CUDA have no tensor cores and compute in fp32 at every
	// precision (as PyTorch's CPU kernels ignore allow_tf32).
	Precision Precision
	// Target generates the kernels for a device other than CUDA (see
	// Target); nil: CUDA.
	Target Target
	// SMs is the streaming-multiprocessor count of the GPU the launch
	// geometry is sized for: the reductions split until their grids fill
	// it (fillBlocks). 0 — no GPU named — keeps the memory-first geometry
	// (fixed split targets: wgradLegacyBlocks, gemmLegacyBlocks), whose
	// smaller split partials keep the planned peak (the memory figures
	// README and BENCHMARKS.md quote) where it was. The kernels are correct
	// on a GPU of any SM count; only how well a grid fills it depends on
	// this.
	SMs int64
	// Arch is the named GPU's SASS architecture (sm_80, sm_90; "" when none
	// is named), for kernel variants that the performance model predicts
	// faster on some GPUs only (convData.haloTile).
	Arch string
}

// fillWarpsPerSM is the resident warps per SM the grids of kernels that
// can split their work (the weight gradients' and split-K GEMMs'
// reductions) aim for: four per scheduler, what compiler/perf takes to
// hide issue and shared-memory latency.
const fillWarpsPerSM = 16

// fillBlocks is how many blocks of threads threads put fillWarpsPerSM
// warps on each of sms SMs.
func fillBlocks(sms, threads int64) int64 {
	return sms * divUp(fillWarpsPerSM*32, threads)
}

// smsOr is sms, or 0 (no GPU named) when it is not positive.
func smsOr(sms int64) int64 { return max(sms, 0) }

// Precision is how GEMM-shaped kernels multiply.
type Precision string

const (
	FP32 Precision = "fp32" // CUDA cores, FFMA (also the zero value "")
	TF32 Precision = "tf32" // tensor cores, inputs rounded to TF32 (cvt.rna), fp32 accumulation
	BF16 Precision = "bf16" // tensor cores, inputs rounded to bfloat16 (nearest even), fp32 accumulation
)

// ParsePrecision reads a precision's name ("" is FP32).
func ParsePrecision(s string) (Precision, error) {
	switch p := Precision(s); p {
	case "", FP32:
		return FP32, nil
	case TF32, BF16:
		return p, nil
	}
	return "", fmt.Errorf("precision %q: want fp32, tf32 or bf16", s)
}

// tensor reports whether the precision runs on tensor cores.
func (p Precision) tensor() bool { return p == TF32 || p == BF16 }

// rule generates the kernels and launches of one node.
type rule func(e *emitter, n *ir.Node) error

// kernelRules: the rules of ops bound to a custom family (ops.Kernel.Custom).
// Views (flatten, reshape) launch nothing; ops bound to an elementwise
// template use elementwiseRule.
var kernelRules = map[ir.Op]rule{}

// ruleOf is the rule that generates op's kernels, if any.
func ruleOf(op ir.Op) (rule, bool) {
	if r, ok := kernelRules[op]; ok {
		return r, true
	}
	if d := ops.Of(op); d != nil && d.Kernel.Elementwise != "" {
		return elementwiseRule(d.Kernel), true
	}
	return nil, false
}

// CheckBinding says what is missing for op's kernel binding to generate:
// the rule of a custom family, or the template an elementwise binding
// names (the registry's tests run it for every op).
func CheckBinding(op ir.Op) error {
	d := ops.Of(op)
	switch {
	case d == nil:
		return fmt.Errorf("%s is not registered", op)
	case d.View || d.Kernel.ReplacedBy != "":
		return nil
	case d.Kernel.Elementwise != "":
		if tmpl.Lookup(d.Kernel.Elementwise) == nil {
			return fmt.Errorf("%s: no template %q in templates/", op, d.Kernel.Elementwise)
		}
		if _, custom := kernelRules[op]; custom {
			return fmt.Errorf("%s: bound to an elementwise template and to a rule of codegen", op)
		}
		return nil
	case d.Kernel.Custom != "":
		if _, ok := kernelRules[op]; !ok {
			return fmt.Errorf("%s: bound to family %q but codegen registers no rule for it", op, d.Kernel.Custom)
		}
		return nil
	}
	return fmt.Errorf("%s has no kernel binding", op)
}

// register adds rules; each family's file registers its ops in init.
func register(op ir.Op, r rule) {
	if _, dup := kernelRules[op]; dup {
		panic(fmt.Sprintf("codegen: two rules for %s", op))
	}
	kernelRules[op] = r
}

var tmpl = template.Must(template.New("cu").Funcs(template.FuncMap{
	"join":      strings.Join,
	"fragRound": fragRound,
	// unknownOptimizer fails a template that reached an optimizer the
	// table has no kernel blocks for (never another optimizer's).
	"unknownOptimizer": func(kind string) (string, error) {
		return "", fmt.Errorf("no kernel template for optimizer %s", kind)
	},
}).ParseFS(templates.FS, "*.cu.tmpl"))

// emitter collects kernels and launches.
type emitter struct {
	prog    *Program
	batch   int64
	eval    bool // evaluation's kernels (Options.Eval)
	kernels map[string]*Kernel
	prec    Precision
	sms     int64  // the target's SM count (Options.SMs; 0: none named)
	arch    string // its architecture (Options.Arch; "": none named)
	// accumulate: the node being generated adds its unbatched outputs to
	// the buffers (genItem.accumulate)
	accumulate bool
	// bnParts: the batch norm partials a conv block has written at the
	// whole batch (ir.Attrs.BNStats; not in a micro-batch loop): their
	// cells a channel and tiling
	bnParts map[*ir.Value]bnPart
}

// bnPart is a conv block's batch norm partials as the merge reads them.
type bnPart struct {
	cells  int64
	tiling ops.BNTiling
}

// kernel renders template family with data (which must have a Name field
// equal to name) unless a kernel of that name exists: equal names mean
// equal specialisations, so each is emitted once.
func (e *emitter) kernel(family, name string, data any) error {
	if _, ok := e.kernels[name]; ok {
		return nil
	}
	var b bytes.Buffer
	if err := tmpl.ExecuteTemplate(&b, family, data); err != nil {
		return fmt.Errorf("codegen: template %s for %s: %v", family, name, err)
	}
	k := &Kernel{Name: name, Family: family, Text: strings.TrimLeft(b.String(), "\n")}
	params, err := parseParams(k.Text, name)
	if err != nil {
		return err
	}
	k.Params = params
	e.kernels[name] = k
	e.prog.Kernels = append(e.prog.Kernels, k)
	return nil
}

func (e *emitter) launch(l *Launch) { e.prog.Launches = append(e.prog.Launches, l) }

// scratch makes a temporary buffer for node n's launches (see
// Program.Scratch), named after the node.
func (e *emitter) scratch(n *ir.Node, suffix string, t ir.Type) *ir.Value {
	v := &ir.Value{ID: -1, Name: n.Name + "." + suffix, Type: t}
	e.prog.Scratch = append(e.prog.Scratch, v)
	return v
}

// Generate produces the Program of a fused graph.
func Generate(g *ir.Graph, opts Options) (*Program, error) {
	return GenerateNodes(g.Name, g.Nodes, opts)
}

// GenerateNodes produces the Program of some nodes of a graph (kernel
// tests generate one node at a time).
func GenerateNodes(model string, nodes []*ir.Node, opts Options) (*Program, error) {
	items := make([]genItem, len(nodes))
	for i, n := range nodes {
		items[i] = genItem{node: n, batch: opts.Batch, accumulate: opts.Accumulate[n]}
	}
	return generate(model, items, opts)
}

// genItem is a node to generate and the samples its kernels process (a
// micro-batch inside a loop, else the batch); zero lists accumulators to
// clear before it; accumulate says its kernels add their unbatched
// outputs to the buffers (a step of a micro-batch loop).
type genItem struct {
	node       *ir.Node
	batch      int64
	zero       []*ir.Value
	accumulate bool
}

func generate(model string, items []genItem, opts Options) (*Program, error) {
	if opts.Batch < 1 {
		return nil, fmt.Errorf("codegen: batch must be positive, got %d", opts.Batch)
	}
	prec, err := ParsePrecision(string(opts.Precision))
	if err != nil {
		return nil, fmt.Errorf("codegen: %v", err)
	}
	p := &Program{Model: model, Batch: opts.Batch, Views: map[*ir.Value]*ir.Value{}}
	e := &emitter{prog: p, batch: opts.Batch, eval: opts.Eval, kernels: map[string]*Kernel{}, prec: prec, sms: smsOr(opts.SMs), arch: opts.Arch}
	for seq, it := range items {
		n := it.node
		e.batch, e.accumulate = it.batch, it.accumulate
		first := len(p.Launches)
		for _, z := range it.zero {
			zero := e.zeroFill
			if opts.Target != nil {
				zero = func(n *ir.Node, v *ir.Value) error { return opts.Target.ZeroFill(e, n, v) }
			}
			if err := zero(n, z); err != nil {
				return nil, err
			}
		}
		if info := n.Op.Info(); info.View || (opts.Eval && info.EvalIdentity) {
			src := n.Ins[0]
			if s, ok := p.Views[src]; ok {
				src = s
			}
			p.Views[n.Out()] = src
			continue
		}
		if err := e.nodeKernels(opts, n); err != nil {
			return nil, err
		}
		for _, l := range p.Launches[first:] {
			l.Seq = seq
		}
	}
	var src bytes.Buffer
	name := opts.SourceName
	if name == "" {
		name = model
	}
	if opts.Target != nil {
		src.WriteString(opts.Target.Prelude(gentext.Comment(name), gentext.Comment(model), opts.Batch))
	} else {
		if err := checkRestrict(p); err != nil {
			return nil, err
		}
		if err := tmpl.ExecuteTemplate(&src, "prelude", map[string]any{"Source": gentext.Comment(name), "Model": gentext.Comment(model), "Batch": opts.Batch,
			"Tensor": prec.tensor()}); err != nil {
			return nil, err
		}
	}
	for _, k := range p.Kernels {
		src.WriteString("\n")
		src.WriteString(k.Text)
	}
	p.Source = src.Bytes()
	return p, nil
}

// Workspace is the scratch memory node n's kernels need over samples
// samples, at FP32: its scratch buffers, each 256-byte aligned, one after
// another. The memory planner places it (plan.Config.Workspace, which
// package driver sets). It renders nothing: each kernel family that needs
// scratch registers the pure function of the node's shapes that its rule
// sizes its scratch buffers by (registerScratch).
func Workspace(n *ir.Node, samples int64) int64 {
	return scratchBytes(n, samples, sizing{FP32, 0})
}

// WorkspaceOn is Workspace for kernels generated at precision prec for a
// GPU of sms SMs (Options.Precision and SMs: the reductions' splits
// follow the tiles and the SM count).
func WorkspaceOn(prec Precision, sms int64) func(n *ir.Node, samples int64) int64 {
	return func(n *ir.Node, samples int64) int64 {
		return scratchBytes(n, samples, sizing{prec, smsOr(sms)})
	}
}

// sizing is what a kernel rule's scratch depends on besides the node and
// the samples: the precision (the tensor-core kernels tile differently,
// and so split their reductions differently) and the SM count.
type sizing struct {
	prec Precision
	sms  int64
}

// sizing is the emitter's.
func (e *emitter) sizing() sizing { return sizing{e.prec, e.sms} }

// scratchBytes is Workspace at a sizing.
func scratchBytes(n *ir.Node, samples int64, sz sizing) int64 {
	f, ok := scratchRules[n.Op]
	if !ok {
		return 0
	}
	b, err := f(n, samples, sz)
	if err != nil {
		return 0 // generation fails for this node, and says why
	}
	return b
}

// scratchRule gives the bytes of the scratch buffers the op's kernel rule
// makes for node n over samples samples at sizing sz.
type scratchRule func(n *ir.Node, samples int64, sz sizing) (int64, error)

var scratchRules = map[ir.Op]scratchRule{}

// registerScratch adds the scratch sizing of op's kernel rule.
func registerScratch(op ir.Op, f scratchRule) {
	if _, dup := scratchRules[op]; dup {
		panic(fmt.Sprintf("codegen: two scratch rules for %s", op))
	}
	scratchRules[op] = f
}

// ScratchAligned is the size of a scratch buffer of bytes bytes in a
// workspace: each starts 256-byte aligned (Program.ScratchBytes).
func ScratchAligned(bytes int64) int64 { return (bytes + 255) / 256 * 256 }

// ScratchBytes is the size of the given scratch buffers laid out one after
// another at 256-byte alignment.
func (p *Program) ScratchBytes(vs []*ir.Value) int64 {
	var total int64
	for _, v := range vs {
		total += ScratchAligned(v.Type.Bytes(p.Batch))
	}
	return total
}

// KernelNames lists the program's kernels, sorted.
func (p *Program) KernelNames() []string {
	var names []string
	for _, k := range p.Kernels {
		names = append(names, k.Name)
	}
	sort.Strings(names)
	return names
}

// Buffer returns the value whose buffer v uses (v itself unless a view).
func (p *Program) Buffer(v *ir.Value) *ir.Value {
	if s, ok := p.Views[v]; ok {
		return s
	}
	return v
}

// minBytes is the traffic of reading every input and writing every output
// once, at the batch size.
func minBytes(n *ir.Node, batch int64) int64 {
	var b int64
	for _, v := range n.Ins {
		b += v.Type.Bytes(batch)
	}
	for _, v := range n.Outs {
		b += v.Type.Bytes(batch)
	}
	return b
}

// shapeName is a compact name part for per-sample dims: 16x63x63.
func shapeName(dims []int64) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		parts[i] = fmt.Sprint(d)
	}
	return strings.Join(parts, "x")
}

// gridFor sizes a 1-D grid-stride launch over n elements.
func gridFor(n int64, block uint32) [3]uint32 {
	blocks := (n + int64(block) - 1) / int64(block)
	if blocks > 65535*8 {
		blocks = 65535 * 8
	}
	if blocks < 1 {
		blocks = 1
	}
	return [3]uint32{uint32(blocks), 1, 1}
}

func buf(v *ir.Value) Arg { return Arg{Kind: kernelarg.Buffer, Value: v} }

// scalarsParam is the kernel parameter that points to the step's scalar
// block, and scalarsArg its argument.
const scalarsParam = "const CnncStepScalars* __restrict__ scalars"

var scalarsArg = Arg{Kind: kernelarg.Scalars}
