package ops

import (
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// relu: max(x, 0), nn.ReLU. Its gradient reads the mask from the output,
// y > 0, as PyTorch does; when a conv or linear block is its only reader,
// that block's input gradient applies the mask in its epilogue (maskout,
// blocks.go) and the ReLU adds no gradient kernel. The fuse pass folds a ReLU after a conv or
// linear layer into that layer's block; other ReLUs run these kernels.

var _ = Register(ir.OpReLU, &Def{
	OpInfo: ir.OpInfo{Name: "relu", Infer: inferSameAsInput, FLOPs: flopsPerOutput(1), InPlace: inPlace0},
	Doc:    "max(x, 0)",
	DSL: &DSL{
		Name: "relu", Order: 20, Tensors: 1,
		Shape: "same shape", PyTorch: "nn.ReLU",
		Examples: []string{"relu(x)"},
		Torch:    []string{"F.relu(x)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		if b.Marked(maskedKey, n.Out()) {
			return []*ir.Value{dy} // its reader's input gradient applied the mask (maskout)
		}
		return []*ir.Value{b.Emit(ir.OpReLUGrad, n, ir.Attrs{}, n.Ins[0], dy, n.Out())}
	},
	Ref:    elementwiseRef(func(x float64) float64 { return math.Max(x, 0) }),
	Kernel: Kernel{Elementwise: "relu"},
	ONNX:   &ONNX{Op: "Relu"},
})

var _ = Register(ir.OpReLUGrad, &Def{
	OpInfo: ir.OpInfo{Name: "relu_grad", Infer: inferElementwiseGrad, FLOPs: flopsPerOutput(1), InPlace: inPlaceAll},
	Doc:    "dx = dy where y > 0, else 0",
	NoGrad: "a gradient op",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		dx := make([]float64, len(ins[0]))
		for i, d := range ins[0] {
			if ins[1][i] > 0 {
				dx[i] = d
			}
		}
		return [][]float64{dx}
	},
	Kernel: Kernel{Elementwise: "relu_grad"},
})
