package cpu

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"strings"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// The small kernels on the CPU: softmax cross-entropy (one task; label smoothing too), elementwise ops (activations
// included), dropout, standalone pools and optimizer updates, zero fill, concat (tasks of chunk
// elements each), global average pooling (tasks of about chunk elements read), batch norm (a
// task per channel).

// chunk is cnnc_cpu.h's CHUNK: elements an elementwise task covers.
const chunk = 16384

func init() {
	register(ir.OpSoftmaxCrossEntropy, softmaxCrossEntropy)
	register(ir.OpToTensor, elementwise("to_tensor", "ToTensor<%s>", func(n *ir.Node) []def {
		u8 := n.Ins[0].Type // [H,W,C]
		return []def{{"H", u8.Dims[0]}, {"W", u8.Dims[1]}, {"C", u8.Dims[2]}}
	}))
	register(ir.OpAdd, elementwise("add", "Add<%s>", nil))
	register(ir.OpReLU, elementwise("relu", "ReLU<%s>", nil))
	register(ir.OpReLUGrad, elementwise("relu_grad", "ReLUGrad<%s>", nil))
	registerActivations()
	register(ops.GlobalAvgPool, globalAvgPool)
	register(ops.GlobalAvgPoolGrad, elementwise("global_avgpool_grad", "GlobalAvgPoolGrad<%s>", func(n *ir.Node) []def {
		return []def{{"HW", mapSize(n.Out().Type)}}
	}))
	register(ops.Concat, concat)
	register(ops.BatchNormStats, batchNormStats)
	register(ops.BatchNormGrad, batchNormGrad)
	for _, op := range []ir.Op{ops.BatchNorm2D, ops.BatchNorm1D} {
		register(op, func(e codegen.Emitter, n *ir.Node) error {
			if n.Attrs.Pool != nil {
				return batchNormPool(e, n)
			}
			functor, consts := bnActFunctor(n)
			return elementwise("batchnorm_apply", "BNApply<%[1]s, "+functor+">", func(n *ir.Node) []def {
				c, s := bnGeom(n.Ins[0].Type)
				return append([]def{{"C", c}, {"S", s}, {"AFFINE", len(n.Ins) == 5}, {"RELU", n.Attrs.ReLU}}, consts...)
			})(e, n)
		})
	}
	register(ops.ConcatGrad, concatGrad)
	register(ir.OpDropout, dropout("dropout"))
	register(ir.OpDropoutGrad, dropout("dropout_grad"))
	register(ir.OpMaxPool2D, pool("maxpool_fwd", "MaxPoolFwd"))
	register(ir.OpAvgPool2D, pool("avgpool_fwd", "AvgPoolFwd"))
	register(ir.OpMaxPool2DGrad, pool("maxpool_grad", "MaxPoolGrad"))
	register(ir.OpAvgPool2DGrad, pool("avgpool_grad", "AvgPoolGrad"))
	register(ir.OpSGDUpdate, update)
	register(ir.OpAdamUpdate, update)
}

// activations are the activations other than ReLU, bound like CUDA's by their ops' elementwise
// kernel names (compiler/ops, Kernel.Elementwise): cnnc_cpu.h's functor (f, the forward, and g,
// the gradient, which reads dy and the saved tensor) and its constants.
var activations = map[string]struct {
	functor string // %[1]s: the kernel's struct of constants
	consts  func(n *ir.Node) []def
}{
	"leaky_relu": {"LeakyReLUF<%[1]s>", func(n *ir.Node) []def { return []def{{"SLOPE", float32(n.Attrs.Alpha)}} }},
	"sigmoid":    {"SigmoidF", nil},
	"tanh":       {"TanhF", nil},
	"gelu":       {"GELUF", nil},
	"silu":       {"SiLUF", nil},
	"hardswish":  {"HardSwishF", nil},
}

// registerActivations adds the rules of the activations and of their gradients: Act and
// ActGrad of cnnc_cpu.h on the activation's functor.
func registerActivations() {
	for _, d := range ops.All() {
		name, impl := d.Kernel.Elementwise, "Act"
		if base, ok := strings.CutSuffix(name, "_grad"); ok {
			name, impl = base, "ActGrad"
		}
		if a, ok := activations[name]; ok {
			register(d.Op, elementwise(d.Kernel.Elementwise, impl+"<%[1]s, "+a.functor+">", a.consts))
		}
	}
}

func softmaxCrossEntropy(e codegen.Emitter, n *ir.Node) error {
	classes := n.Ins[0].Type.Dims[0]
	eps := n.Attrs.Smoothing
	// label smoothing's target weights, rounded to float32 once here (as codegen's CUDA rule does)
	defs := []def{{"B", e.Batch()}, {"CLASSES", classes}, {"ACC", e.Accumulate()},
		{"SMOOTH", eps != 0}, {"ON", float32(1 - eps)}, {"OFF", float32(eps / float64(classes))}}
	shape, doc := fmt.Sprintf("b%d_c%d", e.Batch(), classes), "softmax cross-entropy: mean loss over the valid rows, the logits' gradient, the correct count."
	if eps != 0 {
		shape += "_ls"
		doc = fmt.Sprintf("softmax cross-entropy with label smoothing %g: mean loss over the valid rows, the logits' gradient, the correct count.", eps)
	}
	name := emit(e, kernelSpec{family: "softmax_cross_entropy", shape: shape,
		doc:     doc,
		structs: []structSpec{{"g", defs}}, impl: "SoftmaxCE<%s>", nparams: 7})
	args := []codegen.Arg{buf(n.Ins[0]), buf(n.Ins[1])}
	for _, v := range n.Outs {
		args = append(args, buf(v))
	}
	// the step's scalars (the rows that are real), and the micro-batch's first row (set by
	// GenerateFromPlan)
	args = append(args, codegen.Arg{Kind: kernelarg.Scalars}, codegen.Arg{Kind: kernelarg.Int, Int: 0})
	return launch(e, n, name, 1, args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

// elementwise: the node's inputs then its output, over the output's elements; impl is the
// kernel's template (kernelSpec.impl: %s or %[1]s for its struct of constants).
func elementwise(family, impl string, extra func(n *ir.Node) []def) rule {
	return func(e codegen.Emitter, n *ir.Node) error {
		elems := n.Out().Type.Elems(e.Batch())
		defs := []def{{"N", elems}}
		if extra != nil {
			defs = append(defs, extra(n)...)
		}
		var args []codegen.Arg
		for _, v := range n.Ins {
			args = append(args, buf(v))
		}
		args = append(args, buf(n.Out()))
		k, args := augKernel(e, n, kernelSpec{family: family, shape: fmt.Sprintf("n%d", elems), doc: fmt.Sprintf("%s over %d elements.", n.Op, elems),
			structs: []structSpec{{"g", defs}}, impl: impl, nparams: len(args)}, args)
		name := emit(e, k)
		return launch(e, n, name, cdiv(elems, chunk), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
	}
}

// mapSize is a [C,H,W] tensor's H·W.
func mapSize(t ir.Type) int64 { return t.Dims[1] * t.Dims[2] }

// globalAvgPool: each (sample, channel) output sums its map in order; a task takes about chunk
// elements' worth of maps.
func globalAvgPool(e codegen.Emitter, n *ir.Node) error {
	x := n.Ins[0].Type
	if len(x.Dims) != 3 {
		return fmt.Errorf("%s: global_avgpool needs a [B,C,H,W] tensor", n.Text())
	}
	outs, hw := n.Out().Type.Elems(e.Batch()), mapSize(x)
	per := max(1, chunk/hw)
	name := emit(e, kernelSpec{family: "global_avgpool", shape: fmt.Sprintf("n%d_hw%d", outs, hw), doc: fmt.Sprintf("global_avgpool of %d maps of %d elements.", outs, hw),
		structs: []structSpec{{"g", []def{{"N", outs}, {"HW", hw}, {"OUTS", per}}}}, impl: "GlobalAvgPool<%s>", nparams: 2})
	return launch(e, n, name, cdiv(outs, per), []codegen.Arg{buf(n.Ins[0]), buf(n.Out())}, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

// concatSlice emits and launches impl (ConcatPart or ConcatGrad) over the elements [first,
// first+per) of samples of all elements: from src to dst.
func concatSlice(e codegen.Emitter, n *ir.Node, family, impl string, src, dst *ir.Value, per, all, first int64) error {
	elems := per * e.Batch()
	name := emit(e, kernelSpec{family: family, shape: fmt.Sprintf("n%d_of%d_at%d", elems, all, first),
		doc:     fmt.Sprintf("%s: elements [%d, %d) of each %d-element sample of the concat.", n.Op, first, first+per, all),
		structs: []structSpec{{"g", []def{{"N", elems}, {"PER", per}, {"ALL", all}, {"FIRST", first}}}}, impl: impl, nparams: 2})
	return launch(e, n, name, cdiv(elems, chunk), []codegen.Arg{buf(src), buf(dst)}, 0, 2*4*elems)
}

// concat: one ConcatPart launch per input, into its channels of the output.
func concat(e codegen.Emitter, n *ir.Node) error {
	all, first := n.Out().Type.SampleElems(), int64(0)
	for _, v := range n.Ins {
		per := v.Type.SampleElems()
		if err := concatSlice(e, n, "concat", "ConcatPart<%s>", v, n.Out(), per, all, first); err != nil {
			return err
		}
		first += per
	}
	return nil
}

// concatGrad: one input's channels [offset, offset+dims[0]) of the concat's gradient.
func concatGrad(e codegen.Emitter, n *ir.Node) error {
	dy := n.Ins[0].Type
	all, per := dy.SampleElems(), n.Out().Type.SampleElems()
	first := n.Attrs.Offset * (all / dy.Dims[0])
	return concatSlice(e, n, "concat_grad", "ConcatGrad<%s>", n.Ins[0], n.Out(), per, all, first)
}

// bnGeom: a [C,...] type's channels and values per channel per sample.
func bnGeom(t ir.Type) (c, s int64) { return t.Dims[0], t.SampleElems() / t.Dims[0] }

// batchNormStats: training, one task per channel (the batch's statistics, the running ones
// moved); evaluation, one task reading the running statistics. The node's inputs, outputs and
// the step's scalars (the valid count) are the parameters.
func batchNormStats(e codegen.Emitter, n *ir.Node) error {
	return batchNorm(e, n, n.Ins[0].Type, "batchnorm_stats", "BNStats<%s>", []def{{"EPS", float32(n.Attrs.Eps)}, {"MOM", float32(n.Attrs.Momentum)}})
}

// batchNormGrad: one task per channel.
func batchNormGrad(e codegen.Emitter, n *ir.Node) error {
	if e.Eval() {
		return fmt.Errorf("%s: no gradient in evaluation", n.Text())
	}
	functor, consts := bnActFunctor(n)
	ysave := false
	if p := ops.PointwiseOf(n.Attrs.Act); p != nil {
		ysave = p.SaveOutput
	}
	extra := append([]def{{"AFFINE", n.Attrs.Bias}, {"ACT", n.Attrs.Act != 0}, {"YSAVE", ysave}}, consts...)
	impl := "BNGrad<%[1]s, " + functor + ">"
	if n.Attrs.Pool != nil {
		// dy is the folded pool's output's gradient, routed through the argmax (PoolR)
		extra = append(extra, bnPoolDefs(n.Attrs.Pool, n.Ins[1].Type)...)
		impl = "BNGrad<%[1]s, " + functor + ", PoolR<%[1]s>>"
	}
	return batchNorm(e, n, n.Ins[1].Type, "batchnorm_grad", impl, extra)
}

// bnPoolDefs are the constants of a max-pool pw folded into a batch norm of x [C,H,W]: PoolR's
// and BNApplyPool's geometry and the argmax's BITS.
func bnPoolDefs(pw *ir.Window, x ir.Type) []def {
	ho, _ := ir.ConvOut(x.Dims[1], pw.Kernel[0], pw.Stride[0], pw.Pad[0])
	wo, _ := ir.ConvOut(x.Dims[2], pw.Kernel[1], pw.Stride[1], pw.Pad[1])
	return []def{{"H", x.Dims[1]}, {"W", x.Dims[2]}, {"PHO", ho}, {"PWO", wo}, {"KH", pw.Kernel[0]}, {"KW", pw.Kernel[1]},
		{"SH", pw.Stride[0]}, {"SW", pw.Stride[1]}, {"PH", pw.Pad[0]}, {"PW", pw.Pad[1]},
		{"BITS", ir.ArgmaxType(pw.Kernel[0] * pw.Kernel[1]).Bits}}
}

// batchNormPool: a batch norm with the max-pool after it folded in (Attrs.Pool), BNApplyPool:
// tasks of chunk pooled outputs, each normalising (and activating) its window and writing the
// maximum and, in training, its packed argmax.
func batchNormPool(e codegen.Emitter, n *ir.Node) error {
	x := n.Ins[0].Type
	functor, consts := bnActFunctor(n)
	elems := n.Out().Type.Elems(e.Batch())
	defs := append([]def{{"N", elems}, {"C", x.Dims[0]}, {"AFFINE", len(n.Ins) == 5}, {"RELU", n.Attrs.ReLU}, {"ARGMAX", len(n.Outs) == 2}},
		append(bnPoolDefs(n.Attrs.Pool, x), consts...)...)
	var args []codegen.Arg
	for _, v := range append(append([]*ir.Value{}, n.Ins...), n.Outs...) {
		args = append(args, buf(v))
	}
	pw := n.Attrs.Pool
	name := emit(e, kernelSpec{family: "batchnorm_apply_pool", shape: fmt.Sprintf("c%d_h%d_w%d_k%dx%ds%dx%dp%dx%d_b%d", x.Dims[0], x.Dims[1], x.Dims[2],
		pw.Kernel[0], pw.Kernel[1], pw.Stride[0], pw.Stride[1], pw.Pad[0], pw.Pad[1], e.Batch()),
		doc:     fmt.Sprintf("%s over [%d,%d,%d,%d] with the max-pool after it folded in.", n.Op, e.Batch(), x.Dims[0], x.Dims[1], x.Dims[2]),
		structs: []structSpec{{"g", defs}}, impl: "BNApplyPool<%[1]s, " + functor + ">", nparams: len(args)})
	return launch(e, n, name, cdiv(elems, chunk), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

// bnActFunctor is the functor of the activation folded into batch norm node n (Attrs.Act),
// NoActF for none, and its constants: the activation's own kernels' (activations).
func bnActFunctor(n *ir.Node) (string, []def) {
	name := ops.BNActKernel(&n.Attrs)
	if name == "" {
		return "NoActF", nil
	}
	a := activations[name]
	if a.consts == nil {
		return a.functor, nil
	}
	return a.functor, a.consts(n)
}

func batchNorm(e codegen.Emitter, n *ir.Node, x ir.Type, family, impl string, extra []def) error {
	if e.Accumulate() {
		return fmt.Errorf("%s: batch norm cannot run in a micro-batch loop", n.Text())
	}
	c, s := bnGeom(x)
	tasks := c
	if family == "batchnorm_stats" && e.Eval() {
		family, impl, tasks = "batchnorm_stats_eval", "BNStatsEval<%s>", 1
	}
	var args []codegen.Arg
	ins := n.Ins
	if family == "batchnorm_stats" || family == "batchnorm_stats_eval" {
		ins = ins[:4] // not a conv block's partials (Attrs.BNStats): the statistics read x in float64
	}
	for _, v := range append(append([]*ir.Value{}, ins...), n.Outs...) {
		args = append(args, buf(v))
	}
	args = append(args, codegen.Arg{Kind: kernelarg.Scalars}) // the batch's valid count
	name := emit(e, kernelSpec{family: family, shape: fmt.Sprintf("c%d_s%d_b%d", c, s, e.Batch()), doc: fmt.Sprintf("%s over [%d,%d,%d] (the batch valid at run time).", n.Op, e.Batch(), c, s),
		structs: []structSpec{{"g", append([]def{{"B", e.Batch()}, {"C", c}, {"S", s}}, extra...)}}, impl: impl, nparams: len(args)})
	return launch(e, n, name, tasks, args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

func (target) ZeroFill(e codegen.Emitter, n *ir.Node, v *ir.Value) error {
	words := cdiv(v.Type.Bytes(e.Batch()), 4)
	name := emit(e, kernelSpec{family: "fill_zero", shape: fmt.Sprintf("n%d", words), doc: "zeroes a gradient accumulator.",
		structs: []structSpec{{"g", []def{{"N", words}}}}, impl: "FillZero<%s>", nparams: 1})
	return launch(e, n, name, cdiv(words, chunk), []codegen.Arg{buf(v)}, 0, 4*words)
}

// dropoutThreshold is the smallest 32-bit word kept: ceil(p·2^32) (codegen's dropout).
func dropoutThreshold(p float64) uint64 {
	if p <= 0 {
		return 0
	}
	return uint64(math.Ceil(p * 4294967296.0))
}

func dropout(family string) rule {
	return func(e codegen.Emitter, n *ir.Node) error {
		p := n.Attrs.P
		if p < 0 || p >= 1 {
			return fmt.Errorf("%s: dropout probability %g outside [0,1)", n.Text(), p)
		}
		if n.Attrs.Stream < 0 || n.Attrs.Stream > math.MaxUint32 {
			return fmt.Errorf("%s: stream %d does not fit the counter's 32 bits", n.Text(), n.Attrs.Stream)
		}
		elems := n.Out().Type.Elems(e.Batch())
		defs := []def{{"N", elems}, {"STREAM", uint64(n.Attrs.Stream)}, {"THRESHOLD", dropoutThreshold(p)}, {"SCALE", float32(1 / (1 - p))}}
		name := emit(e, kernelSpec{family: family, shape: fmt.Sprintf("n%d", elems), doc: fmt.Sprintf("%s, p=%g, over %d elements (training).", n.Op, p, elems),
			structs: []structSpec{{"g", defs}}, impl: "Dropout<%s>", nparams: 4})
		// the last argument: the slice's first element in the whole batch (set by GenerateFromPlan)
		args := []codegen.Arg{buf(n.Ins[0]), buf(n.Out()), {Kind: kernelarg.Scalars}, {Kind: kernelarg.Int, Int: 0}}
		return launch(e, n, name, cdiv(elems, chunk), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
	}
}

func pool(family, impl string) rule {
	return func(e codegen.Emitter, n *ir.Node) error {
		a := n.Attrs
		var in, out ir.Type // the pool's input and output
		switch n.Op {
		case ir.OpMaxPool2D, ir.OpAvgPool2D:
			in, out = n.Ins[0].Type, n.Out().Type
		case ir.OpMaxPool2DGrad:
			in, out = n.Ins[1].Type, n.Ins[0].Type
		default:
			in, out = n.Out().Type, n.Ins[0].Type
		}
		if len(in.Dims) != 3 || len(out.Dims) != 3 {
			return fmt.Errorf("%s: pools need [B,C,H,W] tensors", n.Text())
		}
		elems := out.Elems(e.Batch()) // forward: one output each
		if n.Op == ir.OpMaxPool2DGrad || n.Op == ir.OpAvgPool2DGrad {
			elems = in.Elems(e.Batch()) // gradients: one input element each
		}
		defs := []def{{"B", e.Batch()}, {"C", in.Dims[0]}, {"H", in.Dims[1]}, {"W", in.Dims[2]}, {"PHO", out.Dims[1]}, {"PWO", out.Dims[2]},
			{"KH", a.Kernel[0]}, {"KW", a.Kernel[1]}, {"SH", a.Stride[0]}, {"SW", a.Stride[1]}, {"PH", a.Pad[0]}, {"PW", a.Pad[1]}, {"N", elems}}
		var args []codegen.Arg
		for _, v := range n.Ins {
			args = append(args, buf(v))
		}
		args = append(args, buf(n.Out()))
		name := emit(e, kernelSpec{family: family, shape: fmt.Sprintf("x%dx%dx%d_k%dx%ds%d_b%d", in.Dims[0], in.Dims[1], in.Dims[2], a.Kernel[0], a.Kernel[1], a.Stride[0], e.Batch()),
			doc:     fmt.Sprintf("%s %dx%d stride %dx%d pad %dx%d.", n.Op, a.Kernel[0], a.Kernel[1], a.Stride[0], a.Stride[1], a.Pad[0], a.Pad[1]),
			structs: []structSpec{{"g", defs}}, impl: impl + "<%s>", nparams: len(args)})
		return launch(e, n, name, cdiv(elems, chunk), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
	}
}

// update: sgd_update / adam_update(param, grad, state...) in place.
func update(e codegen.Emitter, n *ir.Node) error {
	opt := n.Attrs.Opt
	if opt == nil {
		return fmt.Errorf("%s has no optimizer", n.Text())
	}
	clip := ops.UpdateClip(n) != nil
	if want := 2 + optStates(opt); len(n.Ins) != want && !(clip && len(n.Ins) == want+1) {
		return fmt.Errorf("%s: %d inputs, want %d", n.Text(), len(n.Ins), want)
	}
	elems := n.Ins[0].Type.SampleElems()
	var args []codegen.Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	// the element range [first, end) it updates: the whole tensor, unless a sharded
	// optimizer's rank sets its range there (codegen.UpdateRangeArgs)
	args = append(args, codegen.Arg{Kind: kernelarg.Scalars}, codegen.Arg{Kind: kernelarg.Int, Int: 0}, codegen.Arg{Kind: kernelarg.Int, Int: elems})
	name := emit(e, kernelSpec{family: "update", shape: fmt.Sprintf("n%d", elems), doc: fmt.Sprintf("%s of %d parameters: %s.", n.Op, elems, opt),
		structs: []structSpec{{"g", []def{{"N", elems}, {"CLIP", clip}}}, {"o", optDefs(opt)}}, impl: "Update<%s, %s>", nparams: len(args)})
	return launch(e, n, name, cdiv(elems, chunk), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch())+int64(len(n.Ins)-1)*n.Ins[0].Type.Bytes(e.Batch()))
}
