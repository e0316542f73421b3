// Package ir is cnnc's training IR: a typed DAG of tensor operations with one
// deterministic text form and one verifier.
//
// In:  nodes built by the compiler's lowering from the DSL AST.
// Out: the graph every later stage reads — passes rewrite it, the reference
// interpreter runs it in float64, codegen turns it into kernels.
//
// Why it is shaped so: tensors carry a per-sample shape plus a "batched" flag
// instead of a fixed batch size, so one graph serves any batch and any
// micro-batch; every node keeps the DSL position it came from, so an error
// or a memory report found many passes later still points at the user's
// line; what each op means (its type rule, FLOPs and printed attributes) is
// one row of the ops table in ops.go, not a switch spread across files.
package ir

import (
	"fmt"
	"github.com/cnnc/cnnc/compiler/augment"
	"strings"

	"github.com/cnnc/cnnc/dsl"
)

// DType is an element type.
type DType uint8

const (
	Unknown DType = iota
	F32           // 32-bit float
	Class         // class label, int32 in [0, Classes)
	U8            // raw image bytes
	Argmax        // a max-pool window's argmax index, Type.Bits bits each, packed in 32-bit words
	I64           // a 64-bit integer (batch norm's num_batches_tracked)
)

func (d DType) String() string {
	return [...]string{"?", "f32", "class", "u8", "argmax", "i64"}[d]
}

// ElemBytes is the size of one element in memory.
func (d DType) ElemBytes() int64 {
	switch d {
	case F32, Class:
		return 4
	case U8:
		return 1
	case I64:
		return 8
	}
	return 0
}

// Type is a tensor type. Batched tensors have a leading batch dimension B
// that is not stored in Dims; parameters and the loss are not batched.
type Type struct {
	DType   DType
	Batched bool
	Dims    []int64
	Classes int64 // for DType Class: the number of classes
	Bits    int64 // for DType Argmax: bits per element (1, 2, 4, 8 or 16)
}

// ArgmaxType is the packed argmax of a pooling window of k elements over
// an output of the given per-sample dims.
func ArgmaxType(windowElems int64, dims ...int64) Type {
	b := int64(1)
	for int64(1)<<b < windowElems {
		b++
	}
	// round up to a power of two so no element straddles a 32-bit word
	p := int64(1)
	for p < b {
		p *= 2
	}
	return Type{DType: Argmax, Batched: true, Dims: dims, Bits: p}
}

// F32Batched is f32[B, dims...].
func F32Batched(dims ...int64) Type { return Type{DType: F32, Batched: true, Dims: dims} }

// F32Fixed is f32[dims...] with no batch dimension.
func F32Fixed(dims ...int64) Type { return Type{DType: F32, Dims: dims} }

// IsKnown reports whether the type has been inferred.
func (t Type) IsKnown() bool { return t.DType != Unknown }

// Rank counts dimensions including the batch dimension.
func (t Type) Rank() int {
	if t.Batched {
		return len(t.Dims) + 1
	}
	return len(t.Dims)
}

// SampleElems is the element count of one sample (of the whole tensor when
// not batched).
func (t Type) SampleElems() int64 {
	n := int64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Elems is the element count at the given batch size.
func (t Type) Elems(batch int64) int64 {
	if t.Batched {
		return batch * t.SampleElems()
	}
	return t.SampleElems()
}

// Bytes is the storage size at the given batch size. Packed argmax
// tensors occupy whole 32-bit words.
func (t Type) Bytes(batch int64) int64 {
	if t.DType == Argmax {
		perWord := 32 / t.Bits
		return (t.Elems(batch) + perWord - 1) / perWord * 4
	}
	return t.Elems(batch) * t.DType.ElemBytes()
}

// Equal compares two types.
func (t Type) Equal(u Type) bool {
	if t.DType != u.DType || t.Batched != u.Batched || t.Classes != u.Classes || t.Bits != u.Bits || len(t.Dims) != len(u.Dims) {
		return false
	}
	for i := range t.Dims {
		if t.Dims[i] != u.Dims[i] {
			return false
		}
	}
	return true
}

// ShapeString prints the dimensions like "[B,16,126,126]".
func (t Type) ShapeString() string {
	var parts []string
	if t.Batched {
		parts = append(parts, "B")
	}
	for _, d := range t.Dims {
		parts = append(parts, fmt.Sprint(d))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// ShapeStringAt is the shape at a batch size: [32,16,126,126].
func (t Type) ShapeStringAt(batch int64) string {
	parts := make([]string, 0, len(t.Dims)+1)
	if t.Batched {
		parts = append(parts, fmt.Sprint(batch))
	}
	for _, d := range t.Dims {
		parts = append(parts, fmt.Sprint(d))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// DimsString prints per-sample dims as "32x124x124".
func (t Type) DimsString() string {
	parts := make([]string, len(t.Dims))
	for i, d := range t.Dims {
		parts[i] = fmt.Sprint(d)
	}
	return strings.Join(parts, "x")
}

func (t Type) String() string {
	if !t.IsKnown() {
		return "?"
	}
	if t.DType == Class {
		return fmt.Sprintf("class%d%s", t.Classes, t.ShapeString())
	}
	if t.DType == Argmax {
		return fmt.Sprintf("argmax%d%s", t.Bits, t.ShapeString())
	}
	return t.DType.String() + t.ShapeString()
}

// Role says what a value is; the planner and the reports group by it.
type Role uint8

const (
	RoleActivation Role = iota // forward result
	RoleInput                  // model input (images)
	RoleLabel                  // model input (class labels)
	RoleParam                  // trainable parameter
	RoleOptState               // optimizer state (momentum, Adam moments)
	RoleGrad                   // gradient of a parameter
	RoleActGrad                // gradient of an activation
	RoleLoss                   // the scalar loss
	// RoleBuffer is persistent state that is not trained (batch norm's
	// running statistics): saved in checkpoints under its state_dict name
	// like a parameter, but with no gradient and no optimizer state; the
	// node that owns it writes it in place (OpInfo.Mutates).
	RoleBuffer
)

func (r Role) String() string {
	return [...]string{"activation", "input", "label", "param", "state", "grad", "actgrad", "loss", "buffer"}[r]
}

// Value is an SSA tensor: defined once (by a node, or as a graph input,
// parameter or optimizer state) and read any number of times.
type Value struct {
	ID    int
	Name  string
	Type  Type
	Role  Role
	Def   *Node // nil for inputs, parameters and state
	Pos   dsl.Pos
	Param *Param // the parameter (or buffer) a param, grad, state or buffer value belongs to
}

func (v *Value) String() string { return "%" + v.Name }

// InitKind is a parameter initialisation rule.
type InitKind uint8

const (
	// InitKaimingUniform is PyTorch's default for conv and linear weights:
	// kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
	InitKaimingUniform InitKind = iota
	// InitUniformFanIn is PyTorch's default for biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
	InitUniformFanIn
	// InitZeros and InitOnes are constant initialisations (batch norm's
	// bias and running mean; its weight and running variance).
	InitZeros
	InitOnes
)

// Init says how a parameter is initialised.
type Init struct {
	Kind  InitKind
	FanIn int64
}

func (i Init) String() string {
	switch i.Kind {
	case InitKaimingUniform:
		return fmt.Sprintf("kaiming_uniform(a=sqrt5,fan_in=%d)", i.FanIn)
	case InitZeros:
		return "zeros"
	case InitOnes:
		return "ones"
	default:
		return fmt.Sprintf("uniform(fan_in=%d)", i.FanIn)
	}
}

// Param is a trainable parameter with its PyTorch state_dict name, or
// (Graph.Buffers, value role RoleBuffer) a buffer: persistent state that is
// not trained.
type Param struct {
	Name  string // "conv1.weight"
	Layer string // "conv1"
	Value *Value
	Init  Init
	// State holds the optimizer state tensors once autodiff added them.
	State []*Value
	// Fold, in an inference graph, says that the parameter is not in
	// checkpoints but computed from them when one is loaded: a conv's
	// weight or bias with the batch norm after it folded in (the bnfold
	// pass).
	Fold *Fold
}

// Fold is how the bnfold pass's parameter is computed from a checkpoint's
// tensors (state_dict names), per output channel o, in float64 and
// rounded once to float32 (runtime/bnfold):
//
//	s[o] = gamma[o] / sqrt(var[o] + eps)       (gamma = 1 without affine)
//	weight: w'[o,...] = w[o,...]·s[o]
//	bias:   b'[o] = (b[o] - mean[o])·s[o] + beta[o]   (b = 0 when the conv has no bias, beta = 0 without affine)
type Fold struct {
	Bias             bool   // the folded bias (else the weight)
	Weight, ConvBias string // the conv's weight and bias ("" when it has none)
	Gamma, Beta      string // the batch norm's weight and bias ("" without affine)
	Mean, Var        string // its running statistics
	Eps              float64
}

func (f *Fold) String() string {
	src := f.Weight
	if f.Bias {
		src = f.ConvBias
		if src == "" {
			src = "0"
		}
	}
	aff := "affine"
	if f.Gamma == "" {
		aff = "no affine"
	}
	return fmt.Sprintf("bnfold(%s, %s, %s, eps=%g, %s)", src, f.Mean, f.Var, f.Eps, aff)
}

// Phase is the part of the training step a node belongs to.
type Phase uint8

const (
	Forward Phase = iota
	Backward
	Update
)

func (p Phase) String() string { return [...]string{"forward", "backward", "update"}[p] }

// Attrs holds the attributes of all ops; the ops table says which ones
// each op uses (and prints).
type Attrs struct {
	Kernel [2]int64 // conv, pools
	Stride [2]int64
	Pad    [2]int64
	Out    int64   // conv/linear output channels or features
	In     int64   // linear: the input features the user declared (0: inferred)
	P      float64 // dropout probability
	Stream int64   // dropout: which counter-based RNG stream
	Dims   []int64 // per-sample target dims (reshape, gradient ops)
	// Dilation and Groups of a convolution; 0 means 1 (Dil, GroupCount).
	Dilation [2]int64
	Groups   int64
	// Alpha is an activation's parameter (leaky_relu's negative slope).
	Alpha float64
	// Eps and Momentum are batch norm's.
	Eps, Momentum float64
	// MaxNorm is clip_grad_norm's max_norm: the largest global L2 norm the
	// gradients keep.
	MaxNorm float64
	// Offset is a channel offset (the slice of a concat's gradient).
	Offset int64
	// Opt is the optimizer of an update: sgd_update/adam_update, or a
	// weight-gradient kernel with the update fused into its epilogue.
	Opt *Optimizer

	// Fused blocks (see fused.go).
	Bias bool // the block has a bias parameter
	ReLU bool // a ReLU epilogue
	// Act is a pointwise activation other than ReLU folded into a batch
	// norm (compiler/ops.PointwiseOf; Alpha its parameter); 0 — OpConv2D,
	// never an activation — for none.
	Act        Op
	Pool       *Window // a max-pool epilogue
	DOutMasked bool    // the incoming gradient already has the ReLU mask applied
	MaskOut    bool    // multiply the input gradient by (x > 0): the producer's ReLU mask
	// NoArgmax: a pooled block of an inference graph keeps no argmax (no
	// backward reads it).
	NoArgmax bool
	// BNStats: an unpooled conv block of a training graph whose output
	// only a batch norm reads also writes that batch norm's statistics'
	// partials (compiler/ops.BNPartialsType), so no pass re-reads its
	// output for them. The planner may still put the block in a
	// micro-batch loop (the layers before a batch norm): codegen then
	// writes no partials there and the statistics compute them from the
	// output, as without the fusion.
	BNStats bool
	// SaveAct: a conv2d_tanh_avgpool block also writes its full-resolution
	// tanh output, which its backward reads (its input needs a gradient);
	// without it the backward recomputes the conv.
	SaveAct bool
	// InputGrad: a linear_cross_entropy tail also writes its input's
	// gradient (the input needs one).
	InputGrad bool

	// Smoothing is cross_entropy's label smoothing ε in [0,1): the target
	// is (1-ε)·onehot(label) + ε/classes, as PyTorch's label_smoothing.
	Smoothing float64

	// Aug is the data block's augmentation, on the nodes that read the raw
	// u8 image (a conv block and its weight gradient, to_tensor): they
	// apply it while loading (compiler/augment).
	Aug *augment.Spec
}

// Dil is the convolution's dilation (1 where unset).
func (a Attrs) Dil() [2]int64 {
	d := a.Dilation
	for i := range d {
		if d[i] == 0 {
			d[i] = 1
		}
	}
	return d
}

// GroupCount is the convolution's number of groups (1 where unset).
func (a Attrs) GroupCount() int64 { return max(a.Groups, 1) }

// Window is a pooling window.
type Window struct {
	Kernel, Stride, Pad [2]int64
}

// OptimizerKind names an optimizer. What one does is its row in the
// optimizer table, filled by its file in package compiler/ops
// (DefineOptimizer, NewOptimizer); a kind without a row is an error
// wherever it is used, never taken for another optimizer.
type OptimizerKind uint8

// The optimizers the train block has always offered have fixed identities.
const (
	SGD OptimizerKind = iota
	Adam
	AdamW
	numBuiltinOptimizers
)

// OptimizerInfo is one row of the optimizer table.
type OptimizerInfo struct {
	Name string
	// States lists the per-parameter state tensors (PyTorch's names in
	// optimizer.state, e.g. momentum_buffer, exp_avg).
	States func(o *Optimizer) []string
	// UpdateOp is the op that updates one parameter (sgd_update, ...).
	UpdateOp Op
	// FLOPs per parameter element per step.
	FLOPs func(o *Optimizer) int64
	// Text prints the hyper-parameters (the IR's opt= attribute).
	Text func(o *Optimizer) string
}

var optimizerTable = make([]*OptimizerInfo, numBuiltinOptimizers)

// DefineOptimizer fills the row of a built-in optimizer.
func DefineOptimizer(k OptimizerKind, info OptimizerInfo) OptimizerKind {
	if k >= numBuiltinOptimizers || optimizerTable[k] != nil {
		panic(fmt.Sprintf("ir: optimizer %d defined twice or not built in", k))
	}
	optimizerTable[k] = &info
	return k
}

// NewOptimizer adds an optimizer to the table.
func NewOptimizer(info OptimizerInfo) OptimizerKind {
	if len(optimizerTable) > 255 {
		panic("ir: too many optimizers")
	}
	optimizerTable = append(optimizerTable, &info)
	return OptimizerKind(len(optimizerTable) - 1)
}

// Info returns the optimizer's table row; ok is false for a kind nothing
// registered.
func (k OptimizerKind) Info() (*OptimizerInfo, bool) {
	if int(k) >= len(optimizerTable) || optimizerTable[k] == nil {
		return nil, false
	}
	return optimizerTable[k], true
}

func (k OptimizerKind) String() string {
	if info, ok := k.Info(); ok {
		return info.Name
	}
	return fmt.Sprintf("optimizer%d", k)
}

// Optimizer holds the hyper-parameters of a training step's update.
type Optimizer struct {
	Kind        OptimizerKind
	LR          float64
	Momentum    float64 // sgd
	Nesterov    bool    // sgd
	WeightDecay float64
	Beta1       float64 // adam, adamw
	Beta2       float64
	Eps         float64
}

// Info returns the optimizer's table row, or an error naming the unknown
// kind.
func (o *Optimizer) Info() (*OptimizerInfo, error) {
	info, ok := o.Kind.Info()
	if !ok {
		return nil, fmt.Errorf("unknown optimizer %s", o.Kind)
	}
	return info, nil
}

// StateNames lists the per-parameter state tensors the optimizer keeps
// (none for an unknown kind, which Graph.Verify reports).
func (o *Optimizer) StateNames() []string {
	info, err := o.Info()
	if err != nil || info.States == nil {
		return nil
	}
	return info.States(o)
}

func (o *Optimizer) String() string {
	info, err := o.Info()
	if err != nil {
		return o.Kind.String()
	}
	return info.Text(o)
}

// Node is one operation.
type Node struct {
	ID    int
	Op    Op
	Name  string // the layer it belongs to, e.g. "conv1"
	Ins   []*Value
	Outs  []*Value
	Attrs Attrs
	Phase Phase
	Pos   dsl.Pos
}

// Out returns the single output of n.
func (n *Node) Out() *Value { return n.Outs[0] }

// Graph is a model's training step.
type Graph struct {
	Name   string
	Inputs []*Value // images, then labels
	Params []*Param
	// Buffers are persistent state that is not trained (RoleBuffer), in
	// the model's order, like Params.
	Buffers []*Param
	State   []*Value
	Nodes   []*Node
	Loss    *Value
	Logits  *Value // the loss's first input, for accuracy; an inference graph's output
	Opt     *Optimizer
	// Infer marks an inference graph (compiler.Options.Infer): forward
	// nodes only, no loss, labels or optimizer state; Logits is the output.
	Infer bool
	// Eval marks an evaluation graph (compiler.Options.Evaluation): an
	// inference graph that keeps its loss and labels, for a trainer's
	// evaluation step (loss and correct count).
	Eval bool
	// ClipGradNorm is the train block's clip_grad_norm: the largest global
	// L2 norm of all parameters' gradients before the update scales them
	// down (torch.nn.utils.clip_grad_norm_'s max_norm); 0: no clipping.
	ClipGradNorm float64

	nextValue, nextNode int
	names               map[string]bool
}

// NewGraph makes an empty graph.
func NewGraph(name string) *Graph {
	return &Graph{Name: name, names: map[string]bool{}}
}

// UniqueName returns base, or base.N for the first free N.
func (g *Graph) UniqueName(base string) string {
	if g.names == nil {
		g.names = map[string]bool{}
	}
	name := base
	for i := 1; g.names[name]; i++ {
		name = fmt.Sprintf("%s.%d", base, i)
	}
	g.names[name] = true
	return name
}

// ResetNames forgets the names of values no longer in the graph (after a
// pass replaced the nodes), so new values can take them again.
func (g *Graph) ResetNames() {
	g.names = map[string]bool{}
	for _, v := range g.Inputs {
		g.names[v.Name] = true
	}
	for _, p := range g.Params {
		g.names[p.Value.Name] = true
	}
	for _, p := range g.Buffers {
		g.names[p.Value.Name] = true
	}
	for _, v := range g.State {
		g.names[v.Name] = true
	}
	for _, n := range g.Nodes {
		for _, v := range n.Outs {
			g.names[v.Name] = true
		}
	}
}

// NewValue creates a value with a unique name derived from base.
func (g *Graph) NewValue(base string, t Type, role Role, pos dsl.Pos) *Value {
	v := &Value{ID: g.nextValue, Name: g.UniqueName(base), Type: t, Role: role, Pos: pos}
	g.nextValue++
	return v
}

// AddInput declares a model input.
func (g *Graph) AddInput(name string, t Type, role Role, pos dsl.Pos) *Value {
	v := g.NewValue(name, t, role, pos)
	g.Inputs = append(g.Inputs, v)
	return v
}

// AddParam declares a trainable parameter (its type may be filled in later
// by shape inference).
func (g *Graph) AddParam(layer, suffix string, init Init, pos dsl.Pos) *Param {
	p := &Param{Name: layer + "." + suffix, Layer: layer, Init: init}
	p.Value = g.NewValue(p.Name, Type{}, RoleParam, pos)
	p.Value.Param = p
	g.Params = append(g.Params, p)
	return p
}

// AddBuffer declares a buffer: persistent state that is not trained.
func (g *Graph) AddBuffer(layer, suffix string, init Init, pos dsl.Pos) *Param {
	p := &Param{Name: layer + "." + suffix, Layer: layer, Init: init}
	p.Value = g.NewValue(p.Name, Type{}, RoleBuffer, pos)
	p.Value.Param = p
	g.Buffers = append(g.Buffers, p)
	return p
}

// NewNode creates a node (not yet placed in Nodes) with outputs of the
// given roles and unknown types.
func (g *Graph) NewNode(op Op, name string, phase Phase, pos dsl.Pos, ins []*Value, outNames []string, outRole Role) *Node {
	n := &Node{ID: g.nextNode, Op: op, Name: name, Ins: ins, Phase: phase, Pos: pos}
	g.nextNode++
	for _, on := range outNames {
		v := g.NewValue(on, Type{}, outRole, pos)
		v.Def = n
		n.Outs = append(n.Outs, v)
	}
	return n
}

// Append places n at the end of the schedule.
func (g *Graph) Append(n *Node) { g.Nodes = append(g.Nodes, n) }

// ParamByName finds a parameter, or a buffer.
func (g *Graph) ParamByName(name string) *Param {
	for _, p := range g.Params {
		if p.Name == name {
			return p
		}
	}
	for _, p := range g.Buffers {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Uses maps each value to the nodes reading it, in schedule order.
func (g *Graph) Uses() map[*Value][]*Node {
	uses := map[*Value][]*Node{}
	for _, n := range g.Nodes {
		for _, v := range n.Ins {
			uses[v] = append(uses[v], n)
		}
	}
	return uses
}

// ParamCount is the number of trainable scalars.
func (g *Graph) ParamCount() int64 {
	var n int64
	for _, p := range g.Params {
		n += p.Value.Type.SampleElems()
	}
	return n
}

// RemoveNodes drops the nodes for which drop returns true.
func (g *Graph) RemoveNodes(drop func(*Node) bool) {
	kept := g.Nodes[:0]
	for _, n := range g.Nodes {
		if !drop(n) {
			kept = append(kept, n)
		}
	}
	g.Nodes = kept
}

// ForwardOnly says whether g is an inference or evaluation graph: forward
// nodes only, pooled blocks without argmax.
func (g *Graph) ForwardOnly() bool { return g.Infer || g.Eval }
