package ops

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// DSL is how a model writes an op: op(x, ..., key=value, ...).
type DSL struct {
	Name    string
	Aliases []string
	// Order places the op in the docs' table (and in suggestions).
	Order int
	// Tensors is the number of positional tensor arguments; with Variadic,
	// the least number (concat takes two or more).
	Tensors  int
	Variadic bool
	// TensorNames name the tensor arguments in the docs (default x; a, b).
	TensorNames []string
	Args        []ArgSpec
	// Attrs fills the IR attributes from the checked arguments (types are
	// not known yet: padding="same" is resolved from kernel and dilation).
	// An error is positioned at the argument it names (ArgError) or the
	// call: combinations no single argument's bounds catch.
	Attrs func(a Args) (ir.Attrs, error)
	// Params lists the trainable parameters a call owns, Buffers its
	// buffers (persistent, not trained), in the order the op's inputs take
	// them after its tensor arguments: parameters first. Each becomes
	// LAYER.Suffix in checkpoints, as in PyTorch's state_dict.
	Params  func(a Args) []ParamSpec
	Buffers func(a Args) []ParamSpec
	// Expand, when set, lowers a call to several IR nodes instead of one
	// node of the op (batch norm: its statistics, then their application).
	// It receives the node lowering would have made (inputs: tensors, then
	// parameters, then buffers; attributes set) and returns the nodes to
	// append in order, the last one's output 0 being the call's value.
	Expand func(n *ir.Node, g *ir.Graph) []*ir.Node

	// For the docs' op table.
	Shape    string // input -> output shapes
	ParamDoc string // parameters and buffers with their shapes
	PyTorch  string // the PyTorch module or function it matches

	// Examples are calls on tensors named x, y and z that the generic tests
	// build models around (ExampleModel): finite-difference gradients in
	// the reference, every kernel against the reference on the emulator,
	// forward and backward against PyTorch. Features says the op reads
	// feature vectors [F] (else maps [C,H,W]). TestScale, when set,
	// scales the random inputs of the kernel and PyTorch tests so that
	// every piece of a piecewise function is crossed (hardswish: ±3).
	Examples  []string
	Features  bool
	TestScale float64
	// Torch gives, per example, the PyTorch expression computing it from
	// x, y, z and the parameters and buffers by suffix (weight, bias,
	// running_mean, ...); F is torch.nn.functional. Empty: no PyTorch check
	// (the op is checked against PyTorch elsewhere).
	Torch []string
}

// ArgError is an error of DSL.Attrs about one argument, reported at it.
type ArgError struct {
	Arg string
	Msg string
}

func (e *ArgError) Error() string { return e.Msg }

// ParamSpec is a parameter or buffer a call owns; its type comes from
// the op's ParamTypes (num_batches_tracked: an int64 scalar).
type ParamSpec struct {
	Suffix string // weight, bias, running_mean, ...
	Init   ir.InitKind
}

// GradBuilder is what a gradient rule may do: emit backward nodes, and
// read and leave facts about the graph being differentiated. The compiler's
// reverse-mode engine implements it, for autodiff and for the fuse pass's
// backward alike.
type GradBuilder interface {
	// Emit appends a backward node of op for forward node fwd, reading ins,
	// with one output: the gradient with respect to wrt (named after it,
	// a parameter gradient when wrt is a parameter), which it returns.
	Emit(op ir.Op, fwd *ir.Node, attrs ir.Attrs, wrt *ir.Value, ins ...*ir.Value) *ir.Value
	// Node appends a backward node of op for fwd with the given outputs
	// (named, of role role) and returns it, its types inferred.
	Node(op ir.Op, fwd *ir.Node, attrs ir.Attrs, ins []*ir.Value, outs []string, role ir.Role) *ir.Node
	// Graph is the graph being differentiated.
	Graph() *ir.Graph
	// Readers lists the nodes of the differentiated set that read v.
	Readers(v *ir.Value) []*ir.Node
	// NeedsGrad reports whether v depends on a parameter.
	NeedsGrad(v *ir.Value) bool
	// Mark and Marked record and read facts one rule leaves for another
	// rule, by key and value (the fuse pass: "this block output's gradient
	// arrives with its ReLU mask applied").
	Mark(key string, v *ir.Value)
	Marked(key string, v *ir.Value) bool
}

// GradRule emits the backward nodes of forward node n given dy, the
// gradient of its output 0 (nil for the loss, whose gradient is 1), and
// returns one gradient per input; need[i] says whether input i needs one,
// and a rule returns nil where it does not. Rules of fused ops may fuse a
// parameter's update into its weight-gradient kernel and return nil for it.
type GradRule func(b GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value

// RefEnv is what a reference kernel may read besides its node and inputs.
type RefEnv struct {
	Batch    int
	Training bool // dropout on, batch statistics used and updated
	Update   bool // apply optimizer updates (fused ones included)
	Seed     uint64
	Step     int64 // completed training steps
	// A memory plan may run part of the step on micro-batches: the call
	// then covers samples [FirstSample, FirstSample+Batch) of a batch of
	// FullBatch (0: the call's own batch).
	FirstSample int
	FullBatch   int
	// FusedGrad receives the gradients a weight-gradient block with a
	// fused update computed, when the run does not update (may be nil).
	FusedGrad func(p *ir.Param, grad []float64)
	// BNTiles: the tiling of a conv block's batch norm partials (its
	// output value; BNTiling) where a target's is not flat, so that the
	// reference writes the cells the kernels do.
	BNTiles map[*ir.Value]BNTiling
}

// LossBatch is the batch the loss averages over: the whole batch, also
// when a call sees one micro-batch of it, so that the micro-batches'
// gradients add up to the full batch's.
func (env *RefEnv) LossBatch() float64 {
	if env.FullBatch > 0 {
		return float64(env.FullBatch)
	}
	return float64(env.Batch)
}

// Elems is v's element count at the call's batch.
func (env *RefEnv) Elems(v *ir.Value) int { return int(v.Type.Elems(int64(env.Batch))) }

// RefKernel computes a node's outputs from its inputs in float64 (argmax
// as window indices, labels as class numbers, u8 images as raw 0..255
// values). Update kernels, and ops that write buffers, change those inputs
// in place.
type RefKernel func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64

// Kernel binds an op to its generated kernels.
type Kernel struct {
	// Elementwise names a template (in templates/, any file) of one thread
	// per element of output 0 in a grid-stride loop, taking the node's
	// inputs then its output; codegen renders and launches it with no rule
	// of its own. The template receives Name, Elems, and Consts.
	Elementwise string
	// Consts are compile-time constants of an elementwise kernel (a
	// slope): the template reads them by name as C float literals, and the
	// kernel's name carries their values.
	Consts func(a *ir.Attrs) []Const
	// Data adds template fields computed from the node (the integer shapes
	// a reduction or a copy compiles in), and Suffix names them in the
	// kernel's name where its output's shape does not show them.
	Data   func(n *ir.Node) map[string]any
	Suffix func(n *ir.Node) string
	// Custom names the template family of an op whose launches a rule in
	// codegen makes (conv and linear blocks, pools, the loss, updates); the
	// codegen tests check that every such op has its rule.
	Custom string
	// ReplacedBy names the fused op whose kernels compute this op: the fuse
	// pass always replaces it, so codegen never sees it.
	ReplacedBy string
	// FirstSample says that the last argument of the op's launches is the
	// micro-batch's place in the whole batch, which codegen sets inside
	// micro-batch loops.
	FirstSample FirstSample
}

// Const is a compile-time constant of an elementwise kernel.
type Const struct {
	Name  string
	Value float64
}

// FirstSample is how a kernel locates its micro-batch in the batch.
type FirstSample uint8

const (
	NoFirstSample FirstSample = iota
	// FirstElement: the index of the micro-batch's first element of the
	// op's output in the whole batch (dropout's mask counter).
	FirstElement
	// FirstRow: the index of the micro-batch's first sample (the loss).
	FirstRow
)

// ONNX maps an op onto ONNX operators: one operator (Op, the first Inputs
// of the node's inputs in order, Attrs), or anything else through Emit.
type ONNX struct {
	Op     string
	Inputs int // 0: all
	Attrs  func(n *ir.Node) []ONNXAttr
	Emit   func(e ONNXEmitter, n *ir.Node) error
}

// ONNXEmitter is what an ONNX mapping may do.
type ONNXEmitter interface {
	// Name is the ONNX name of a value already in the graph (the input,
	// a parameter or buffer, an earlier node's output).
	Name(v *ir.Value) string
	// Output names v's tensor in the ONNX graph (its value info recorded).
	Output(v *ir.Value) string
	// Temp names an intermediate tensor of per-sample dims.
	Temp(base string, dims []int64) string
	// Node adds an operator.
	Node(op string, ins, outs []string, attrs ...ONNXAttr)
	// Const adds a float32 initializer that is no parameter of the model.
	Const(base string, dims []int64, vals []float32) string
}

// ONNXAttr is an ONNX attribute: an int, ints or a float.
type ONNXAttr struct {
	Name  string
	Kind  ONNXAttrKind
	Int   int64
	Ints  []int64
	Float float32
}

// ONNXAttrKind is an attribute's type.
type ONNXAttrKind uint8

const (
	ONNXInt ONNXAttrKind = iota
	ONNXInts
	ONNXFloat
)

// IntAttr, IntsAttr and FloatAttr make ONNX attributes.
func IntAttr(name string, v int64) ONNXAttr { return ONNXAttr{Name: name, Kind: ONNXInt, Int: v} }

func IntsAttr(name string, vs ...int64) ONNXAttr {
	return ONNXAttr{Name: name, Kind: ONNXInts, Ints: vs}
}

func FloatAttr(name string, v float64) ONNXAttr {
	return ONNXAttr{Name: name, Kind: ONNXFloat, Float: float32(v)}
}
