package ops

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// conv2d_tanh_avgpool: the fuse pass's kernel for conv2d -> tanh ->
// avgpool2d (LeNet-5's layers), with its input and weight gradients. The
// full-resolution conv output and its gradient never exist in memory:
//
//	conv2d_tanh_avgpool(x, w, b?)                        -> pooled, t?
//	conv2d_tanh_avgpool_grad_input(dOut, w, t)           -> dX
//	conv2d_tanh_avgpool_grad_weight(dOut, x, w, b?)      -> dW, dB?  (recomputes t)
//	conv2d_tanh_avgpool_grad_weight(dOut, x, t)          -> dW, dB?  (save=true)
//
// The backward forms the conv output's gradient where it is used:
// dy(q) = (Σ over the pool windows holding q of dOut)/(kh·kw)·(1 - t(q)²).
// When the block's input needs no gradient (it reads the image), the block
// saves nothing but its pooled output and the weight gradient recomputes
// t = tanh(conv(x)) per position from x, w and b (the forward's own
// arithmetic in the kernels); otherwise (Attrs.SaveAct) the forward also
// writes t, which both gradients read. The weight gradient writes the
// gradients (separate updates follow). Kernels: codegen/conv_pool.go
// (templates/conv_pool.cu.tmpl) and the CPU target's conv_pool.go.

// MaxConvTanhPoolTaps is the longest weight row (input channels x kernel
// window) the fuse pass gives a conv2d_tanh_avgpool block: its direct
// kernels, meant for LeNet-sized layers, keep a weight-gradient thread's
// sums of a row in registers (codegen/conv_pool.go).
const MaxConvTanhPoolTaps = 1024

var attrAvgPool = ir.AttrSpec{Name: "pool", Text: func(a *ir.Attrs) string {
	if a.Pool == nil {
		return "none"
	}
	return fmt.Sprintf("avg(%dx%d/%dx%d/%dx%d)", a.Pool.Kernel[0], a.Pool.Kernel[1], a.Pool.Stride[0], a.Pool.Stride[1], a.Pool.Pad[0], a.Pool.Pad[1])
}}

// attrSaveAct is printed only when the block saves its tanh output.
var attrSaveAct = ir.AttrSpec{Name: "save", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.SaveAct) },
	Default: func(a *ir.Attrs) bool { return !a.SaveAct }}

var convTanhPoolAttrs = []ir.AttrSpec{ir.AttrOut, ir.AttrKernel, ir.AttrStride, ir.AttrPad, ir.AttrBias, attrAvgPool, attrSaveAct}

// ConvTanhPoolOp is the forward block's identity.
var ConvTanhPoolOp = New(&Def{
	OpInfo: ir.OpInfo{Name: "conv2d_tanh_avgpool", Attrs: convTanhPoolAttrs, Infer: inferConvTanhPool, FLOPs: flopsConvTanhPool},
	Doc:    "a conv2d with its bias, a tanh and an average pool, fused (the pooled output, and with save=true the tanh output)",
	Grad:   convTanhPoolGrad,
	Ref:    refConvTanhPool,
	Kernel: Kernel{Custom: "conv_pool"},
})

// ConvTanhPoolGradInputOp is the block's input gradient.
var ConvTanhPoolGradInputOp = New(&Def{
	OpInfo: ir.OpInfo{Name: "conv2d_tanh_avgpool_grad_input", Attrs: ir.AttrList(convTanhPoolAttrs, ir.AttrDims),
		Infer: inferConvTanhPoolGradInput, FLOPs: flopsConvTanhPoolGradInput, GradInput: true},
	Doc:    "a conv2d_tanh_avgpool block's input gradient, from the pooled output's gradient and the saved tanh output",
	NoGrad: "a gradient op",
	Ref:    refConvTanhPoolGradInput,
	Kernel: Kernel{Custom: "conv_pool"},
})

// ConvTanhPoolGradWeightOp is the block's weight and bias gradient.
var ConvTanhPoolGradWeightOp = New(&Def{
	OpInfo: ir.OpInfo{Name: "conv2d_tanh_avgpool_grad_weight", Attrs: convTanhPoolAttrs,
		Infer: inferConvTanhPoolGradWeight, FLOPs: flopsConvTanhPoolGradWeight},
	Doc:    "a conv2d_tanh_avgpool block's weight and bias gradients, recomputing the tanh output unless saved",
	NoGrad: "a gradient op",
	Ref:    refConvTanhPoolGradWeight,
	Kernel: Kernel{Custom: "conv_pool"},
})

// ConvTanhPoolShapes gives a conv2d_tanh_avgpool block's conv output and
// pooled output for an f32 [C,H,W] input view x.
func ConvTanhPoolShapes(a ir.Attrs, x, w *ir.Value) (conv, pooled ir.Type, err error) {
	probe := &ir.Node{Op: ir.OpConv2D, Attrs: a, Ins: []*ir.Value{x, w}}
	ts, err := inferConv2D(probe)
	if err != nil {
		return ir.Type{}, ir.Type{}, err
	}
	if a.Pool == nil {
		return ir.Type{}, ir.Type{}, fmt.Errorf("conv2d_tanh_avgpool needs a pool window")
	}
	pw := a.Pool
	pool := &ir.Node{Op: ir.OpAvgPool2D, Attrs: ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad}, Ins: []*ir.Value{stub("t", ts[0])}}
	ps, err := inferPool(pool)
	if err != nil {
		return ir.Type{}, ir.Type{}, err
	}
	return ts[0], ps[0], nil
}

func inferConvTanhPool(n *ir.Node) ([]ir.Type, error) {
	if len(n.Ins) != 2+boolInt(n.Attrs.Bias) {
		return nil, fmt.Errorf("%s: %d inputs, want x, w and the bias if bias=true", n.Op, len(n.Ins))
	}
	x := stub("x", blockInput(n, in(n, 0)))
	probe := &ir.Node{Op: ir.OpConv2D, Name: n.Name, Attrs: n.Attrs, Ins: append([]*ir.Value{x}, n.Ins[1:]...)}
	if _, err := inferConv2D(probe); err != nil {
		return nil, err
	}
	conv, pooled, err := ConvTanhPoolShapes(n.Attrs, x, n.Ins[1])
	if err != nil {
		return nil, err
	}
	if n.Attrs.SaveAct {
		return []ir.Type{pooled, conv}, nil
	}
	return []ir.Type{pooled}, nil
}

func inferConvTanhPoolGradInput(n *ir.Node) ([]ir.Type, error) {
	if len(n.Ins) != 3 || len(n.Attrs.Dims) != 3 || !n.Attrs.SaveAct {
		return nil, fmt.Errorf("%s reads dOut, w and the saved tanh output (save=true) and needs dims=[C,H,W]", n.Op)
	}
	x := ir.F32Batched(n.Attrs.Dims...)
	conv, pooled, err := ConvTanhPoolShapes(n.Attrs, stub("x", x), n.Ins[1])
	if err != nil {
		return nil, err
	}
	if err := checkTanhPoolGrads(n, pooled, conv); err != nil {
		return nil, err
	}
	return []ir.Type{x}, nil
}

func inferConvTanhPoolGradWeight(n *ir.Node) ([]ir.Type, error) {
	want := 3 + boolInt(n.Attrs.Bias) // dOut, x, w, b?
	if n.Attrs.SaveAct {
		want = 3 // dOut, x, t
	}
	if len(n.Ins) != want {
		return nil, fmt.Errorf("%s: %d inputs, want %d", n.Op, len(n.Ins), want)
	}
	x := blockInput(n, in(n, 1))
	if x.DType != ir.F32 || len(x.Dims) != 3 {
		return nil, fmt.Errorf("%s needs a [B,C,H,W] input, got %s", n.Op, in(n, 1))
	}
	wt := ir.ConvWeightType(n.Attrs, x)
	conv, pooled, err := ConvTanhPoolShapes(n.Attrs, stub("x", x), stub("w", wt))
	if err != nil {
		return nil, err
	}
	if !n.Attrs.SaveAct {
		if !in(n, 2).Equal(wt) {
			return nil, fmt.Errorf("%s: weight %s is %s, want %s", n.Op, n.Ins[2].Name, in(n, 2), wt)
		}
		if n.Attrs.Bias && !in(n, 3).Equal(ir.F32Fixed(wt.Dims[0])) {
			return nil, fmt.Errorf("%s: bias %s is %s, want f32[%d]", n.Op, n.Ins[3].Name, in(n, 3), wt.Dims[0])
		}
	}
	if err := checkTanhPoolGrads(n, pooled, conv); err != nil {
		return nil, err
	}
	outs := []ir.Type{wt}
	if n.Attrs.Bias {
		outs = append(outs, ir.F32Fixed(wt.Dims[0]))
	}
	return outs, nil
}

// checkTanhPoolGrads checks dOut (input 0) and, with save=true, t (the last input).
func checkTanhPoolGrads(n *ir.Node, pooled, conv ir.Type) error {
	if !in(n, 0).Equal(pooled) {
		return fmt.Errorf("%s: gradient %s is %s, want %s", n.Op, n.Ins[0].Name, in(n, 0), pooled)
	}
	if n.Attrs.SaveAct {
		if t := n.Ins[len(n.Ins)-1]; !t.Type.Equal(conv) {
			return fmt.Errorf("%s: saved tanh output %s is %s, want %s", n.Op, t.Name, t.Type, conv)
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FLOPs: the conv's, the bias, tanh (4 a conv output, as tanh's own
// rule) and the pool; the backward's conv GEMM plus the pool routing and
// tanh's derivative, and the recomputed conv when the weight gradient
// recomputes it.

func convTanhPoolCounts(n *ir.Node, x ir.Type) (convElems, macs, pooledElems int64) {
	conv, pooled, err := ConvTanhPoolShapes(n.Attrs, stub("x", x), stub("w", ir.ConvWeightType(n.Attrs, x)))
	if err != nil {
		return 0, 0, 0
	}
	return conv.SampleElems(), ir.MulSat(conv.SampleElems(), x.Dims[0], n.Attrs.Kernel[0], n.Attrs.Kernel[1]), pooled.SampleElems()
}

func flopsConvTanhPool(n *ir.Node) int64 {
	ce, macs, pe := convTanhPoolCounts(n, blockInput(n, in(n, 0)))
	f := ir.AddSat(ir.MulSat(2, macs), ir.MulSat(4, ce))
	if n.Attrs.Bias {
		f = ir.AddSat(f, ce)
	}
	return ir.AddSat(f, ir.MulSat(pe, n.Attrs.Pool.Kernel[0], n.Attrs.Pool.Kernel[1]))
}

func flopsConvTanhPoolGradInput(n *ir.Node) int64 {
	ce, macs, _ := convTanhPoolCounts(n, ir.F32Batched(n.Attrs.Dims...))
	return ir.AddSat(ir.MulSat(2, macs), ir.MulSat(4, ce))
}

func flopsConvTanhPoolGradWeight(n *ir.Node) int64 {
	ce, macs, _ := convTanhPoolCounts(n, blockInput(n, in(n, 1)))
	f := ir.AddSat(ir.MulSat(2, macs), ir.MulSat(4, ce))
	if n.Attrs.Bias {
		f = ir.AddSat(f, ce)
	}
	if !n.Attrs.SaveAct {
		f = ir.AddSat(f, flopsConvTanhPool(&ir.Node{Op: n.Op, Attrs: n.Attrs, Ins: n.Ins[1:]}))
	}
	return f
}

// convTanhPoolGrad is the forward block's gradient rule: the input
// gradient (save=true only: the fuse pass saves t exactly when the input
// needs a gradient) and the weight gradient, whose outputs are the
// parameters' gradients (their updates follow as separate nodes).
func convTanhPoolGrad(b GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
	a := n.Attrs
	x := n.Ins[0]
	grads := make([]*ir.Value, len(n.Ins))
	var t *ir.Value
	if a.SaveAct {
		t = n.Outs[1]
	}
	if need[0] {
		if t == nil {
			panic(fmt.Sprintf("%s: the input needs a gradient but the block saves no tanh output", n.Text()))
		}
		ga := a
		ga.Dims = x.Type.Dims
		grads[0] = b.Node(ConvTanhPoolGradInputOp, n, ga, []*ir.Value{dy, n.Ins[1], t}, []string{x.Name + ".grad"}, ir.RoleActGrad).Out()
	}
	params := n.Ins[1:]
	ins := []*ir.Value{dy, x}
	if t != nil {
		ins = append(ins, t)
	} else {
		ins = append(ins, params...)
	}
	gradientBuffers(b, ConvTanhPoolGradWeightOp, n, a, ins, params, grads)
	return grads
}

// Reference kernels: the unfused ones composed, in float64.

// refConvTanh is tanh(conv(x) + b) at full resolution, and its type.
func refConvTanh(env *RefEnv, n *ir.Node, x []float64, xt ir.Type, w *ir.Value, wv, bias []float64) ([]float64, ir.Type) {
	ct := convOutType(n.Attrs, xt)
	probe := &ir.Node{Op: ir.OpConv2D, Attrs: n.Attrs, Ins: []*ir.Value{stub("x", xt), w}, Outs: []*ir.Value{stub("y", ct)}}
	ins := [][]float64{x, wv}
	if bias != nil {
		ins = append(ins, bias)
	}
	y := refConv2D(env, probe, ins)[0]
	for i, v := range y {
		y[i] = math.Tanh(v)
	}
	return y, ct
}

func refConvTanhPool(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	x, xt := blockX(env, n, n.Ins[0], ins[0])
	var bias []float64
	if n.Attrs.Bias {
		bias = ins[2]
	}
	t, ct := refConvTanh(env, n, x, xt, n.Ins[1], ins[1], bias)
	pw := n.Attrs.Pool
	pt := poolOutType(pw, ct)
	probe := &ir.Node{Op: ir.OpAvgPool2D, Attrs: ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad},
		Ins: []*ir.Value{stub("t", ct)}, Outs: []*ir.Value{stub("p", pt)}}
	pooled := refAvgPool2D(env, probe, [][]float64{t})[0]
	if n.Attrs.SaveAct {
		return [][]float64{pooled, t}
	}
	return [][]float64{pooled}
}

// tanhPoolDY is the conv output's gradient: dOut spread over the pool
// windows, times tanh's derivative 1 - t².
func tanhPoolDY(env *RefEnv, a ir.Attrs, dout, t []float64, ct ir.Type) []float64 {
	pw := a.Pool
	pt := poolOutType(pw, ct)
	probe := &ir.Node{Op: ir.OpAvgPool2DGrad, Attrs: ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad, Dims: ct.Dims},
		Ins: []*ir.Value{stub("d", pt)}, Outs: []*ir.Value{stub("dt", ct)}}
	dy := refAvgPool2DGrad(env, probe, [][]float64{dout})[0]
	for i := range dy {
		dy[i] *= 1 - t[i]*t[i]
	}
	return dy
}

func refConvTanhPoolGradInput(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	xt := ir.F32Batched(n.Attrs.Dims...)
	ct := convOutType(n.Attrs, xt)
	dy := tanhPoolDY(env, n.Attrs, ins[0], ins[2], ct)
	probe := &ir.Node{Op: ir.OpConv2DGradInput, Attrs: n.Attrs, Ins: []*ir.Value{stub("dy", ct), n.Ins[1]}, Outs: []*ir.Value{stub("dx", xt)}}
	return refConv2DGradInput(env, probe, [][]float64{dy, ins[1]})
}

func refConvTanhPoolGradWeight(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	x, xt := blockX(env, n, n.Ins[1], ins[1])
	wt := ir.ConvWeightType(n.Attrs, xt)
	var t []float64
	var ct ir.Type
	if n.Attrs.SaveAct {
		t, ct = ins[2], convOutType(n.Attrs, xt)
	} else {
		var bias []float64
		if n.Attrs.Bias {
			bias = ins[3]
		}
		t, ct = refConvTanh(env, n, x, xt, n.Ins[2], ins[2], bias)
	}
	dy := tanhPoolDY(env, n.Attrs, ins[0], t, ct)
	probe := &ir.Node{Op: ir.OpConv2DGradWeight, Attrs: n.Attrs, Ins: []*ir.Value{stub("dy", ct), stub("x", xt)}, Outs: []*ir.Value{stub("dw", wt)}}
	grads := [][]float64{refConv2DGradWeight(env, probe, [][]float64{dy, x})[0]}
	if n.Attrs.Bias {
		bprobe := &ir.Node{Op: ir.OpConv2DGradBias, Ins: []*ir.Value{stub("dy", ct)}}
		grads = append(grads, refConv2DGradBias(env, bprobe, [][]float64{dy})[0])
	}
	return grads
}
