package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// avgpool2d: average pooling, nn.AvgPool2d with padding counted in the
// divisor (count_include_pad=True, PyTorch's default); its gradient
// spreads dy/(kh·kw) over each window.

var _ = Register(ir.OpAvgPool2D, &Def{
	OpInfo: ir.OpInfo{Name: "avgpool2d", Attrs: poolAttrs, Infer: inferPool, FLOPs: flopsPool},
	Doc:    "average pooling",
	DSL: &DSL{
		Name: "avgpool2d", Aliases: []string{"avgpool"}, Order: 40, Tensors: 1, Args: poolArgs, Attrs: poolAttrsOf,
		Shape: "as maxpool2d; padding counts in the average (PyTorch's `count_include_pad=True`)", PyTorch: "nn.AvgPool2d",
		Examples: poolCalls("avgpool2d"),
		Torch: []string{"F.avg_pool2d(x, 2)", "F.avg_pool2d(x, 3, stride=2, padding=1)",
			"F.avg_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 0))"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		a := n.Attrs
		a.Dims = n.Ins[0].Type.Dims
		return []*ir.Value{b.Emit(ir.OpAvgPool2DGrad, n, a, n.Ins[0], dy)}
	},
	Ref:    refAvgPool2D,
	Kernel: Kernel{Custom: "pool"},
	// the DSL's average counts padding in the divisor (count_include_pad)
	ONNX: &ONNX{Op: "AveragePool", Attrs: func(n *ir.Node) []ONNXAttr {
		return append(windowAttrs(n.Attrs), IntAttr("count_include_pad", 1))
	}},
})

var _ = Register(ir.OpAvgPool2DGrad, &Def{
	OpInfo: ir.OpInfo{Name: "avgpool2d_grad", Attrs: ir.AttrList(poolAttrs, ir.AttrDims), Infer: inferAvgPoolGrad, FLOPs: flopsPoolGrad},
	Doc:    "the gradient of an average pool: dy spread evenly over each window",
	NoGrad: "a gradient op",
	Ref:    refAvgPool2DGrad,
	Kernel: Kernel{Custom: "pool"},
})

func inferAvgPoolGrad(n *ir.Node) ([]ir.Type, error) {
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("avgpool2d_grad needs dims=[C,H,W]")
	}
	x := ir.F32Batched(n.Attrs.Dims...)
	probe := &ir.Node{Op: ir.OpAvgPool2D, Ins: []*ir.Value{stub("x", x)}, Attrs: n.Attrs}
	yt, err := inferPool(probe)
	if err != nil {
		return nil, err
	}
	if !yt[0].Equal(in(n, 0)) {
		return nil, fmt.Errorf("avgpool2d_grad: gradient %s is %s, want %s", n.Ins[0].Name, in(n, 0), yt[0])
	}
	return []ir.Type{x}, nil
}

// avgWindow visits the in-bounds inputs of a window; padding counts in the
// divisor.
func avgWindow(g geom, b, c, oy, ox int, visit func(i int)) {
	for ky := 0; ky < g.kh; ky++ {
		iy := oy*g.sh - g.ph + ky
		if iy < 0 || iy >= g.h {
			continue
		}
		for kx := 0; kx < g.kw; kx++ {
			ix := ox*g.sw - g.pw + kx
			if ix >= 0 && ix < g.w {
				visit(((b*g.c+c)*g.h+iy)*g.w + ix)
			}
		}
	}
}

func refAvgPool2D(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	g := poolGeom(n, n.Ins[0].Type, n.Out().Type)
	y := make([]float64, env.Elems(n.Out()))
	div := float64(g.kh * g.kw)
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					s := 0.0
					avgWindow(g, b, c, oy, ox, func(i int) { s += ins[0][i] })
					y[((b*g.c+c)*g.ho+oy)*g.wo+ox] = s / div
				}
			}
		}
	}
	return [][]float64{y}
}

func refAvgPool2DGrad(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	g := poolGeom(n, n.Out().Type, n.Ins[0].Type)
	dx := make([]float64, env.Elems(n.Out()))
	div := float64(g.kh * g.kw)
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					d := ins[0][((b*g.c+c)*g.ho+oy)*g.wo+ox] / div
					avgWindow(g, b, c, oy, ox, func(i int) { dx[i] += d })
				}
			}
		}
	}
	return [][]float64{dx}
}
