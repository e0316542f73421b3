package ops

import (
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// tanh(x), torch.tanh; its gradient reads the output, as PyTorch's
// tanh_backward: dy·(1-y²).

var Tanh = activation(&Def{
	OpInfo: ir.OpInfo{Name: "tanh", FLOPs: flopsPerOutput(4)},
	Doc:    "the hyperbolic tangent",
	DSL: &DSL{
		Name: "tanh", Order: 23, Tensors: 1,
		Shape: "same shape", PyTorch: "nn.Tanh",
		Examples: []string{"tanh(x)"},
		Torch:    []string{"torch.tanh(x)"},
	},
	Ref:    elementwiseRef(math.Tanh),
	Kernel: Kernel{Elementwise: "tanh"},
	ONNX:   &ONNX{Op: "Tanh"},
}, &Def{
	OpInfo: ir.OpInfo{Name: "tanh_grad", FLOPs: flopsPerOutput(3)},
	Doc:    "dy·(1-y²), y the tanh's output",
	Ref:    elementwiseGradRef(func(y float64) float64 { return 1 - y*y }),
	Kernel: Kernel{Elementwise: "tanh_grad"},
}, saveOutput)
