package ir

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// Op is an operation kind. What an op means — its type rule, FLOPs,
// printed attributes and properties — is its row in the ops table, which
// the op's own file in package compiler/ops fills in (Define, NewOp): the
// IR knows no op by itself. Every stage of the compiler reaches an op's
// behaviour through that registry.
type Op uint16

// The ops the compiler's passes build by name (lowering, autodiff, the fuse
// pass, the planner's split updates) have fixed identities here; ops that
// nothing refers to by name get theirs when their file registers them
// (NewOp), so adding one touches no file of this package.
const (
	OpConv2D Op = iota
	OpReLU
	OpMaxPool2D
	OpAvgPool2D
	OpFlatten
	OpLinear
	OpDropout
	OpAdd
	OpCrossEntropy

	OpConv2DGradInput
	OpConv2DGradWeight
	OpConv2DGradBias
	OpReLUGrad
	OpMaxPool2DGrad
	OpAvgPool2DGrad
	OpReshape
	OpLinearGradInput
	OpLinearGradWeight
	OpLinearGradBias
	OpDropoutGrad
	OpCrossEntropyGrad

	OpSGDUpdate
	OpAdamUpdate

	// Fused ops (fused.go), made by the compiler's fuse pass.
	OpToTensor
	OpConvBlock
	OpConvBlockGradInput
	OpConvBlockGradWeight
	OpLinearBlock
	OpLinearBlockGradInput
	OpLinearBlockGradWeight
	OpSoftmaxCrossEntropy

	// NumBuiltinOps is the number of ops with fixed identities; registered
	// ops (NewOp) follow them.
	NumBuiltinOps
)

// OpInfo is one row of the ops table: what the IR itself needs to know of
// an op, and the properties every later stage reads instead of testing for
// particular ops.
type OpInfo struct {
	Name string
	// Attrs lists the attributes the op uses, in print order.
	Attrs []AttrSpec
	// Infer computes the output types from the input types and attributes,
	// or says in plain words why the inputs do not fit.
	Infer func(n *Node) ([]Type, error)
	// FLOPs per sample (per step for unbatched ops), multiplies and adds
	// counted separately.
	FLOPs func(n *Node) int64

	// ParamTypes gives the types of the op's parameter (and buffer) inputs
	// from its first input, as PyTorch's lazy modules infer in_channels and
	// in_features, by suffix (weight, bias, running_mean), and the fan-in
	// their initialisation uses; ok is false when the input does not fit
	// (the type rule then says why). Nil for ops without parameters.
	ParamTypes func(n *Node) (types map[string]Type, fanIn int64, ok bool)

	// View: the output is the input's memory reinterpreted (flatten,
	// reshape); no kernel runs.
	View bool
	// EvalIdentity: in evaluation the op passes its first input through
	// (dropout), so there it is a view too.
	EvalIdentity bool
	// Loss: the op computes the model's loss (a scalar averaged over the
	// batch); inside a micro-batch loop it accumulates.
	Loss bool
	// Random: the op draws from a counter-based random stream of its own
	// (Attrs.Stream, numbered by lowering in program order).
	Random bool
	// Update: an optimizer update, in the update phase, writing its
	// parameter and optimizer state inputs in place.
	Update bool
	// UpdateInput: a node of the update phase that is no update but
	// computes, from the finished gradients, what the updates read (the
	// gradient clipping coefficient): it runs after every gradient and
	// before the updates that read it.
	UpdateInput bool
	// GradInput: the kernel that computes a layer's input gradient (the
	// planner schedules a layer's separate weight gradient before it, so
	// that it is the last reader of the saved input).
	GradInput bool
	// BatchCoupled: an output sample depends on other samples of the batch
	// (batch norm's statistics), so a micro-batch is not a batch of the
	// same model: the planner never micro-batches across such a node.
	BatchCoupled bool
	// Mutates lists the inputs the op writes in place besides its outputs
	// (batch norm's running statistics). Such a node has an effect beyond
	// its outputs: the planner never recomputes it.
	Mutates func(n *Node) []int
	// InPlace lists the inputs whose buffer output 0 may take over (see
	// Node.InPlaceInputs); nil: none.
	InPlace func(n *Node) []int
	// Layout decodes the inputs of a fused op (see Node.Parts); nil for
	// unfused ops.
	Layout func(n *Node) (BlockParts, error)
}

// AttrSpec is one printed attribute of an op.
type AttrSpec struct {
	Name string
	Text func(a *Attrs) string
	// Default, when set, reports whether the attribute has its default
	// value; it is then left out of the text, so that an attribute added to
	// an op later does not change the text of models that do not use it.
	Default func(a *Attrs) bool
}

func pairText(p [2]int64) string { return fmt.Sprintf("%dx%d", p[0], p[1]) }

// The attributes several ops print.
var (
	AttrKernel  = AttrSpec{Name: "kernel", Text: func(a *Attrs) string { return pairText(a.Kernel) }}
	AttrStride  = AttrSpec{Name: "stride", Text: func(a *Attrs) string { return pairText(a.Stride) }}
	AttrPad     = AttrSpec{Name: "pad", Text: func(a *Attrs) string { return pairText(a.Pad) }}
	AttrOut     = AttrSpec{Name: "out", Text: func(a *Attrs) string { return fmt.Sprint(a.Out) }}
	AttrP       = AttrSpec{Name: "p", Text: func(a *Attrs) string { return fmt.Sprint(a.P) }}
	AttrStream  = AttrSpec{Name: "stream", Text: func(a *Attrs) string { return fmt.Sprint(a.Stream) }}
	AttrDims    = AttrSpec{Name: "dims", Text: func(a *Attrs) string { return F32Batched(a.Dims...).ShapeString() }}
	AttrBias    = AttrSpec{Name: "bias", Text: func(a *Attrs) string { return fmt.Sprint(a.Bias) }}
	AttrReLU    = AttrSpec{Name: "relu", Text: func(a *Attrs) string { return fmt.Sprint(a.ReLU) }}
	AttrMasked  = AttrSpec{Name: "masked", Text: func(a *Attrs) string { return fmt.Sprint(a.DOutMasked) }}
	AttrMaskOut = AttrSpec{Name: "maskout", Text: func(a *Attrs) string { return fmt.Sprint(a.MaskOut) }}
	// AttrArgmax is printed only for a pooled block without argmax (inference).
	AttrArgmax = AttrSpec{Name: "argmax", Text: func(a *Attrs) string { return fmt.Sprint(!a.NoArgmax) },
		Default: func(a *Attrs) bool { return !a.NoArgmax }}
	// AttrBNStats is printed only for a block that writes batch norm's
	// statistics' partials.
	AttrBNStats = AttrSpec{Name: "bnstats", Text: func(a *Attrs) string { return fmt.Sprint(a.BNStats) },
		Default: func(a *Attrs) bool { return !a.BNStats }}
	AttrOpt = AttrSpec{Name: "opt", Text: func(a *Attrs) string {
		if a.Opt == nil {
			return "none"
		}
		return a.Opt.String()
	}}
	AttrPool = AttrSpec{Name: "pool", Text: func(a *Attrs) string {
		if a.Pool == nil {
			return "none"
		}
		return fmt.Sprintf("max(%s/%s/%s)", pairText(a.Pool.Kernel), pairText(a.Pool.Stride), pairText(a.Pool.Pad))
	}}
	// AttrDilation and AttrGroups are printed only when they are not 1.
	AttrDilation = AttrSpec{Name: "dilation", Text: func(a *Attrs) string { return pairText(a.Dil()) },
		Default: func(a *Attrs) bool { return a.Dil() == [2]int64{1, 1} }}
	AttrGroups = AttrSpec{Name: "groups", Text: func(a *Attrs) string { return fmt.Sprint(a.GroupCount()) },
		Default: func(a *Attrs) bool { return a.GroupCount() == 1 }}
)

// AttrList returns specs followed by more, without sharing specs' array (so
// that ops can extend a common list).
func AttrList(specs []AttrSpec, more ...AttrSpec) []AttrSpec {
	return append(append([]AttrSpec(nil), specs...), more...)
}

var opTable = make([]OpInfo, NumBuiltinOps)

// Define fills the table row of a built-in op. Each op's file in package
// compiler/ops calls it (or NewOp) once, at initialisation.
func Define(op Op, info OpInfo) Op {
	if op >= NumBuiltinOps {
		panic(fmt.Sprintf("ir: Define(%d): not a built-in op; use NewOp", op))
	}
	if opTable[op].Name != "" {
		panic(fmt.Sprintf("ir: op %s defined twice", opTable[op].Name))
	}
	checkNewName(info.Name)
	opTable[op] = info
	return op
}

// NewOp adds an op to the table and returns its identity.
func NewOp(info OpInfo) Op {
	checkNewName(info.Name)
	if len(opTable) > math.MaxUint16 {
		panic("ir: too many ops")
	}
	opTable = append(opTable, info)
	return Op(len(opTable) - 1)
}

func checkNewName(name string) {
	if name == "" || strings.ContainsAny(name, " \t\n(),=%") {
		panic(fmt.Sprintf("ir: bad op name %q", name))
	}
	if _, dup := OpByName(name); dup {
		panic(fmt.Sprintf("ir: two ops are named %s", name))
	}
}

// NumOps is the number of ops in the table (built-in and registered).
func NumOps() int { return len(opTable) }

// Defined reports whether op has a table row.
func (o Op) Defined() bool { return int(o) < len(opTable) && opTable[o].Name != "" }

// Info returns the op's table row.
func (o Op) Info() *OpInfo {
	if int(o) >= len(opTable) {
		panic(fmt.Sprintf("ir: op %d is not in the table", o))
	}
	return &opTable[o]
}

func (o Op) String() string {
	if o.Defined() {
		return opTable[o].Name
	}
	return fmt.Sprintf("op%d", o)
}

// OpByName finds an op by its printed name.
func OpByName(name string) (Op, bool) {
	for i := range opTable {
		if opTable[i].Name == name {
			return Op(i), true
		}
	}
	return 0, false
}

// MaxElems bounds a tensor's element count (2^40 elements is 4 TiB of
// f32, more than any GPU holds): larger shapes are errors, not overflows.
const MaxElems = int64(1) << 40

// MulChecked multiplies sizes, reporting overflow past MaxElems.
func MulChecked(xs ...int64) (int64, bool) {
	n := int64(1)
	for _, x := range xs {
		if x < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(uint64(n), uint64(x))
		if hi != 0 || lo > uint64(MaxElems) {
			return 0, false
		}
		n = int64(lo)
	}
	return n, true
}

// MulSat multiplies non-negative counts (FLOPs, bytes), saturating at
// math.MaxInt64 instead of wrapping: an absurd model's count stays huge
// and positive, and the compiler's limits (which bound every count a
// model may reach) report it rather than printing a negative number.
func MulSat(xs ...int64) int64 {
	n := int64(1)
	for _, x := range xs {
		if x <= 0 {
			return 0
		}
		hi, lo := bits.Mul64(uint64(n), uint64(x))
		if hi != 0 || lo > math.MaxInt64 {
			return math.MaxInt64
		}
		n = int64(lo)
	}
	return n
}

// AddSat adds non-negative counts, saturating at math.MaxInt64.
func AddSat(xs ...int64) int64 {
	var n int64
	for _, x := range xs {
		if n > math.MaxInt64-x {
			return math.MaxInt64
		}
		n += x
	}
	return n
}

// CheckSize rejects types whose element count is absurd.
func CheckSize(t Type) error {
	if _, ok := MulChecked(t.Dims...); !ok {
		return fmt.Errorf("the result %s has more than 2^40 elements per sample; no GPU can hold it", t.ShapeString())
	}
	return nil
}

// ConvOut is the output size of a convolution or pooling window along one
// axis, PyTorch's floor formula; ok is false when the window does not fit.
func ConvOut(size, kernel, stride, pad int64) (int64, bool) {
	return ConvOutDilated(size, kernel, stride, pad, 1)
}

// ConvOutDilated is ConvOut for a window whose taps are dilation apart:
// it spans dilation·(kernel-1)+1 elements.
func ConvOutDilated(size, kernel, stride, pad, dilation int64) (int64, bool) {
	if stride <= 0 || kernel <= 0 || dilation <= 0 {
		return 0, false
	}
	span := dilation*(kernel-1) + 1
	if size+2*pad < span {
		return 0, false
	}
	return (size+2*pad-span)/stride + 1, true
}

// ConvWeightType is the weight type of a conv2d reading x:
// [out, C/groups, kh, kw].
func ConvWeightType(a Attrs, x Type) Type {
	return F32Fixed(a.Out, x.Dims[0]/a.GroupCount(), a.Kernel[0], a.Kernel[1])
}

// FLOPs returns the node's floating-point operations at the given batch.
func (n *Node) FLOPs(batch int64) int64 {
	f := n.Op.Info().FLOPs(n)
	if n.IsBatched() {
		f = MulSat(f, batch)
	}
	return f
}

// IsBatched reports whether the node's work scales with the batch.
func (n *Node) IsBatched() bool {
	for _, v := range n.Ins {
		if v.Type.Batched {
			return true
		}
	}
	return false
}

// ParamTypes gives the types of a parametric node's parameter inputs from
// its first input (see OpInfo.ParamTypes); ok is false for ops without
// parameters or unfit inputs.
func ParamTypes(n *Node) (types map[string]Type, fanIn int64, ok bool) {
	rule := n.Op.Info().ParamTypes
	if rule == nil {
		return nil, 0, false
	}
	return rule(n)
}
