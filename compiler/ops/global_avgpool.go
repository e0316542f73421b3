package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// global_avgpool(x): [C,H,W] -> [C], each channel's mean — PyTorch's
// nn.AdaptiveAvgPool2d(1) followed by a flatten. Its gradient spreads
// dy/(H·W) over the channel's map. One thread per (sample, channel) sums
// the map in order (deterministic).

var GlobalAvgPool = New(&Def{
	OpInfo: ir.OpInfo{Name: "global_avgpool", Infer: inferGlobalAvgPool, FLOPs: flopsInput0},
	Doc:    "each channel's mean over its map",
	DSL: &DSL{
		Name: "global_avgpool", Order: 45, Tensors: 1,
		Shape: "`[C,H,W]` -> `[C]`", PyTorch: "nn.AdaptiveAvgPool2d(1) + flatten",
		Examples: []string{"global_avgpool(x)"},
		Torch:    []string{"F.adaptive_avg_pool2d(x, 1).flatten(1)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.Emit(GlobalAvgPoolGrad, n, ir.Attrs{Dims: n.Ins[0].Type.Dims}, n.Ins[0], dy)}
	},
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		c, hw := channelsAndMap(n.Ins[0].Type)
		y := make([]float64, env.Batch*c)
		for i := range y {
			s := 0.0
			for _, v := range ins[0][i*hw : (i+1)*hw] {
				s += v
			}
			y[i] = s / float64(hw)
		}
		return [][]float64{y}
	},
	Kernel: Kernel{Elementwise: "global_avgpool", Data: mapData(func(n *ir.Node) ir.Type { return n.Ins[0].Type }), Suffix: mapSuffix},
	ONNX: &ONNX{Emit: func(e ONNXEmitter, n *ir.Node) error {
		c := n.Ins[0].Type.Dims[0]
		pooled := e.Temp(n.Name+".pooled", []int64{c, 1, 1})
		e.Node("GlobalAveragePool", []string{e.Name(n.Ins[0])}, []string{pooled})
		e.Node("Flatten", []string{pooled}, []string{e.Output(n.Out())}, IntAttr("axis", 1))
		return nil
	}},
})

var GlobalAvgPoolGrad = New(&Def{
	OpInfo: ir.OpInfo{Name: "global_avgpool_grad", Attrs: []ir.AttrSpec{ir.AttrDims}, Infer: inferGlobalAvgPoolGrad, FLOPs: flopsPerOutput(1)},
	Doc:    "dy/(H·W) over each channel's map",
	NoGrad: "a gradient op",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		_, hw := channelsAndMap(n.Out().Type)
		dx := make([]float64, env.Elems(n.Out()))
		for i := range dx {
			dx[i] = ins[0][i/hw] / float64(hw)
		}
		return [][]float64{dx}
	},
	Kernel: Kernel{Elementwise: "global_avgpool_grad", Data: mapData(func(n *ir.Node) ir.Type { return n.Out().Type })},
})

func inferGlobalAvgPool(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	return one(ir.F32Batched(x.Dims[0]))
}

func inferGlobalAvgPoolGrad(n *ir.Node) ([]ir.Type, error) {
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("global_avgpool_grad needs dims=[C,H,W]")
	}
	if want := ir.F32Batched(n.Attrs.Dims[0]); !in(n, 0).Equal(want) {
		return nil, fmt.Errorf("global_avgpool_grad: gradient %s is %s, want %s", n.Ins[0].Name, in(n, 0), want)
	}
	return one(ir.F32Batched(n.Attrs.Dims...))
}

// channelsAndMap: a [C,H,W] type's channels and map size H·W.
func channelsAndMap(t ir.Type) (int, int) {
	return int(t.Dims[0]), int(t.Dims[1] * t.Dims[2])
}

// mapData gives the template the map size HW of the [C,H,W] tensor t(n).
func mapData(t func(n *ir.Node) ir.Type) func(n *ir.Node) map[string]any {
	return func(n *ir.Node) map[string]any {
		x := t(n)
		return map[string]any{"HW": x.Dims[1] * x.Dims[2]}
	}
}

// mapSuffix names the input's map in the kernel's name.
func mapSuffix(n *ir.Node) string {
	x := n.Ins[0].Type
	return fmt.Sprintf("from%dx%d", x.Dims[1], x.Dims[2])
}
