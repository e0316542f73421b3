package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// add: the elementwise sum of two tensors of one shape (residual
// connections); its gradient is dy for both. Autodiff also uses it to sum
// the gradients of a value read by several layers.

var _ = Register(ir.OpAdd, &Def{
	OpInfo: ir.OpInfo{Name: "add", Infer: inferAdd, FLOPs: flopsPerOutput(1), InPlace: inPlaceAll},
	Doc:    "elementwise sum of two tensors of one shape",
	DSL: &DSL{
		Name: "add", Order: 80, Tensors: 2,
		Shape: "two tensors of one shape -> that shape", PyTorch: "`a + b`",
		Examples: []string{"add(x, y)"},
		Torch:    []string{"x + y"},
	},
	Grad: passThrough,
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		y := make([]float64, len(ins[0]))
		for i := range y {
			y[i] = ins[0][i] + ins[1][i]
		}
		return [][]float64{y}
	},
	Kernel: Kernel{Elementwise: "add"},
	ONNX:   &ONNX{Op: "Add"},
})

func inferAdd(n *ir.Node) ([]ir.Type, error) {
	a, b := in(n, 0), in(n, 1)
	if !a.Equal(b) || a.DType != ir.F32 {
		return nil, fmt.Errorf("add needs two float tensors of one shape, but %s is %s and %s is %s", n.Ins[0].Name, a, n.Ins[1].Name, b)
	}
	return []ir.Type{a}, nil
}
