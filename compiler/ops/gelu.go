package ops

import (
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// gelu(x) = x·Φ(x) = x·(1+erf(x/√2))/2, PyTorch's F.gelu in its default
// exact (erf) form; its gradient reads the input, as PyTorch's
// gelu_backward: dy·(Φ(x) + x·φ(x)), φ(x) = exp(-x²/2)/√(2π). ONNX opset
// 13 has no Gelu: it is exported as that formula over Erf.

var GELU = activation(&Def{
	OpInfo: ir.OpInfo{Name: "gelu", FLOPs: flopsPerOutput(8)},
	Doc:    "x·Φ(x), Φ the standard normal distribution function (the erf form)",
	DSL: &DSL{
		Name: "gelu", Order: 24, Tensors: 1,
		Shape: "same shape", PyTorch: "nn.GELU",
		Examples: []string{"gelu(x)"},
		Torch:    []string{"F.gelu(x)"},
	},
	Ref:    elementwiseRef(func(x float64) float64 { return x * normalCDF(x) }),
	Kernel: Kernel{Elementwise: "gelu"},
	ONNX: &ONNX{Emit: func(e ONNXEmitter, n *ir.Node) error {
		x, dims := e.Name(n.Ins[0]), n.Ins[0].Type.Dims
		s := e.Temp(n.Name+".scaled", dims)
		e.Node("Mul", []string{x, e.Const(n.Name+".rsqrt2", nil, []float32{float32(1 / math.Sqrt2)})}, []string{s})
		erf := e.Temp(n.Name+".erf", dims)
		e.Node("Erf", []string{s}, []string{erf})
		one := e.Temp(n.Name+".erf1", dims)
		e.Node("Add", []string{erf, e.Const(n.Name+".one", nil, []float32{1})}, []string{one})
		half := e.Temp(n.Name+".halfx", dims)
		e.Node("Mul", []string{x, e.Const(n.Name+".half", nil, []float32{0.5})}, []string{half})
		e.Node("Mul", []string{half, one}, []string{e.Output(n.Out())})
		return nil
	}},
}, &Def{
	OpInfo: ir.OpInfo{Name: "gelu_grad", FLOPs: flopsPerOutput(10)},
	Doc:    "dy·(Φ(x) + x·φ(x))",
	Ref: elementwiseGradRef(func(x float64) float64 {
		return normalCDF(x) + x*math.Exp(-0.5*x*x)/math.Sqrt(2*math.Pi)
	}),
	Kernel: Kernel{Elementwise: "gelu_grad"},
}, saveInput)

// normalCDF is Φ(x) = (1+erf(x/√2))/2.
func normalCDF(x float64) float64 { return 0.5 * (1 + math.Erf(x/math.Sqrt2)) }
