package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// conv2d_block: conv + bias + activation? + max-pool?, the fuse pass's
// kernel for a conv2d and the activation and pool after it (the
// full-resolution conv output never exists; a pooled block writes its
// pooled output and a packed argmax), with its input gradient and its
// weight gradient (the optimizer update fused). Layouts in ir/fused.go;
// kernels in codegen/conv.go (templates/conv.cu.tmpl) and codegen/cpu. The
// reference kernels compose the unfused ones, so "fused step == unfused
// step" is checked in float64.
//
// The activation is ReLU (Attrs.ReLU, whose mask the backward reads from y
// or takes from its reader's maskout epilogue) or any other pointwise one
// (Attrs.Act, as linear_block.go): y = f(z), z = conv + bias, applied
// before the pool (gelu, silu and hardswish are not monotonic), so the
// argmax is over f(z). The gradients take dz = f'(·)·dy while they load dy,
// through one saved tensor s (BlockParts.Y, at the block output's
// resolution): y where the derivative is a function of the output
// (sigmoid, tanh, leaky_relu with a positive slope; pooled, y at the
// argmax is f(z) there), else z, which the block writes as its last output
// (Attrs.SaveAct; not in a forward-only graph) — pooled, z at the argmax
// positions only, a pooled-size tensor. Unfused, the activation would save
// a full-resolution tensor, so the block never saves more than the pair
// (or the triple, with the pool) it replaces. The pooled kernels keep the
// conv outputs' z until the pool has picked each window's maximum of f(z)
// (the CUDA epilogue keeps z alone and applies f as it compares, the CPU's
// z beside f(z)), then write z there — the position the argmax word
// records — and the gradients read it where they read the pooled y.

var convBlockAttrs = []ir.AttrSpec{ir.AttrOut, ir.AttrKernel, ir.AttrStride, ir.AttrPad, ir.AttrBias, ir.AttrReLU, attrFusedAct, attrFusedSlope, ir.AttrPool, ir.AttrArgmax, attrSaveAct, ir.AttrBNStats}

var _ = Register(ir.OpConvBlock, &Def{
	OpInfo: ir.OpInfo{Name: "conv2d_block", Attrs: convBlockAttrs, Infer: inferConvBlock, FLOPs: flopsConvBlock, Layout: blockLayout},
	Doc:    "a conv2d with its bias, activation and max-pool, fused",
	Grad:   blockGrad(ir.OpConvBlockGradInput, ir.OpConvBlockGradWeight),
	Ref:    refConvBlock,
	Kernel: Kernel{Custom: "conv"},
})

var _ = Register(ir.OpConvBlockGradInput, &Def{
	OpInfo: ir.OpInfo{Name: "conv2d_block_grad_input", Attrs: ir.AttrList(convBlockAttrs, ir.AttrMasked, ir.AttrMaskOut, ir.AttrDims),
		Infer: inferConvBlockGradInput, FLOPs: flopsConvBlockGradInput, Layout: gradInputLayout, GradInput: true,
		InPlace: maskOutInput},
	Doc:    "a conv block's input gradient, through its activation, with the ReLU mask of the block before it (maskout)",
	NoGrad: "a gradient op",
	Ref:    refConvBlockGradInput,
	Kernel: Kernel{Custom: "conv"},
})

var _ = Register(ir.OpConvBlockGradWeight, &Def{
	OpInfo: ir.OpInfo{Name: "conv2d_block_grad_weight", Attrs: ir.AttrList(convBlockAttrs, ir.AttrMasked, ir.AttrOpt),
		Infer: inferConvBlockGradWeight, FLOPs: flopsConvBlockGradWeight, Layout: gradWeightLayout},
	Doc:    "a conv block's weight and bias gradients, with the optimizer update fused",
	NoGrad: "a gradient op",
	Ref:    refConvBlockGradWeight,
	Kernel: Kernel{Custom: "conv"},
})

// maskOutInput: the fused grad_input kernels with a maskout epilogue
// compute dX[i] = (Σ over the window of dOut·W)·(xmask[i] > 0), so the
// masked gradient may overwrite the activation it masks (the last input
// in the layout).
func maskOutInput(n *ir.Node) []int {
	if !n.Attrs.MaskOut {
		return nil
	}
	return []int{len(n.Ins) - 1}
}

// blockInput returns the f32 [C,H,W] view of block n's input (u8 HWC
// images are converted, and augmented, inside the conv's loads).
func blockInput(n *ir.Node, x ir.Type) ir.Type {
	if x.DType == ir.U8 && len(x.Dims) == 3 {
		return imageView(n.Attrs, x)
	}
	return x
}

// convBlockShapes gives the conv output (pre-pool) and the block outputs.
func convBlockShapes(n *ir.Node, x ir.Type, w *ir.Value, b *ir.Value) (conv ir.Type, out []ir.Type, err error) {
	if w == nil {
		return ir.Type{}, nil, fmt.Errorf("%s: no weight", n.Op)
	}
	probe := &ir.Node{Op: ir.OpConv2D, Name: n.Name, Attrs: n.Attrs, Ins: []*ir.Value{stub("x", blockInput(n, x)), w}}
	if b != nil {
		probe.Ins = append(probe.Ins, b)
	}
	ts, err := inferConv2D(probe)
	if err != nil {
		return ir.Type{}, nil, err
	}
	conv = ts[0]
	if n.Attrs.Pool == nil {
		return conv, []ir.Type{conv}, nil
	}
	pw := n.Attrs.Pool
	pool := &ir.Node{Op: ir.OpMaxPool2D, Attrs: ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad}, Ins: []*ir.Value{stub(n.Name, conv)}}
	ps, err := inferPool(pool)
	if err != nil {
		return ir.Type{}, nil, err
	}
	am := ir.ArgmaxType(pw.Kernel[0]*pw.Kernel[1], ps[0].Dims...)
	return conv, []ir.Type{ps[0], am}, nil
}

func inferConvBlock(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	_, outs, err := convBlockShapes(n, p.X.Type, p.W, p.B)
	if err != nil {
		return nil, err
	}
	if n.Attrs.NoArgmax && len(outs) == 2 {
		outs = outs[:1] // inference: no backward reads the argmax
	}
	if n.Attrs.BNStats {
		if n.Attrs.Pool != nil {
			return nil, fmt.Errorf("%s: a pooled block writes no batch norm partials", n.Op)
		}
		outs = append(outs, BNPartialsType(outs[0])) // before z (SaveAct: the last output)
	}
	if n.Attrs.SaveAct {
		if !LinearSavesPre(&n.Attrs) || n.Attrs.NoArgmax {
			return nil, fmt.Errorf("%s: save=true needs an activation whose gradient reads its input, in a training graph", n.Op)
		}
		outs = append(outs, outs[0]) // z (pooled: at the argmax), at the output's resolution
	}
	return outs, nil
}

func inferConvBlockGradInput(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("%s needs dims=[C,H,W]", n.Op)
	}
	x := ir.F32Batched(n.Attrs.Dims...)
	_, outs, err := convBlockShapes(n, x, p.W, nil)
	if err != nil {
		return nil, err
	}
	if err := checkBackwardParts(n, p, outs); err != nil {
		return nil, err
	}
	if p.XMask != nil && !p.XMask.Type.Equal(x) {
		return nil, fmt.Errorf("%s: mask input %s is %s, want %s", n.Op, p.XMask.Name, p.XMask.Type, x)
	}
	return []ir.Type{x}, nil
}

func inferConvBlockGradWeight(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	x := blockInput(n, p.X.Type)
	if x.DType != ir.F32 || len(x.Dims) != 3 {
		return nil, fmt.Errorf("%s needs a [B,C,H,W] input, got %s", n.Op, p.X.Type)
	}
	wt := ir.ConvWeightType(n.Attrs, x)
	_, outs, err := convBlockShapes(n, p.X.Type, stub("w", wt), nil)
	if err != nil {
		return nil, err
	}
	if err := checkBackwardParts(n, p, outs); err != nil {
		return nil, err
	}
	return gradWeightOuts(n, p, wt)
}

// FLOPs of fused ops: the sum of what they fuse.

func convBlockFLOPs(n *ir.Node, outElems, convElems int64, cin int64) int64 {
	f := ir.MulSat(2, convElems, cin, n.Attrs.Kernel[0], n.Attrs.Kernel[1])
	if n.Attrs.Bias {
		f = ir.AddSat(f, convElems)
	}
	if n.Attrs.ReLU || n.Attrs.Act != 0 {
		f = ir.AddSat(f, convElems)
	}
	if pw := n.Attrs.Pool; pw != nil {
		f = ir.AddSat(f, ir.MulSat(outElems, pw.Kernel[0], pw.Kernel[1]))
	}
	return f
}

func flopsConvBlock(n *ir.Node) int64 {
	p, _ := n.Parts()
	conv, _, err := convBlockShapes(n, p.X.Type, p.W, p.B)
	if err != nil {
		return 0
	}
	return convBlockFLOPs(n, n.Outs[0].Type.SampleElems(), conv.SampleElems(), blockInput(n, p.X.Type).Dims[0])
}

func flopsConvBlockGradInput(n *ir.Node) int64 {
	p, _ := n.Parts()
	x := ir.F32Batched(n.Attrs.Dims...)
	conv, _, err := convBlockShapes(n, x, p.W, nil)
	if err != nil {
		return 0
	}
	return ir.MulSat(2, conv.SampleElems(), x.Dims[0], n.Attrs.Kernel[0], n.Attrs.Kernel[1])
}

func flopsConvBlockGradWeight(n *ir.Node) int64 {
	p, _ := n.Parts()
	x := blockInput(n, p.X.Type)
	wt := ir.ConvWeightType(n.Attrs, x)
	conv, _, err := convBlockShapes(n, p.X.Type, stub("w", wt), nil)
	if err != nil {
		return 0
	}
	f := ir.MulSat(2, conv.SampleElems(), x.Dims[0], n.Attrs.Kernel[0], n.Attrs.Kernel[1])
	if n.Attrs.Bias {
		f = ir.AddSat(f, conv.SampleElems())
	}
	return f
}

// Reference kernels. The argmax of a pooled block holds the window index
// (ky*kw + kx) of the first maximum in scan order, as one float64 per
// element (kernels pack it into bits).

// blockX returns a conv block's input as f32 CHW values and type.
func blockX(env *RefEnv, n *ir.Node, v *ir.Value, data []float64) ([]float64, ir.Type) {
	if v.Type.DType == ir.U8 {
		t := v.Type
		if a := n.Attrs.Aug; a != nil {
			return Augmented(a, env, data), imageView(n.Attrs, t)
		}
		return HWCToCHW(data, env.Batch, t), ir.F32Batched(t.Dims[2], t.Dims[0], t.Dims[1])
	}
	return data, v.Type
}

// convOutType is the conv (pre-pool) output type of a block with input x.
func convOutType(a ir.Attrs, x ir.Type) ir.Type {
	ho, _ := ir.ConvOut(x.Dims[1], a.Kernel[0], a.Stride[0], a.Pad[0])
	wo, _ := ir.ConvOut(x.Dims[2], a.Kernel[1], a.Stride[1], a.Pad[1])
	return ir.F32Batched(a.Out, ho, wo)
}

func poolOutType(p *ir.Window, conv ir.Type) ir.Type {
	ho, _ := ir.ConvOut(conv.Dims[1], p.Kernel[0], p.Stride[0], p.Pad[0])
	wo, _ := ir.ConvOut(conv.Dims[2], p.Kernel[1], p.Stride[1], p.Pad[1])
	return ir.F32Batched(conv.Dims[0], ho, wo)
}

func refConvBlock(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	x, xt := blockX(env, n, n.Ins[0], ins[0])
	a := n.Attrs
	ct := convOutType(a, xt)
	probe := &ir.Node{Op: ir.OpConv2D, Attrs: a, Ins: []*ir.Value{stub("x", xt), n.Ins[1]}, Outs: []*ir.Value{stub("y", ct)}}
	cins := [][]float64{x, ins[1]}
	if a.Bias {
		probe.Ins = append(probe.Ins, n.Ins[2])
		cins = append(cins, ins[2])
	}
	z := refConv2D(env, probe, cins)[0]
	y := linearAct(env, n, z)
	if a.Pool == nil {
		outs := [][]float64{y}
		if a.BNStats {
			outs = append(outs, refBNPartials(env, n, ct, y))
		}
		if a.SaveAct {
			outs = append(outs, z)
		}
		return outs
	}
	pooled, argmax, at := maxpoolArgmax(env, a.Pool, ct, y)
	if a.NoArgmax {
		return [][]float64{pooled}
	}
	if a.SaveAct {
		zp := make([]float64, len(at))
		for o, i := range at {
			zp[o] = z[i] // z where the window took its maximum of f(z)
		}
		return [][]float64{pooled, argmax, zp}
	}
	return [][]float64{pooled, argmax}
}

// refBNPartials are the batch norm partials of block (or direct conv2d) n's
// output y (type ct; the partials its second output), tiled as the target
// tiles the node (env.BNTiles; flat otherwise), over the whole batch.
func refBNPartials(env *RefEnv, n *ir.Node, ct ir.Type, y []float64) []float64 {
	part := n.Outs[1]
	return BNPartials(y, env.Batch, env.Batch, ct.Dims[0], ct.Dims[1], ct.Dims[2], env.BNTiles[part], int(part.Type.Elems(int64(env.Batch))))
}

// maxpoolArgmax pools x: the maxima, their window indices and their flat
// positions in x.
func maxpoolArgmax(env *RefEnv, p *ir.Window, in ir.Type, x []float64) ([]float64, []float64, []int) {
	out := poolOutType(p, in)
	g := windowGeom(ir.Attrs{Kernel: p.Kernel, Stride: p.Stride, Pad: p.Pad}, in, out)
	y := make([]float64, out.Elems(int64(env.Batch)))
	am := make([]float64, len(y))
	at := make([]int, len(y))
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					i := maxWindow(x, g, b, c, oy, ox)
					o := ((b*g.c+c)*g.ho+oy)*g.wo + ox
					y[o], at[o] = x[i], i
					iy, ix := (i/g.w)%g.h, i%g.w
					am[o] = float64((iy-(oy*g.sh-g.ph))*g.kw + ix - (ox*g.sw - g.pw))
				}
			}
		}
	}
	return y, am, at
}

func refConvBlockGradInput(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	xt := ir.F32Batched(n.Attrs.Dims...)
	ct := convOutType(n.Attrs, xt)
	dy := preActivationGrad(env, n, p, vals, ct)
	probe := &ir.Node{Op: ir.OpConv2DGradInput, Attrs: n.Attrs, Ins: []*ir.Value{stub("dy", ct), p.W}, Outs: []*ir.Value{stub("dx", xt)}}
	dx := refConv2DGradInput(env, probe, [][]float64{dy, vals[p.W]})[0]
	return [][]float64{applyMaskOut(dx, p, vals)}
}

func refConvBlockGradWeight(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	x, xt := blockX(env, n, p.X, vals[p.X])
	ct := convOutType(n.Attrs, xt)
	dy := preActivationGrad(env, n, p, vals, ct)
	wt := ir.ConvWeightType(n.Attrs, xt)
	probe := &ir.Node{Op: ir.OpConv2DGradWeight, Attrs: n.Attrs, Ins: []*ir.Value{stub("dy", ct), stub("x", xt)}, Outs: []*ir.Value{stub("dw", wt)}}
	grads := [][]float64{refConv2DGradWeight(env, probe, [][]float64{dy, x})[0]}
	if n.Attrs.Bias {
		bprobe := &ir.Node{Op: ir.OpConv2DGradBias, Ins: []*ir.Value{stub("dy", ct)}}
		grads = append(grads, refConv2DGradBias(env, bprobe, [][]float64{dy})[0])
	}
	return fusedUpdate(env, n, p, vals, grads)
}

func reluValues(x []float64) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = max(v, 0)
	}
	return y
}
