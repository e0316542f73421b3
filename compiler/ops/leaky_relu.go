package ops

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// leaky_relu(x, slope=0.01): x where x > 0, else slope·x — PyTorch's
// F.leaky_relu(x, negative_slope). Its gradient reads the input, as
// PyTorch's leaky_relu_backward: dy where x > 0, else slope·dy.

var attrSlope = ir.AttrSpec{Name: "slope", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Alpha) }}

var slopeConst = func(a *ir.Attrs) []Const { return []Const{{Name: "Slope", Value: a.Alpha}} }

var LeakyReLU = activation(&Def{
	OpInfo: ir.OpInfo{Name: "leaky_relu", Attrs: []ir.AttrSpec{attrSlope}, FLOPs: flopsPerOutput(1)},
	Doc:    "x where x > 0, else slope·x",
	DSL: &DSL{
		Name: "leaky_relu", Order: 21, Tensors: 1,
		Args:  []ArgSpec{{Name: "slope", Kind: ArgFloat, Min: math.Inf(-1), Default: "0.01", Doc: "the slope for x < 0 (PyTorch's negative_slope)"}},
		Attrs: func(a Args) (ir.Attrs, error) { return ir.Attrs{Alpha: a.Float("slope", 0.01)}, nil },
		Shape: "same shape", PyTorch: "nn.LeakyReLU",
		Examples: []string{"leaky_relu(x)", "leaky_relu(x, slope=0.2)", "leaky_relu(x, slope=-0.5)"},
		Torch:    []string{"F.leaky_relu(x)", "F.leaky_relu(x, 0.2)", "F.leaky_relu(x, -0.5)"},
	},
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		return elementwiseRef(func(x float64) float64 {
			if x > 0 {
				return x
			}
			return n.Attrs.Alpha * x
		})(env, n, ins)
	},
	Kernel: Kernel{Elementwise: "leaky_relu", Consts: slopeConst},
	ONNX: &ONNX{Op: "LeakyRelu", Attrs: func(n *ir.Node) []ONNXAttr {
		return []ONNXAttr{FloatAttr("alpha", n.Attrs.Alpha)}
	}},
}, &Def{
	OpInfo: ir.OpInfo{Name: "leaky_relu_grad", Attrs: []ir.AttrSpec{attrSlope}, FLOPs: flopsPerOutput(1)},
	Doc:    "dy where x > 0, else slope·dy",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		return elementwiseGradRef(func(x float64) float64 {
			if x > 0 {
				return 1
			}
			return n.Attrs.Alpha
		})(env, n, ins)
	},
	Kernel: Kernel{Elementwise: "leaky_relu_grad", Consts: slopeConst},
}, saveInput)
