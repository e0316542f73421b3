package ir

import "fmt"

// Fused ops: what the compiler's fuse pass turns the unfused training graph
// into, one op per generated kernel family. Their inputs follow fixed
// layouts, decoded in one place by Parts:
//
//	to_tensor(u8 image [H,W,C])                          -> f32 [C,H,W] (/255, HWC -> CHW)
//	conv2d_block(x, w, b?)                               -> y, argmax?   conv + bias + relu? + maxpool?
//	conv2d_block_grad_input(dOut, w, argmax?, y?, xmask?) -> dX
//	conv2d_block_grad_weight(dOut, x, argmax?, y?, [w, b?, state...]) -> dW, dB? (nothing when the update is fused)
//	linear_block(x, w, b?)                               -> y            linear + bias + relu?
//	linear_block_grad_input(dOut, w, y?, xmask?)         -> dX
//	linear_block_grad_weight(dOut, x, y?, [w, b?, state...]) -> dW, dB? (nothing when fused)
//	softmax_cross_entropy(logits, label)                 -> loss, dlogits, correct
//
// argmax is present iff the block has a pool epilogue; y (the block's saved
// output, for the ReLU mask) iff relu && !masked; xmask (the block input,
// whose producer's ReLU mask is applied to dX) iff maskout. The gradient of
// a block output (dOut) is at the block's output resolution: a pooled
// block's backward kernels route it through the argmax on the fly, so the
// full-resolution conv gradient never exists in memory.

// BlockParts names the inputs of a fused node.
type BlockParts struct {
	X, DOut, W, B, Argmax, Y, XMask *Value
	// Params and State are the fused update's inputs (Opt != nil): the
	// parameters, then each parameter's optimizer state in order.
	Params, State []*Value
}

// Parts decodes a fused node's inputs.
func (n *Node) Parts() (BlockParts, error) {
	var p BlockParts
	a := n.Attrs
	i := 0
	next := func() *Value {
		if i >= len(n.Ins) {
			return nil
		}
		i++
		return n.Ins[i-1]
	}
	switch n.Op {
	case OpConvBlock, OpLinearBlock:
		p.X, p.W = next(), next()
		if a.Bias {
			p.B = next()
		}
	case OpConvBlockGradInput, OpLinearBlockGradInput:
		p.DOut, p.W = next(), next()
		if a.Pool != nil {
			p.Argmax = next()
		}
		if a.ReLU && !a.DOutMasked {
			p.Y = next()
		}
		if a.MaskOut {
			p.XMask = next()
		}
	case OpConvBlockGradWeight, OpLinearBlockGradWeight:
		p.DOut, p.X = next(), next()
		if a.Pool != nil {
			p.Argmax = next()
		}
		if a.ReLU && !a.DOutMasked {
			p.Y = next()
		}
		if a.Opt != nil {
			np := 1
			if a.Bias {
				np = 2
			}
			for k := 0; k < np; k++ {
				p.Params = append(p.Params, next())
			}
			for k := 0; k < np*len(a.Opt.StateNames()); k++ {
				p.State = append(p.State, next())
			}
		}
	default:
		return p, fmt.Errorf("%s is not a fused block", n.Op)
	}
	if i != len(n.Ins) {
		return p, fmt.Errorf("%s: %d inputs, the layout takes %d", n.Op, len(n.Ins), i)
	}
	return p, nil
}

// UpdatedParams lists the parameters n updates in place: those of an
// update op, or of a weight-gradient block with its update fused.
func (n *Node) UpdatedParams() []*Param {
	switch {
	case n.Op == OpSGDUpdate || n.Op == OpAdamUpdate:
		return []*Param{n.Ins[0].Param}
	case n.Attrs.Opt != nil:
		p, err := n.Parts()
		if err != nil {
			return nil
		}
		var out []*Param
		for _, v := range p.Params {
			out = append(out, v.Param)
		}
		return out
	}
	return nil
}

func registerFusedOps() {
	conv := []string{AttrOut, AttrKernel, AttrStride, AttrPad, AttrBias, AttrReLU, AttrPool}
	grad := append(conv[:len(conv):len(conv)], AttrMasked, AttrMaskOut, AttrDims)
	gradW := append(conv[:len(conv):len(conv)], AttrMasked, AttrOpt)
	lin := []string{AttrOut, AttrBias, AttrReLU}
	opTable[OpToTensor] = OpInfo{"to_tensor", nil, inferToTensor, flopsPerOutput(1)}
	opTable[OpConvBlock] = OpInfo{"conv2d_block", conv, inferConvBlock, flopsConvBlock}
	opTable[OpConvBlockGradInput] = OpInfo{"conv2d_block_grad_input", grad, inferConvBlockGradInput, flopsConvBlockGradInput}
	opTable[OpConvBlockGradWeight] = OpInfo{"conv2d_block_grad_weight", gradW, inferConvBlockGradWeight, flopsConvBlockGradWeight}
	opTable[OpLinearBlock] = OpInfo{"linear_block", lin, inferLinearBlock, flopsLinearBlock}
	opTable[OpLinearBlockGradInput] = OpInfo{"linear_block_grad_input", append(lin[:len(lin):len(lin)], AttrMasked, AttrMaskOut), inferLinearBlockGradInput, flopsLinearBlockGrad}
	opTable[OpLinearBlockGradWeight] = OpInfo{"linear_block_grad_weight", append(lin[:len(lin):len(lin)], AttrMasked, AttrOpt), inferLinearBlockGradWeight, flopsLinearBlockGrad}
	opTable[OpSoftmaxCrossEntropy] = OpInfo{"softmax_cross_entropy", []string{AttrSmoothing}, inferSoftmaxCE, flopsCrossEntropy}
}

// ImageU8Type is how images arrive on the device: decoded uint8 HWC.
func ImageU8Type(chw Type) Type {
	return Type{DType: U8, Batched: true, Dims: []int64{chw.Dims[1], chw.Dims[2], chw.Dims[0]}}
}

func inferToTensor(n *Node) ([]Type, error) {
	x := in(n, 0)
	if x.DType != U8 || len(x.Dims) != 3 || !x.Batched {
		return nil, fmt.Errorf("to_tensor needs u8[B,H,W,C], got %s", x)
	}
	return []Type{F32Batched(x.Dims[2], x.Dims[0], x.Dims[1])}, nil
}

// blockInput returns the f32 [C,H,W] view of a conv block's input (u8 HWC
// images are converted inside the conv's loads).
func blockInput(x Type) Type {
	if x.DType == U8 && len(x.Dims) == 3 {
		return F32Batched(x.Dims[2], x.Dims[0], x.Dims[1])
	}
	return x
}

// convBlockShapes gives the conv output (pre-pool) and the block output.
func convBlockShapes(n *Node, x Type, w *Value, b *Value) (conv Type, out []Type, err error) {
	probe := &Node{Op: OpConv2D, Name: n.Name, Attrs: n.Attrs, Ins: []*Value{{Name: "x", Type: blockInput(x)}, w}}
	if b != nil {
		probe.Ins = append(probe.Ins, b)
	}
	ts, err := inferConv2D(probe)
	if err != nil {
		return Type{}, nil, err
	}
	conv = ts[0]
	if n.Attrs.Pool == nil {
		return conv, []Type{conv}, nil
	}
	pw := n.Attrs.Pool
	pool := &Node{Op: OpMaxPool2D, Attrs: Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad}, Ins: []*Value{{Name: n.Name, Type: conv}}}
	ps, err := inferPool(pool)
	if err != nil {
		return Type{}, nil, err
	}
	am := ArgmaxType(pw.Kernel[0]*pw.Kernel[1], ps[0].Dims...)
	return conv, []Type{ps[0], am}, nil
}

func inferConvBlock(n *Node) ([]Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	_, outs, err := convBlockShapes(n, p.X.Type, p.W, p.B)
	return outs, err
}

// checkBackwardParts checks dOut, argmax and y against the block output types.
func checkBackwardParts(n *Node, p BlockParts, outs []Type) error {
	if !p.DOut.Type.Equal(outs[0]) {
		return fmt.Errorf("%s: gradient %s is %s, want %s", n.Op, p.DOut.Name, p.DOut.Type, outs[0])
	}
	if p.Argmax != nil && !p.Argmax.Type.Equal(outs[1]) {
		return fmt.Errorf("%s: argmax %s is %s, want %s", n.Op, p.Argmax.Name, p.Argmax.Type, outs[1])
	}
	if p.Y != nil && !p.Y.Type.Equal(outs[0]) {
		return fmt.Errorf("%s: saved output %s is %s, want %s", n.Op, p.Y.Name, p.Y.Type, outs[0])
	}
	return nil
}

func inferConvBlockGradInput(n *Node) ([]Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("%s needs dims=[C,H,W]", n.Op)
	}
	x := F32Batched(n.Attrs.Dims...)
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
	return []Type{x}, nil
}

func inferConvBlockGradWeight(n *Node) ([]Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	x := blockInput(p.X.Type)
	if x.DType != F32 || len(x.Dims) != 3 {
		return nil, fmt.Errorf("%s needs a [B,C,H,W] input, got %s", n.Op, p.X.Type)
	}
	wt := ConvWeightType(n.Attrs, x)
	_, outs, err := convBlockShapes(n, p.X.Type, &Value{Name: "w", Type: wt}, nil)
	if err != nil {
		return nil, err
	}
	if err := checkBackwardParts(n, p, outs); err != nil {
		return nil, err
	}
	return gradWeightOuts(n, p, wt)
}

// gradWeightOuts: the gradients, or nothing when the update is fused (then
// the parameters and their state must have the weight and bias types).
func gradWeightOuts(n *Node, p BlockParts, wt Type) ([]Type, error) {
	want := []Type{wt}
	if n.Attrs.Bias {
		want = append(want, F32Fixed(wt.Dims[0]))
	}
	if n.Attrs.Opt == nil {
		return want, nil
	}
	for i, v := range p.Params {
		if v.Role != RoleParam || !v.Type.Equal(want[i]) {
			return nil, fmt.Errorf("%s: fused update of %s (%s), want a %s parameter", n.Op, v.Name, v.Type, want[i])
		}
	}
	per := len(n.Attrs.Opt.StateNames())
	for i, v := range p.State {
		if v.Role != RoleOptState || v.Param != p.Params[i/per].Param {
			return nil, fmt.Errorf("%s: %s is not optimizer state of %s", n.Op, v.Name, p.Params[i/per].Name)
		}
	}
	return nil, nil
}

func inferLinearBlock(n *Node) ([]Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	probe := &Node{Op: OpLinear, Attrs: n.Attrs, Ins: []*Value{p.X, p.W}}
	if p.B != nil {
		probe.Ins = append(probe.Ins, p.B)
	}
	return inferLinear(probe)
}

func inferLinearBlockGradInput(n *Node) ([]Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	w := p.W.Type
	if len(w.Dims) != 2 {
		return nil, fmt.Errorf("%s: weight %s is %s", n.Op, p.W.Name, w)
	}
	out := F32Batched(w.Dims[0])
	if err := checkBackwardParts(n, p, []Type{out}); err != nil {
		return nil, err
	}
	x := F32Batched(w.Dims[1])
	if p.XMask != nil && !p.XMask.Type.Equal(x) {
		return nil, fmt.Errorf("%s: mask input %s is %s, want %s", n.Op, p.XMask.Name, p.XMask.Type, x)
	}
	return []Type{x}, nil
}

func inferLinearBlockGradWeight(n *Node) ([]Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	x := p.X.Type
	if x.DType != F32 || len(x.Dims) != 1 {
		return nil, fmt.Errorf("%s needs a [B,features] input, got %s", n.Op, x)
	}
	if err := checkBackwardParts(n, p, []Type{F32Batched(n.Attrs.Out)}); err != nil {
		return nil, err
	}
	return gradWeightOuts(n, p, F32Fixed(n.Attrs.Out, x.Dims[0]))
}

func inferSoftmaxCE(n *Node) ([]Type, error) {
	if err := checkLogitsLabel(n); err != nil {
		return nil, err
	}
	return []Type{F32Fixed(), in(n, 0), F32Fixed()}, nil
}

// FLOPs of fused ops: the sum of what they fuse.

func convBlockFLOPs(n *Node, outElems, convElems int64, cin int64) int64 {
	f := MulSat(2, convElems, cin, n.Attrs.Kernel[0], n.Attrs.Kernel[1])
	if n.Attrs.Bias {
		f = AddSat(f, convElems)
	}
	if n.Attrs.ReLU {
		f = AddSat(f, convElems)
	}
	if pw := n.Attrs.Pool; pw != nil {
		f = AddSat(f, MulSat(outElems, pw.Kernel[0], pw.Kernel[1]))
	}
	return f
}

func flopsConvBlock(n *Node) int64 {
	p, _ := n.Parts()
	conv, _, err := convBlockShapes(n, p.X.Type, p.W, p.B)
	if err != nil {
		return 0
	}
	return convBlockFLOPs(n, n.Outs[0].Type.SampleElems(), conv.SampleElems(), blockInput(p.X.Type).Dims[0])
}

func flopsConvBlockGradInput(n *Node) int64 {
	p, _ := n.Parts()
	x := F32Batched(n.Attrs.Dims...)
	conv, _, err := convBlockShapes(n, x, p.W, nil)
	if err != nil {
		return 0
	}
	return MulSat(2, conv.SampleElems(), x.Dims[0], n.Attrs.Kernel[0], n.Attrs.Kernel[1])
}

func flopsConvBlockGradWeight(n *Node) int64 {
	p, _ := n.Parts()
	x := blockInput(p.X.Type)
	wt := ConvWeightType(n.Attrs, x)
	conv, _, err := convBlockShapes(n, p.X.Type, &Value{Type: wt}, nil)
	if err != nil {
		return 0
	}
	f := MulSat(2, conv.SampleElems(), x.Dims[0], n.Attrs.Kernel[0], n.Attrs.Kernel[1])
	if n.Attrs.Bias {
		f = AddSat(f, conv.SampleElems())
	}
	return f
}

func flopsLinearBlock(n *Node) int64 {
	p, _ := n.Parts()
	w := p.W.Type
	f := MulSat(2, w.Dims[0], w.Dims[1])
	if n.Attrs.Bias {
		f = AddSat(f, w.Dims[0])
	}
	if n.Attrs.ReLU {
		f = AddSat(f, w.Dims[0])
	}
	return f
}

func flopsLinearBlockGrad(n *Node) int64 {
	p, _ := n.Parts()
	if n.Op == OpLinearBlockGradInput {
		return MulSat(2, p.W.Type.SampleElems())
	}
	return MulSat(2, n.Attrs.Out, p.X.Type.Dims[0])
}
