package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// flatten: [C,H,W] -> [C·H·W], a view (row-major, as PyTorch's flatten
// from dimension 1); its gradient is reshape, a view back to the input's
// shape. Neither runs a kernel.

var _ = Register(ir.OpFlatten, &Def{
	OpInfo: ir.OpInfo{Name: "flatten", Infer: inferFlatten, FLOPs: flopsNone, View: true},
	Doc:    "flattens each sample to a vector",
	DSL: &DSL{
		Name: "flatten", Order: 50, Tensors: 1,
		Shape: "`[C,H,W]` -> `[C*H*W]`", PyTorch: "nn.Flatten",
		Examples: []string{"flatten(x)"},
		Torch:    []string{"torch.flatten(x, 1)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.Emit(ir.OpReshape, n, ir.Attrs{Dims: n.Ins[0].Type.Dims}, n.Ins[0], dy)}
	},
	Ref: copyRef,
	// [B,C,H,W] -> [B,C*H*W] in row-major order
	ONNX: &ONNX{Op: "Flatten", Attrs: func(*ir.Node) []ONNXAttr { return []ONNXAttr{IntAttr("axis", 1)} }},
})

var _ = Register(ir.OpReshape, &Def{
	OpInfo: ir.OpInfo{Name: "reshape", Attrs: []ir.AttrSpec{ir.AttrDims}, Infer: inferReshape, FLOPs: flopsNone, View: true},
	Doc:    "gives each sample the per-sample shape dims (a view)",
	NoGrad: "a gradient op",
	Ref:    copyRef,
})

func inferFlatten(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if x.DType != ir.F32 || !x.Batched {
		return nil, fmt.Errorf("flatten needs a batched float tensor, but %s is %s", n.Ins[0].Name, x)
	}
	return one(ir.F32Batched(x.SampleElems()))
}

func inferReshape(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	t := ir.F32Batched(n.Attrs.Dims...)
	if x.SampleElems() != t.SampleElems() || !x.Batched {
		return nil, fmt.Errorf("reshape of %s %s to %s changes the element count", n.Ins[0].Name, x, t)
	}
	return []ir.Type{t}, nil
}

func copyRef(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	return [][]float64{append([]float64(nil), ins[0]...)}
}
