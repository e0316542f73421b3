package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// linear: y = x·Wᵀ + b, nn.Linear (in_features inferred), and its
// gradients. The fuse pass turns it (with a ReLU after it) into a
// linear_block, whose kernels run it.

var _ = Register(ir.OpLinear, &Def{
	OpInfo: ir.OpInfo{
		Name: "linear", Attrs: []ir.AttrSpec{ir.AttrOut}, Infer: inferLinear, FLOPs: flopsLinear,
		ParamTypes: linearParamTypes,
	},
	Doc: "fully connected layer",
	DSL: &DSL{
		Name: "linear", Order: 60, Tensors: 1,
		Args: []ArgSpec{
			{Name: "out", Kind: ArgInt, Required: true, Min: 1, MaxInt: MaxOutFeatures, MaxWhy: outWhy, Doc: "output features"},
			{Name: "in", Kind: ArgInt, Min: 1, Note: "checked against the input when given", Doc: "input features"},
			{Name: "bias", Kind: ArgBool, Default: "true", Doc: "learn a bias"},
		},
		Attrs:    func(a Args) (ir.Attrs, error) { return ir.Attrs{Out: a.Int("out", 0), In: a.Int("in", 0)}, nil },
		Params:   weightAndBias,
		Shape:    "`[F]` -> `[out]`",
		ParamDoc: "`weight [out,F]`, `bias [out]`",
		PyTorch:  "nn.Linear",
		Examples: []string{"linear(x, out=5)", "linear(x, out=4, bias=false)"},
		Torch:    []string{"F.linear(x, weight, bias)", "F.linear(x, weight)"},
		Features: true,
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
		x, w := n.Ins[0], n.Ins[1]
		gs := make([]*ir.Value, len(n.Ins))
		if need[0] {
			gs[0] = b.Emit(ir.OpLinearGradInput, n, ir.Attrs{}, x, dy, w)
		}
		gs[1] = b.Emit(ir.OpLinearGradWeight, n, ir.Attrs{}, w, dy, x)
		if len(n.Ins) > 2 {
			gs[2] = b.Emit(ir.OpLinearGradBias, n, ir.Attrs{}, n.Ins[2], dy)
		}
		return gs
	},
	Ref:    refLinear,
	Kernel: Kernel{ReplacedBy: "linear_block"},
	// y = x Wᵀ + b with W [out,in] as nn.Linear stores it
	ONNX: &ONNX{Op: "Gemm", Attrs: func(*ir.Node) []ONNXAttr { return []ONNXAttr{IntAttr("transB", 1)} }},
})

var _ = Register(ir.OpLinearGradInput, &Def{
	OpInfo: ir.OpInfo{Name: "linear_grad_input", Infer: inferLinearGradInput,
		FLOPs: func(n *ir.Node) int64 { return ir.MulSat(2, n.Ins[1].Type.SampleElems()) }},
	Doc:    "the gradient of a linear layer's input: dy·W",
	NoGrad: "a gradient op",
	Ref:    refLinearGradInput,
	Kernel: Kernel{ReplacedBy: "linear_block_grad_input"},
})

var _ = Register(ir.OpLinearGradWeight, &Def{
	OpInfo: ir.OpInfo{Name: "linear_grad_weight", Infer: inferLinearGradWeight,
		FLOPs: func(n *ir.Node) int64 { return ir.MulSat(2, n.Outs[0].Type.SampleElems()) }},
	Doc:    "the gradient of a linear layer's weight: dyᵀ·x",
	NoGrad: "a gradient op",
	Ref:    refLinearGradWeight,
	Kernel: Kernel{ReplacedBy: "linear_block_grad_weight"},
})

var _ = Register(ir.OpLinearGradBias, &Def{
	OpInfo: ir.OpInfo{Name: "linear_grad_bias", Infer: inferLinearGradBias, FLOPs: flopsInput0},
	Doc:    "the gradient of a linear layer's bias: dy summed over the batch",
	NoGrad: "a gradient op",
	Ref:    refLinearGradBias,
	Kernel: Kernel{ReplacedBy: "linear_block_grad_weight"},
})

func linearParamTypes(n *ir.Node) (map[string]ir.Type, int64, bool) {
	x := n.Ins[0].Type
	if x.DType != ir.F32 || len(x.Dims) != 1 || (n.Attrs.In != 0 && n.Attrs.In != x.Dims[0]) {
		return nil, 0, false
	}
	return map[string]ir.Type{"weight": ir.F32Fixed(n.Attrs.Out, x.Dims[0]), "bias": ir.F32Fixed(n.Attrs.Out)}, x.Dims[0], true
}

func inferLinear(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 1, "[B,features]"); err != nil {
		if x.DType == ir.F32 && x.Batched && len(x.Dims) > 1 {
			return nil, fmt.Errorf("linear needs [B,features], but %s is %s: flatten it first", n.Ins[0].Name, x)
		}
		return nil, err
	}
	if n.Attrs.In != 0 && n.Attrs.In != x.Dims[0] {
		return nil, fmt.Errorf("linear expects %d input features (in=%d) but %s gives %d", n.Attrs.In, n.Attrs.In, n.Ins[0].Name, x.Dims[0])
	}
	if w, want := in(n, 1), ir.F32Fixed(n.Attrs.Out, x.Dims[0]); !w.Equal(want) {
		return nil, fmt.Errorf("linear weight %s is %s, want %s", n.Ins[1].Name, w, want)
	}
	if len(n.Ins) > 2 && !in(n, 2).Equal(ir.F32Fixed(n.Attrs.Out)) {
		return nil, fmt.Errorf("linear bias %s is %s, want f32[%d]", n.Ins[2].Name, in(n, 2), n.Attrs.Out)
	}
	return one(ir.F32Batched(n.Attrs.Out))
}

func inferLinearGradInput(n *ir.Node) ([]ir.Type, error) {
	dy, w := in(n, 0), in(n, 1)
	if err := needRank(n, 0, dy, 1, "[B,features]"); err != nil {
		return nil, err
	}
	if len(w.Dims) != 2 || w.Dims[0] != dy.Dims[0] {
		return nil, fmt.Errorf("linear_grad_input: weight %s %s does not match gradient %s", n.Ins[1].Name, w, dy)
	}
	return []ir.Type{ir.F32Batched(w.Dims[1])}, nil
}

func inferLinearGradWeight(n *ir.Node) ([]ir.Type, error) {
	dy, x := in(n, 0), in(n, 1)
	if err := needRank(n, 0, dy, 1, "[B,features]"); err != nil {
		return nil, err
	}
	if err := needRank(n, 1, x, 1, "[B,features]"); err != nil {
		return nil, err
	}
	return []ir.Type{ir.F32Fixed(dy.Dims[0], x.Dims[0])}, nil
}

func inferLinearGradBias(n *ir.Node) ([]ir.Type, error) {
	dy := in(n, 0)
	if err := needRank(n, 0, dy, 1, "[B,features]"); err != nil {
		return nil, err
	}
	return []ir.Type{ir.F32Fixed(dy.Dims[0])}, nil
}

func flopsLinear(n *ir.Node) int64 {
	w := n.Ins[1].Type
	f := ir.MulSat(2, w.Dims[0], w.Dims[1])
	if len(n.Ins) > 2 {
		f = ir.AddSat(f, w.Dims[0])
	}
	return f
}

func refLinear(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	x, w := ins[0], ins[1]
	out, in := int(n.Attrs.Out), int(n.Ins[1].Type.Dims[1])
	y := make([]float64, env.Batch*out)
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < out; o++ {
			s := 0.0
			if len(ins) > 2 {
				s = ins[2][o]
			}
			for i := 0; i < in; i++ {
				s += x[b*in+i] * w[o*in+i]
			}
			y[b*out+o] = s
		}
	}
	return [][]float64{y}
}

func refLinearGradInput(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	dy, w := ins[0], ins[1]
	out, in := int(n.Ins[1].Type.Dims[0]), int(n.Ins[1].Type.Dims[1])
	dx := make([]float64, env.Batch*in)
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < out; o++ {
			d := dy[b*out+o]
			for i := 0; i < in; i++ {
				dx[b*in+i] += d * w[o*in+i]
			}
		}
	}
	return [][]float64{dx}
}

func refLinearGradWeight(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	dy, x := ins[0], ins[1]
	out, in := int(n.Out().Type.Dims[0]), int(n.Out().Type.Dims[1])
	dw := make([]float64, out*in)
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < out; o++ {
			d := dy[b*out+o]
			for i := 0; i < in; i++ {
				dw[o*in+i] += d * x[b*in+i]
			}
		}
	}
	return [][]float64{dw}
}

func refLinearGradBias(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	out := int(n.Out().Type.Dims[0])
	db := make([]float64, out)
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < out; o++ {
			db[o] += ins[0][b*out+o]
		}
	}
	return [][]float64{db}
}
