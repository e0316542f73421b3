package ops

import (
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// sigmoid(x) = 1/(1+exp(-x)), torch.sigmoid; its gradient reads the
// output, as PyTorch's sigmoid_backward: dy·y·(1-y).

var Sigmoid = activation(&Def{
	OpInfo: ir.OpInfo{Name: "sigmoid", FLOPs: flopsPerOutput(4)},
	Doc:    "1/(1+exp(-x))",
	DSL: &DSL{
		Name: "sigmoid", Order: 22, Tensors: 1,
		Shape: "same shape", PyTorch: "nn.Sigmoid",
		Examples: []string{"sigmoid(x)"},
		Torch:    []string{"torch.sigmoid(x)"},
	},
	Ref:    elementwiseRef(sigmoid),
	Kernel: Kernel{Elementwise: "sigmoid"},
	ONNX:   &ONNX{Op: "Sigmoid"},
}, &Def{
	OpInfo: ir.OpInfo{Name: "sigmoid_grad", FLOPs: flopsPerOutput(3)},
	Doc:    "dy·y·(1-y), y the sigmoid's output",
	Ref:    elementwiseGradRef(func(y float64) float64 { return y * (1 - y) }),
	Kernel: Kernel{Elementwise: "sigmoid_grad"},
}, saveOutput)

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
