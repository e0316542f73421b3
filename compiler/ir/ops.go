package ir

import (
	"fmt"
	"math"
	"math/bits"
)

// Op is an operation kind; its meaning is its row in the ops table.
type Op uint8

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

	numOps
)

// Attribute names an op may print (see OpInfo.Attrs).
const (
	AttrKernel  = "kernel"
	AttrStride  = "stride"
	AttrPad     = "pad"
	AttrOut     = "out"
	AttrP       = "p"
	AttrStream  = "stream"
	AttrDims    = "dims"
	AttrOpt     = "opt"
	AttrBias    = "bias"
	AttrReLU    = "relu"
	AttrPool    = "pool"
	AttrMasked  = "masked"
	AttrMaskOut = "maskout"
)

// AttrSmoothing is cross_entropy's label smoothing. It is printed only
// when it is not 0 (see Node.omitted), so that the text of a model without
// label smoothing is what it always was.
const AttrSmoothing = "label_smoothing"

// OpInfo is one row of the ops table.
type OpInfo struct {
	Name string
	// Attrs lists the attributes the op uses, in print order.
	Attrs []string
	// Infer computes the output types from the input types and attributes,
	// or says in plain words why the inputs do not fit.
	Infer func(n *Node) ([]Type, error)
	// FLOPs per sample (per step for unbatched ops), multiplies and adds
	// counted separately.
	FLOPs func(n *Node) int64
}

var opTable [numOps]OpInfo

func init() {
	pool := []string{AttrKernel, AttrStride, AttrPad}
	conv := []string{AttrOut, AttrKernel, AttrStride, AttrPad}
	opTable = [numOps]OpInfo{
		OpConv2D:       {"conv2d", conv, inferConv2D, flopsConv2D},
		OpReLU:         {"relu", nil, inferSameAsInput, flopsPerOutput(1)},
		OpMaxPool2D:    {"maxpool2d", pool, inferPool, flopsPool},
		OpAvgPool2D:    {"avgpool2d", pool, inferPool, flopsPool},
		OpFlatten:      {"flatten", nil, inferFlatten, flopsNone},
		OpLinear:       {"linear", []string{AttrOut}, inferLinear, flopsLinear},
		OpDropout:      {"dropout", []string{AttrP, AttrStream}, inferSameAsInput, flopsPerOutput(1)},
		OpAdd:          {"add", nil, inferAdd, flopsPerOutput(1)},
		OpCrossEntropy: {"cross_entropy", []string{AttrSmoothing}, inferCrossEntropy, flopsCrossEntropy},

		OpConv2DGradInput:  {"conv2d_grad_input", append(conv[:len(conv):len(conv)], AttrDims), inferConv2DGradInput, flopsConv2DGradInput},
		OpConv2DGradWeight: {"conv2d_grad_weight", conv, inferConv2DGradWeight, flopsConv2DGradWeight},
		OpConv2DGradBias:   {"conv2d_grad_bias", nil, inferChannelSum, flopsInput0},
		OpReLUGrad:         {"relu_grad", nil, inferReLUGrad, flopsPerOutput(1)},
		OpMaxPool2DGrad:    {"maxpool2d_grad", pool, inferMaxPoolGrad, flopsPoolGrad},
		OpAvgPool2DGrad:    {"avgpool2d_grad", append(pool[:len(pool):len(pool)], AttrDims), inferAvgPoolGrad, flopsPoolGrad},
		OpReshape:          {"reshape", []string{AttrDims}, inferReshape, flopsNone},
		OpLinearGradInput:  {"linear_grad_input", nil, inferLinearGradInput, flopsLinearGrad},
		OpLinearGradWeight: {"linear_grad_weight", nil, inferLinearGradWeight, flopsLinearGrad},
		OpLinearGradBias:   {"linear_grad_bias", nil, inferLinearGradBias, flopsInput0},
		OpDropoutGrad:      {"dropout_grad", []string{AttrP, AttrStream}, inferSameAsInput, flopsPerOutput(1)},
		OpCrossEntropyGrad: {"cross_entropy_grad", []string{AttrSmoothing}, inferCrossEntropyGrad, flopsCrossEntropy},

		OpSGDUpdate:  {"sgd_update", []string{AttrOpt}, inferUpdate, flopsUpdate},
		OpAdamUpdate: {"adam_update", []string{AttrOpt}, inferUpdate, flopsUpdate},
	}
	registerFusedOps()
}

// Info returns the op's table row.
func (o Op) Info() *OpInfo { return &opTable[o] }

func (o Op) String() string {
	if int(o) < len(opTable) {
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

// checkSize rejects types whose element count is absurd.
func checkSize(t Type) (Type, error) {
	if _, ok := MulChecked(t.Dims...); !ok {
		return t, fmt.Errorf("the result %s has more than 2^40 elements per sample; no GPU can hold it", t.ShapeString())
	}
	return t, nil
}

func one(t Type) ([]Type, error) {
	t, err := checkSize(t)
	if err != nil {
		return nil, err
	}
	return []Type{t}, nil
}

func in(n *Node, i int) Type { return n.Ins[i].Type }

func needRank(n *Node, i int, t Type, rank int, layout string) error {
	if t.DType != F32 || !t.Batched || len(t.Dims) != rank {
		return fmt.Errorf("%s needs a %s input, but %s is %s", n.Op, layout, n.Ins[i].Name, t)
	}
	return nil
}

// ConvOut is the output size of a convolution or pooling window along one
// axis, PyTorch's floor formula; ok is false when the window does not fit.
func ConvOut(size, kernel, stride, pad int64) (int64, bool) {
	if stride <= 0 || kernel <= 0 || size+2*pad < kernel {
		return 0, false
	}
	return (size+2*pad-kernel)/stride + 1, true
}

func windowOut(n *Node, x Type, what string) (int64, int64, error) {
	a := n.Attrs
	ho, ok1 := ConvOut(x.Dims[1], a.Kernel[0], a.Stride[0], a.Pad[0])
	wo, ok2 := ConvOut(x.Dims[2], a.Kernel[1], a.Stride[1], a.Pad[1])
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("%s kernel %dx%d (padding %dx%d) is larger than its %dx%d input %s",
			what, a.Kernel[0], a.Kernel[1], a.Pad[0], a.Pad[1], x.Dims[1], x.Dims[2], n.Ins[0].Name)
	}
	return ho, wo, nil
}

// ConvWeightType is the weight type of a conv2d reading x.
func ConvWeightType(a Attrs, x Type) Type {
	return F32Fixed(a.Out, x.Dims[0], a.Kernel[0], a.Kernel[1])
}

func inferConv2D(n *Node) ([]Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	ho, wo, err := windowOut(n, x, "conv2d")
	if err != nil {
		return nil, err
	}
	if w := in(n, 1); !w.Equal(ConvWeightType(n.Attrs, x)) {
		return nil, fmt.Errorf("conv2d weight %s is %s, want %s", n.Ins[1].Name, w, ConvWeightType(n.Attrs, x))
	}
	if len(n.Ins) > 2 && !in(n, 2).Equal(F32Fixed(n.Attrs.Out)) {
		return nil, fmt.Errorf("conv2d bias %s is %s, want f32[%d]", n.Ins[2].Name, in(n, 2), n.Attrs.Out)
	}
	return one(F32Batched(n.Attrs.Out, ho, wo))
}

func inferSameAsInput(n *Node) ([]Type, error) {
	x := in(n, 0)
	if x.DType != F32 {
		return nil, fmt.Errorf("%s needs a float tensor, but %s is %s", n.Op, n.Ins[0].Name, x)
	}
	return []Type{x}, nil
}

func inferPool(n *Node) ([]Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	a := n.Attrs
	if 2*a.Pad[0] > a.Kernel[0] || 2*a.Pad[1] > a.Kernel[1] {
		return nil, fmt.Errorf("%s padding %dx%d must be at most half the kernel %dx%d", n.Op, a.Pad[0], a.Pad[1], a.Kernel[0], a.Kernel[1])
	}
	ho, wo, err := windowOut(n, x, n.Op.String())
	if err != nil {
		return nil, err
	}
	return one(F32Batched(x.Dims[0], ho, wo))
}

func inferFlatten(n *Node) ([]Type, error) {
	x := in(n, 0)
	if x.DType != F32 || !x.Batched {
		return nil, fmt.Errorf("flatten needs a batched float tensor, but %s is %s", n.Ins[0].Name, x)
	}
	return one(F32Batched(x.SampleElems()))
}

func inferLinear(n *Node) ([]Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 1, "[B,features]"); err != nil {
		if x.DType == F32 && x.Batched && len(x.Dims) > 1 {
			return nil, fmt.Errorf("linear needs [B,features], but %s is %s: flatten it first", n.Ins[0].Name, x)
		}
		return nil, err
	}
	if n.Attrs.In != 0 && n.Attrs.In != x.Dims[0] {
		return nil, fmt.Errorf("linear expects %d input features (in=%d) but %s gives %d", n.Attrs.In, n.Attrs.In, n.Ins[0].Name, x.Dims[0])
	}
	if w, want := in(n, 1), F32Fixed(n.Attrs.Out, x.Dims[0]); !w.Equal(want) {
		return nil, fmt.Errorf("linear weight %s is %s, want %s", n.Ins[1].Name, w, want)
	}
	if len(n.Ins) > 2 && !in(n, 2).Equal(F32Fixed(n.Attrs.Out)) {
		return nil, fmt.Errorf("linear bias %s is %s, want f32[%d]", n.Ins[2].Name, in(n, 2), n.Attrs.Out)
	}
	return one(F32Batched(n.Attrs.Out))
}

func inferAdd(n *Node) ([]Type, error) {
	a, b := in(n, 0), in(n, 1)
	if !a.Equal(b) || a.DType != F32 {
		return nil, fmt.Errorf("add needs two float tensors of one shape, but %s is %s and %s is %s", n.Ins[0].Name, a, n.Ins[1].Name, b)
	}
	return []Type{a}, nil
}

func inferCrossEntropy(n *Node) ([]Type, error) {
	if err := checkLogitsLabel(n); err != nil {
		return nil, err
	}
	return []Type{F32Fixed()}, nil
}

func checkLogitsLabel(n *Node) error {
	logits, label := in(n, 0), in(n, 1)
	if label.DType != Class || !label.Batched || len(label.Dims) != 0 {
		return fmt.Errorf("cross_entropy's second argument must be class labels (class[N]), but %s is %s", n.Ins[1].Name, label)
	}
	if err := needRank(n, 0, logits, 1, "[B,classes] logits"); err != nil {
		return err
	}
	if logits.Dims[0] != label.Classes {
		return fmt.Errorf("cross_entropy: %s has %d outputs but %s has %d classes", n.Ins[0].Name, logits.Dims[0], n.Ins[1].Name, label.Classes)
	}
	return nil
}

func inferCrossEntropyGrad(n *Node) ([]Type, error) {
	if err := checkLogitsLabel(n); err != nil {
		return nil, err
	}
	return []Type{in(n, 0)}, nil
}

func inferConv2DGradInput(n *Node) ([]Type, error) {
	dy, w := in(n, 0), in(n, 1)
	if err := needRank(n, 0, dy, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("conv2d_grad_input needs dims=[C,H,W]")
	}
	x := F32Batched(n.Attrs.Dims...)
	probe := &Node{Op: OpConv2D, Ins: []*Value{{Name: "x", Type: x}, {Name: n.Ins[1].Name, Type: w}}, Attrs: n.Attrs}
	yt, err := inferConv2D(probe)
	if err != nil {
		return nil, err
	}
	if !yt[0].Equal(dy) {
		return nil, fmt.Errorf("conv2d_grad_input: gradient %s is %s but the conv gives %s", n.Ins[0].Name, dy, yt[0])
	}
	return []Type{x}, nil
}

func inferConv2DGradWeight(n *Node) ([]Type, error) {
	dy, x := in(n, 0), in(n, 1)
	if err := needRank(n, 1, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	ho, wo, err := windowOut(n, x, "conv2d")
	if err != nil {
		return nil, err
	}
	if want := F32Batched(n.Attrs.Out, ho, wo); !dy.Equal(want) {
		return nil, fmt.Errorf("conv2d_grad_weight: gradient %s is %s, want %s", n.Ins[0].Name, dy, want)
	}
	return []Type{ConvWeightType(n.Attrs, x)}, nil
}

func inferChannelSum(n *Node) ([]Type, error) {
	dy := in(n, 0)
	if err := needRank(n, 0, dy, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	return []Type{F32Fixed(dy.Dims[0])}, nil
}

func inferReLUGrad(n *Node) ([]Type, error) {
	if !in(n, 0).Equal(in(n, 1)) {
		return nil, fmt.Errorf("relu_grad: %s is %s but %s is %s", n.Ins[0].Name, in(n, 0), n.Ins[1].Name, in(n, 1))
	}
	return []Type{in(n, 0)}, nil
}

func inferMaxPoolGrad(n *Node) ([]Type, error) {
	probe := &Node{Op: OpMaxPool2D, Ins: []*Value{n.Ins[1]}, Attrs: n.Attrs}
	yt, err := inferPool(probe)
	if err != nil {
		return nil, err
	}
	if !yt[0].Equal(in(n, 0)) {
		return nil, fmt.Errorf("maxpool2d_grad: gradient %s is %s, want %s", n.Ins[0].Name, in(n, 0), yt[0])
	}
	return []Type{in(n, 1)}, nil
}

func inferAvgPoolGrad(n *Node) ([]Type, error) {
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("avgpool2d_grad needs dims=[C,H,W]")
	}
	x := F32Batched(n.Attrs.Dims...)
	probe := &Node{Op: OpAvgPool2D, Ins: []*Value{{Name: "x", Type: x}}, Attrs: n.Attrs}
	yt, err := inferPool(probe)
	if err != nil {
		return nil, err
	}
	if !yt[0].Equal(in(n, 0)) {
		return nil, fmt.Errorf("avgpool2d_grad: gradient %s is %s, want %s", n.Ins[0].Name, in(n, 0), yt[0])
	}
	return []Type{x}, nil
}

func inferReshape(n *Node) ([]Type, error) {
	x := in(n, 0)
	t := F32Batched(n.Attrs.Dims...)
	if x.SampleElems() != t.SampleElems() || !x.Batched {
		return nil, fmt.Errorf("reshape of %s %s to %s changes the element count", n.Ins[0].Name, x, t)
	}
	return []Type{t}, nil
}

func inferLinearGradInput(n *Node) ([]Type, error) {
	dy, w := in(n, 0), in(n, 1)
	if err := needRank(n, 0, dy, 1, "[B,features]"); err != nil {
		return nil, err
	}
	if len(w.Dims) != 2 || w.Dims[0] != dy.Dims[0] {
		return nil, fmt.Errorf("linear_grad_input: weight %s %s does not match gradient %s", n.Ins[1].Name, w, dy)
	}
	return []Type{F32Batched(w.Dims[1])}, nil
}

func inferLinearGradWeight(n *Node) ([]Type, error) {
	dy, x := in(n, 0), in(n, 1)
	if err := needRank(n, 0, dy, 1, "[B,features]"); err != nil {
		return nil, err
	}
	if err := needRank(n, 1, x, 1, "[B,features]"); err != nil {
		return nil, err
	}
	return []Type{F32Fixed(dy.Dims[0], x.Dims[0])}, nil
}

func inferLinearGradBias(n *Node) ([]Type, error) {
	dy := in(n, 0)
	if err := needRank(n, 0, dy, 1, "[B,features]"); err != nil {
		return nil, err
	}
	return []Type{F32Fixed(dy.Dims[0])}, nil
}

func inferUpdate(n *Node) ([]Type, error) {
	if n.Attrs.Opt == nil {
		return nil, fmt.Errorf("%s has no optimizer", n.Op)
	}
	p := n.Ins[0]
	if p.Role != RoleParam {
		return nil, fmt.Errorf("%s updates %s, which is not a parameter", n.Op, p.Name)
	}
	want := 2 + len(n.Attrs.Opt.StateNames())
	if len(n.Ins) != want {
		return nil, fmt.Errorf("%s takes %d inputs, got %d", n.Op, want, len(n.Ins))
	}
	for _, v := range n.Ins[1:] {
		if !v.Type.Equal(p.Type) {
			return nil, fmt.Errorf("%s: %s is %s but parameter %s is %s", n.Op, v.Name, v.Type, p.Name, p.Type)
		}
	}
	return nil, nil
}

// FLOPs rules.

func flopsNone(*Node) int64 { return 0 }

func flopsPerOutput(k int64) func(*Node) int64 {
	return func(n *Node) int64 { return MulSat(k, n.Outs[0].Type.SampleElems()) }
}

func flopsInput0(n *Node) int64 { return n.Ins[0].Type.SampleElems() }

func convMACs(out Type, w Type) int64 {
	// per output element: Cin*kh*kw multiply-adds
	return MulSat(out.SampleElems(), w.Dims[1], w.Dims[2], w.Dims[3])
}

func flopsConv2D(n *Node) int64 {
	f := MulSat(2, convMACs(n.Outs[0].Type, n.Ins[1].Type))
	if len(n.Ins) > 2 {
		f = AddSat(f, n.Outs[0].Type.SampleElems())
	}
	return f
}

func flopsConv2DGradInput(n *Node) int64 { return MulSat(2, convMACs(n.Ins[0].Type, n.Ins[1].Type)) }

func flopsConv2DGradWeight(n *Node) int64 {
	return MulSat(2, convMACs(n.Ins[0].Type, n.Outs[0].Type))
}

func flopsPool(n *Node) int64 {
	return MulSat(n.Outs[0].Type.SampleElems(), n.Attrs.Kernel[0], n.Attrs.Kernel[1])
}

func flopsPoolGrad(n *Node) int64 {
	return MulSat(n.Ins[0].Type.SampleElems(), n.Attrs.Kernel[0], n.Attrs.Kernel[1])
}

func flopsLinear(n *Node) int64 {
	w := n.Ins[1].Type
	f := MulSat(2, w.Dims[0], w.Dims[1])
	if len(n.Ins) > 2 {
		f = AddSat(f, w.Dims[0])
	}
	return f
}

func flopsLinearGrad(n *Node) int64 {
	// dx = dy·W and dW = dyᵀ·x both cost 2·out·in per sample
	if n.Op == OpLinearGradInput {
		return MulSat(2, n.Ins[1].Type.SampleElems())
	}
	return MulSat(2, n.Outs[0].Type.SampleElems())
}

func flopsCrossEntropy(n *Node) int64 {
	// max, exp, sum, log per logit
	return MulSat(4, n.Ins[0].Type.SampleElems())
}

func flopsUpdate(n *Node) int64 {
	per := int64(4)
	if n.Op == OpAdamUpdate {
		per = 12
	}
	return MulSat(per, n.Ins[0].Type.SampleElems())
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

// ParamTypes gives the types of a parametric node's weight and bias from
// its first input, the way PyTorch's lazy modules infer in_channels and
// in_features; ok is false for ops without parameters or unfit inputs.
func ParamTypes(n *Node) (weight, bias Type, ok bool) {
	x := n.Ins[0].Type
	switch n.Op {
	case OpConv2D:
		if x.DType != F32 || len(x.Dims) != 3 {
			return Type{}, Type{}, false
		}
		return ConvWeightType(n.Attrs, x), F32Fixed(n.Attrs.Out), true
	case OpLinear:
		if x.DType != F32 || len(x.Dims) != 1 || (n.Attrs.In != 0 && n.Attrs.In != x.Dims[0]) {
			return Type{}, Type{}, false
		}
		return F32Fixed(n.Attrs.Out, x.Dims[0]), F32Fixed(n.Attrs.Out), true
	}
	return Type{}, Type{}, false
}
