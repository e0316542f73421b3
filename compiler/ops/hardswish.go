package ops

import (
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// hardswish(x) = x·min(max(x+3, 0), 6)/6, F.hardswish (MobileNetV3); its
// gradient reads the input, as PyTorch's hardswish_backward: 0 below -3,
// dy·(x/3 + 1/2) up to 3 (inclusive), dy above. ONNX opset 13 has no
// HardSwish: it is exported as Mul(x, HardSigmoid(x, alpha=1/6, beta=1/2)).

var HardSwish = activation(&Def{
	OpInfo: ir.OpInfo{Name: "hardswish", FLOPs: flopsPerOutput(4)},
	Doc:    "x·min(max(x+3, 0), 6)/6",
	DSL: &DSL{
		Name: "hardswish", Order: 26, Tensors: 1,
		Shape: "same shape", PyTorch: "nn.Hardswish",
		Examples:  []string{"hardswish(x)"},
		Torch:     []string{"F.hardswish(x)"},
		TestScale: 5, // inputs in [-5,5): every piece of the function
	},
	Ref: elementwiseRef(func(x float64) float64 {
		return x * math.Min(math.Max(x+3, 0), 6) / 6
	}),
	Kernel: Kernel{Elementwise: "hardswish"},
	ONNX: &ONNX{Emit: func(e ONNXEmitter, n *ir.Node) error {
		x := e.Name(n.Ins[0])
		s := e.Temp(n.Name+".hardsigmoid", n.Ins[0].Type.Dims)
		e.Node("HardSigmoid", []string{x}, []string{s}, FloatAttr("alpha", 1.0/6), FloatAttr("beta", 0.5))
		e.Node("Mul", []string{x, s}, []string{e.Output(n.Out())})
		return nil
	}},
}, &Def{
	OpInfo: ir.OpInfo{Name: "hardswish_grad", FLOPs: flopsPerOutput(3)},
	Doc:    "0 below -3, dy·(x/3 + 1/2) up to 3, dy above",
	Ref: elementwiseGradRef(func(x float64) float64 {
		switch {
		case x < -3:
			return 0
		case x <= 3:
			return x/3 + 0.5
		}
		return 1
	}),
	Kernel: Kernel{Elementwise: "hardswish_grad"},
}, saveInput)
