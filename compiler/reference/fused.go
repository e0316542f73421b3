package reference

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// Reference kernels of the fused ops: each is the composition of the
// unfused kernels it replaces, so "fused step == unfused step" can be
// checked in float64. The argmax of a pooled block holds the window index
// (ky*kw + kx) of the first maximum in scan order, as one float64 per
// element (kernels pack it into bits).

func registerFusedKernels() {
	kernels[ir.OpToTensor] = toTensor
	kernels[ir.OpConvBlock] = convBlock
	kernels[ir.OpConvBlockGradInput] = convBlockGradInput
	kernels[ir.OpConvBlockGradWeight] = convBlockGradWeight
	kernels[ir.OpLinearBlock] = linearBlock
	kernels[ir.OpLinearBlockGradInput] = linearBlockGradInput
	kernels[ir.OpLinearBlockGradWeight] = linearBlockGradWeight
	kernels[ir.OpSoftmaxCrossEntropy] = softmaxCrossEntropy
}

func stub(name string, t ir.Type) *ir.Value { return &ir.Value{Name: name, Type: t} }

// hwcToCHW converts uint8 HWC pixels (as float64 0..255) to [0,1] CHW, like
// torchvision's ToTensor.
func hwcToCHW(px []float64, batch int, u8 ir.Type) []float64 {
	h, w, c := int(u8.Dims[0]), int(u8.Dims[1]), int(u8.Dims[2])
	out := make([]float64, len(px))
	for b := 0; b < batch; b++ {
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				for ch := 0; ch < c; ch++ {
					out[((b*c+ch)*h+y)*w+x] = px[((b*h+y)*w+x)*c+ch] / 255
				}
			}
		}
	}
	return out
}

func toTensor(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	return [][]float64{hwcToCHW(ins[0], env.batch, n.Ins[0].Type)}
}

// blockX returns a conv block's input as f32 CHW values and type.
func blockX(env *env, v *ir.Value, data []float64) ([]float64, ir.Type) {
	if v.Type.DType == ir.U8 {
		t := v.Type
		return hwcToCHW(data, env.batch, t), ir.F32Batched(t.Dims[2], t.Dims[0], t.Dims[1])
	}
	return data, v.Type
}

// convTypes: the conv (pre-pool) output type of a block with input x.
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

func convBlock(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	x, xt := blockX(env, n.Ins[0], ins[0])
	a := n.Attrs
	ct := convOutType(a, xt)
	probe := &ir.Node{Op: ir.OpConv2D, Attrs: a, Ins: []*ir.Value{stub("x", xt), n.Ins[1]}, Outs: []*ir.Value{stub("y", ct)}}
	cins := [][]float64{x, ins[1]}
	if a.Bias {
		probe.Ins = append(probe.Ins, n.Ins[2])
		cins = append(cins, ins[2])
	}
	y := conv2d(env, probe, cins)[0]
	if a.ReLU {
		y = relu(env, nil, [][]float64{y})[0]
	}
	if a.Pool == nil {
		return [][]float64{y}
	}
	pooled, argmax := maxpoolArgmax(env, a.Pool, ct, y)
	return [][]float64{pooled, argmax}
}

func maxpoolArgmax(env *env, p *ir.Window, in ir.Type, x []float64) ([]float64, []float64) {
	out := poolOutType(p, in)
	g := windowGeom(ir.Attrs{Kernel: p.Kernel, Stride: p.Stride, Pad: p.Pad}, in, out)
	y := make([]float64, out.Elems(int64(env.batch)))
	am := make([]float64, len(y))
	for b := 0; b < env.batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					i := maxWindow(x, g, b, c, oy, ox)
					o := ((b*g.c+c)*g.ho+oy)*g.wo + ox
					y[o] = x[i]
					iy, ix := (i/g.w)%g.h, i%g.w
					am[o] = float64((iy-(oy*g.sh-g.ph))*g.kw + ix - (ox*g.sw - g.pw))
				}
			}
		}
	}
	return y, am
}

// preActivationGrad turns the gradient of a block's output into the
// gradient of its conv (or linear) output: the ReLU mask unless already
// applied, then routing through the argmax to full resolution.
func preActivationGrad(env *env, n *ir.Node, p ir.BlockParts, vals map[*ir.Value][]float64, convT ir.Type) []float64 {
	d := vals[p.DOut]
	if p.Y != nil {
		masked := make([]float64, len(d))
		for i, y := range vals[p.Y] {
			if y > 0 {
				masked[i] = d[i]
			}
		}
		d = masked
	}
	pw := n.Attrs.Pool
	if pw == nil {
		return d
	}
	out := poolOutType(pw, convT)
	g := windowGeom(ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad}, convT, out)
	full := make([]float64, convT.Elems(int64(env.batch)))
	am := vals[p.Argmax]
	for b := 0; b < env.batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					o := ((b*g.c+c)*g.ho+oy)*g.wo + ox
					k := int(am[o])
					iy, ix := oy*g.sh-g.ph+k/g.kw, ox*g.sw-g.pw+k%g.kw
					full[((b*g.c+c)*g.h+iy)*g.w+ix] += d[o]
				}
			}
		}
	}
	return full
}

// partsValues maps a fused node's inputs to their data.
func partsValues(n *ir.Node, ins [][]float64) (ir.BlockParts, map[*ir.Value][]float64) {
	p, err := n.Parts()
	if err != nil {
		panic(err) // the verifier rejects such graphs before they run
	}
	vals := map[*ir.Value][]float64{}
	for i, v := range n.Ins {
		vals[v] = ins[i]
	}
	return p, vals
}

func applyMaskOut(dx []float64, p ir.BlockParts, vals map[*ir.Value][]float64) []float64 {
	if p.XMask != nil {
		for i, x := range vals[p.XMask] {
			if x <= 0 {
				dx[i] = 0
			}
		}
	}
	return dx
}

func convBlockGradInput(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	xt := ir.F32Batched(n.Attrs.Dims...)
	ct := convOutType(n.Attrs, xt)
	dy := preActivationGrad(env, n, p, vals, ct)
	probe := &ir.Node{Op: ir.OpConv2DGradInput, Attrs: n.Attrs, Ins: []*ir.Value{stub("dy", ct), p.W}, Outs: []*ir.Value{stub("dx", xt)}}
	dx := conv2dGradInput(env, probe, [][]float64{dy, vals[p.W]})[0]
	return [][]float64{applyMaskOut(dx, p, vals)}
}

func convBlockGradWeight(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	x, xt := blockX(env, p.X, vals[p.X])
	ct := convOutType(n.Attrs, xt)
	dy := preActivationGrad(env, n, p, vals, ct)
	wt := ir.ConvWeightType(n.Attrs, xt)
	probe := &ir.Node{Op: ir.OpConv2DGradWeight, Attrs: n.Attrs, Ins: []*ir.Value{stub("dy", ct), stub("x", xt)}, Outs: []*ir.Value{stub("dw", wt)}}
	grads := [][]float64{conv2dGradWeight(env, probe, [][]float64{dy, x})[0]}
	if n.Attrs.Bias {
		bprobe := &ir.Node{Op: ir.OpConv2DGradBias, Ins: []*ir.Value{stub("dy", ct)}}
		grads = append(grads, conv2dGradBias(env, bprobe, [][]float64{dy})[0])
	}
	return fusedUpdate(env, n, p, vals, grads)
}

// fusedUpdate applies the optimizer to each parameter with its gradient
// (the update kernels' rules) or, without a fused update, returns the
// gradients.
func fusedUpdate(env *env, n *ir.Node, p ir.BlockParts, vals map[*ir.Value][]float64, grads [][]float64) [][]float64 {
	opt := n.Attrs.Opt
	if opt == nil {
		return grads
	}
	if !env.update {
		for i, pv := range p.Params {
			env.r.FusedGrads[pv.Param] = grads[i]
		}
		return nil
	}
	per := len(opt.StateNames())
	update := sgdUpdate
	if opt.Kind != ir.SGD {
		update = adamUpdate
	}
	for i, pv := range p.Params {
		uins := [][]float64{vals[pv], grads[i]}
		for _, s := range p.State[i*per : (i+1)*per] {
			uins = append(uins, vals[s])
		}
		update(env, &ir.Node{Attrs: ir.Attrs{Opt: opt}}, uins)
	}
	return nil
}

func linearBlock(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	probe := &ir.Node{Op: ir.OpLinear, Attrs: n.Attrs, Ins: n.Ins}
	y := linear(env, probe, ins)[0]
	if n.Attrs.ReLU {
		y = relu(env, nil, [][]float64{y})[0]
	}
	return [][]float64{y}
}

func linearBlockGradInput(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	dy := preActivationGrad(env, n, p, vals, ir.Type{})
	probe := &ir.Node{Op: ir.OpLinearGradInput, Ins: []*ir.Value{p.DOut, p.W}}
	dx := linearGradInput(env, probe, [][]float64{dy, vals[p.W]})[0]
	return [][]float64{applyMaskOut(dx, p, vals)}
}

func linearBlockGradWeight(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	dy := preActivationGrad(env, n, p, vals, ir.Type{})
	wt := ir.F32Fixed(n.Attrs.Out, p.X.Type.Dims[0])
	probe := &ir.Node{Op: ir.OpLinearGradWeight, Ins: []*ir.Value{p.DOut, p.X}, Outs: []*ir.Value{stub("dw", wt)}}
	grads := [][]float64{linearGradWeight(env, probe, [][]float64{dy, vals[p.X]})[0]}
	if n.Attrs.Bias {
		bprobe := &ir.Node{Op: ir.OpLinearGradBias, Outs: []*ir.Value{stub("db", ir.F32Fixed(n.Attrs.Out))}}
		grads = append(grads, linearGradBias(env, bprobe, [][]float64{dy})[0])
	}
	return fusedUpdate(env, n, p, vals, grads)
}

func softmaxCrossEntropy(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	loss := crossEntropy(env, n, ins)[0]
	grad := crossEntropyGrad(env, n, ins)[0]
	classes := int(n.Ins[0].Type.Dims[0])
	labels := make([]int32, env.batch)
	for i := range labels {
		labels[i] = int32(ins[1][i])
	}
	correct := countCorrect(ins[0], labels, classes)
	return [][]float64{loss, grad, {float64(correct)}}
}
