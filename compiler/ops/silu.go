package ops

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// silu(x) = x·sigmoid(x), F.silu (swish); its gradient reads the input, as
// PyTorch's silu_backward: dy·s·(1 + x·(1-s)), s = sigmoid(x). ONNX opset
// 13 has no SiLU: it is exported as Mul(x, Sigmoid(x)).

var SiLU = activation(&Def{
	OpInfo: ir.OpInfo{Name: "silu", FLOPs: flopsPerOutput(5)},
	Doc:    "x·sigmoid(x)",
	DSL: &DSL{
		Name: "silu", Order: 25, Tensors: 1,
		Shape: "same shape", PyTorch: "nn.SiLU",
		Examples: []string{"silu(x)"},
		Torch:    []string{"F.silu(x)"},
	},
	Ref:    elementwiseRef(func(x float64) float64 { return x * sigmoid(x) }),
	Kernel: Kernel{Elementwise: "silu"},
	ONNX: &ONNX{Emit: func(e ONNXEmitter, n *ir.Node) error {
		x := e.Name(n.Ins[0])
		s := e.Temp(n.Name+".sigmoid", n.Ins[0].Type.Dims)
		e.Node("Sigmoid", []string{x}, []string{s})
		e.Node("Mul", []string{x, s}, []string{e.Output(n.Out())})
		return nil
	}},
}, &Def{
	OpInfo: ir.OpInfo{Name: "silu_grad", FLOPs: flopsPerOutput(8)},
	Doc:    "dy·s·(1 + x·(1-s)), s = sigmoid(x)",
	Ref: elementwiseGradRef(func(x float64) float64 {
		s := sigmoid(x)
		return s * (1 + x*(1-s))
	}),
	Kernel: Kernel{Elementwise: "silu_grad"},
}, saveInput)
