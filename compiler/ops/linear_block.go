package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// linear_block: linear + bias + activation?, the fuse pass's kernel for a
// linear layer and the pointwise activation after it, with its input
// gradient and its weight gradient (the optimizer update fused). Kernels in
// codegen/linear.go (templates/linear.cu.tmpl) and codegen/cpu/linear.go;
// the reference composes the unfused kernels.
//
// The activation is ReLU (Attrs.ReLU) or any other pointwise one (Attrs.Act,
// printed act=NAME, slope=... for leaky_relu; activation.go): y = f(z),
// z = x·Wᵀ + b, the activation's own formula. The gradients take dz =
// f'(·)·dy while they load dy, through the activation's gradient formula
// and one saved tensor s (BlockParts.Y): y where the derivative is a
// function of the output (ReLU's mask y > 0, sigmoid, tanh, leaky_relu
// with a positive slope, whose y has x's sign), else z, which the block
// then writes as a second output (Attrs.SaveAct, printed save=true; not in
// a forward-only graph). Unfused, the activation would save the same
// tensor, so the block saves no more than the pair it replaces.

var linearBlockAttrs = []ir.AttrSpec{ir.AttrOut, ir.AttrBias, ir.AttrReLU, attrFusedAct, attrFusedSlope, attrSaveAct}

// LinearSavesPre says whether a linear block with attributes a saves its
// pre-activation z for the gradient: its activation's derivative is not a
// function of its output.
func LinearSavesPre(a *ir.Attrs) bool {
	p := PointwiseOf(a.Act)
	return p != nil && !p.SaveOutput && !(a.Act == LeakyReLU && a.Alpha > 0)
}

// linearAct applies the block's activation to z.
func linearAct(env *RefEnv, n *ir.Node, z []float64) []float64 {
	if n.Attrs.ReLU {
		return reluValues(z)
	}
	if p := PointwiseOf(n.Attrs.Act); p != nil {
		return p.F(env, n, z)
	}
	return z
}

var _ = Register(ir.OpLinearBlock, &Def{
	OpInfo: ir.OpInfo{Name: "linear_block", Attrs: linearBlockAttrs, Infer: inferLinearBlock, FLOPs: flopsLinearBlock, Layout: blockLayout},
	Doc:    "a linear layer with its bias and activation, fused",
	Grad:   blockGrad(ir.OpLinearBlockGradInput, ir.OpLinearBlockGradWeight),
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		probe := &ir.Node{Op: ir.OpLinear, Attrs: n.Attrs, Ins: n.Ins}
		z := refLinear(env, probe, ins)[0]
		y := linearAct(env, n, z)
		if n.Attrs.SaveAct {
			return [][]float64{y, z}
		}
		return [][]float64{y}
	},
	Kernel: Kernel{Custom: "linear"},
})

var _ = Register(ir.OpLinearBlockGradInput, &Def{
	OpInfo: ir.OpInfo{Name: "linear_block_grad_input", Attrs: ir.AttrList(linearBlockAttrs, ir.AttrMasked, ir.AttrMaskOut),
		Infer: inferLinearBlockGradInput, FLOPs: flopsLinearBlockGrad, Layout: gradInputLayout, GradInput: true, InPlace: maskOutInput},
	Doc:    "a linear block's input gradient, through its activation, with the ReLU mask of the block before it (maskout)",
	NoGrad: "a gradient op",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		p, vals := partsValues(n, ins)
		dy := preActivationGrad(env, n, p, vals, ir.Type{})
		probe := &ir.Node{Op: ir.OpLinearGradInput, Ins: []*ir.Value{p.DOut, p.W}}
		dx := refLinearGradInput(env, probe, [][]float64{dy, vals[p.W]})[0]
		return [][]float64{applyMaskOut(dx, p, vals)}
	},
	Kernel: Kernel{Custom: "linear"},
})

var _ = Register(ir.OpLinearBlockGradWeight, &Def{
	OpInfo: ir.OpInfo{Name: "linear_block_grad_weight", Attrs: ir.AttrList(linearBlockAttrs, ir.AttrMasked, ir.AttrOpt),
		Infer: inferLinearBlockGradWeight, FLOPs: flopsLinearBlockGrad, Layout: gradWeightLayout},
	Doc:    "a linear block's weight and bias gradients, with the optimizer update fused",
	NoGrad: "a gradient op",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		p, vals := partsValues(n, ins)
		dy := preActivationGrad(env, n, p, vals, ir.Type{})
		wt := ir.F32Fixed(n.Attrs.Out, p.X.Type.Dims[0])
		probe := &ir.Node{Op: ir.OpLinearGradWeight, Ins: []*ir.Value{p.DOut, p.X}, Outs: []*ir.Value{stub("dw", wt)}}
		grads := [][]float64{refLinearGradWeight(env, probe, [][]float64{dy, vals[p.X]})[0]}
		if n.Attrs.Bias {
			bprobe := &ir.Node{Op: ir.OpLinearGradBias, Outs: []*ir.Value{stub("db", ir.F32Fixed(n.Attrs.Out))}}
			grads = append(grads, refLinearGradBias(env, bprobe, [][]float64{dy})[0])
		}
		return fusedUpdate(env, n, p, vals, grads)
	},
	Kernel: Kernel{Custom: "linear"},
})

func inferLinearBlock(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	probe := &ir.Node{Op: ir.OpLinear, Attrs: n.Attrs, Ins: []*ir.Value{p.X, p.W}}
	if p.B != nil {
		probe.Ins = append(probe.Ins, p.B)
	}
	ts, err := inferLinear(probe)
	if err != nil || !n.Attrs.SaveAct {
		return ts, err
	}
	if !LinearSavesPre(&n.Attrs) {
		return nil, fmt.Errorf("%s: save=true needs an activation whose gradient reads its input", n.Op)
	}
	return []ir.Type{ts[0], ts[0]}, nil
}

func inferLinearBlockGradInput(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	w := p.W.Type
	if len(w.Dims) != 2 {
		return nil, fmt.Errorf("%s: weight %s is %s", n.Op, p.W.Name, w)
	}
	out := ir.F32Batched(w.Dims[0])
	if err := checkBackwardParts(n, p, []ir.Type{out}); err != nil {
		return nil, err
	}
	x := ir.F32Batched(w.Dims[1])
	if p.XMask != nil && !p.XMask.Type.Equal(x) {
		return nil, fmt.Errorf("%s: mask input %s is %s, want %s", n.Op, p.XMask.Name, p.XMask.Type, x)
	}
	return []ir.Type{x}, nil
}

func inferLinearBlockGradWeight(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	x := p.X.Type
	if x.DType != ir.F32 || len(x.Dims) != 1 {
		return nil, fmt.Errorf("%s needs a [B,features] input, got %s", n.Op, x)
	}
	if err := checkBackwardParts(n, p, []ir.Type{ir.F32Batched(n.Attrs.Out)}); err != nil {
		return nil, err
	}
	return gradWeightOuts(n, p, ir.F32Fixed(n.Attrs.Out, x.Dims[0]))
}

func flopsLinearBlock(n *ir.Node) int64 {
	p, _ := n.Parts()
	w := p.W.Type
	f := ir.MulSat(2, w.Dims[0], w.Dims[1])
	if n.Attrs.Bias {
		f = ir.AddSat(f, w.Dims[0])
	}
	if n.Attrs.ReLU || n.Attrs.Act != 0 {
		f = ir.AddSat(f, w.Dims[0])
	}
	return f
}

func flopsLinearBlockGrad(n *ir.Node) int64 {
	p, _ := n.Parts()
	if n.Op.Info().GradInput {
		return ir.MulSat(2, p.W.Type.SampleElems())
	}
	return ir.MulSat(2, n.Attrs.Out, p.X.Type.Dims[0])
}
