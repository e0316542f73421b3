package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// maxpool2d: max pooling, nn.MaxPool2d; padding never wins the max. Its
// gradient routes dy to each window's first maximum in scan order (as
// PyTorch), found again from x. A max-pool right after a conv (and its
// ReLU) runs inside the conv's block (the fuse pass) when its window is
// small enough; others run these kernels.

var poolAttrs = []ir.AttrSpec{ir.AttrKernel, ir.AttrStride, ir.AttrPad}

// poolArgs are the arguments of both pools.
var poolArgs = []ArgSpec{
	{Name: "kernel", Kind: ArgIntPair, Required: true, Min: 1, MaxInt: MaxWindowArg, MaxWhy: windowWhy, Doc: "window size"},
	{Name: "stride", Kind: ArgIntPair, Min: 1, MaxInt: MaxWindowArg, MaxWhy: windowWhy, Default: "the kernel", Doc: "stride"},
	{Name: "padding", Kind: ArgIntPair, Min: 0, MaxInt: MaxWindowArg, MaxWhy: windowWhy, Default: "0", Note: "at most half the kernel", Doc: "padding on each side"},
}

func poolAttrsOf(a Args) (ir.Attrs, error) {
	k := a.Pair("kernel", 0)
	s := k
	if a.Has("stride") {
		s = a.Pair("stride", 0)
	}
	return ir.Attrs{Kernel: k, Stride: s, Pad: a.Pair("padding", 0)}, nil
}

var poolExamples = []string{"%s(x, kernel=2)", "%s(x, kernel=3, stride=2, padding=1)", "%s(x, kernel=[3,2], stride=[2,1], padding=[1,0])"}

func poolCalls(name string) []string {
	var out []string
	for _, e := range poolExamples {
		out = append(out, fmt.Sprintf(e, name))
	}
	return out
}

var _ = Register(ir.OpMaxPool2D, &Def{
	OpInfo: ir.OpInfo{Name: "maxpool2d", Attrs: poolAttrs, Infer: inferPool, FLOPs: flopsPool},
	Doc:    "max pooling",
	DSL: &DSL{
		Name: "maxpool2d", Aliases: []string{"maxpool"}, Order: 30, Tensors: 1, Args: poolArgs, Attrs: poolAttrsOf,
		Shape: "`[C,H,W]` -> `[C, (H+2p-k)/s+1, ...]` (floor)", PyTorch: "nn.MaxPool2d",
		Examples: poolCalls("maxpool2d"),
		Torch: []string{"F.max_pool2d(x, 2)", "F.max_pool2d(x, 3, stride=2, padding=1)",
			"F.max_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 0))"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.Emit(ir.OpMaxPool2DGrad, n, n.Attrs, n.Ins[0], dy, n.Ins[0])}
	},
	Ref:    refMaxPool2D,
	Kernel: Kernel{Custom: "pool"},
	// padding is ignored by the max (-inf), as the reference and PyTorch
	ONNX: &ONNX{Op: "MaxPool", Attrs: func(n *ir.Node) []ONNXAttr { return windowAttrs(n.Attrs) }},
})

var _ = Register(ir.OpMaxPool2DGrad, &Def{
	OpInfo: ir.OpInfo{Name: "maxpool2d_grad", Attrs: poolAttrs, Infer: inferMaxPoolGrad, FLOPs: flopsPoolGrad},
	Doc:    "the gradient of a max-pool: dy routed to each window's maximum",
	NoGrad: "a gradient op",
	Ref:    refMaxPool2DGrad,
	Kernel: Kernel{Custom: "pool"},
})

func inferPool(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	a := n.Attrs
	if 2*a.Pad[0] > a.Kernel[0] || 2*a.Pad[1] > a.Kernel[1] {
		return nil, fmt.Errorf("%s padding %dx%d must be at most half the kernel %dx%d", n.Op, a.Pad[0], a.Pad[1], a.Kernel[0], a.Kernel[1])
	}
	ho, wo, err := windowOut(n, x, n.Op.String())
	if err != nil {
		return nil, err
	}
	return one(ir.F32Batched(x.Dims[0], ho, wo))
}

func inferMaxPoolGrad(n *ir.Node) ([]ir.Type, error) {
	probe := &ir.Node{Op: ir.OpMaxPool2D, Ins: []*ir.Value{n.Ins[1]}, Attrs: n.Attrs}
	yt, err := inferPool(probe)
	if err != nil {
		return nil, err
	}
	if !yt[0].Equal(in(n, 0)) {
		return nil, fmt.Errorf("maxpool2d_grad: gradient %s is %s, want %s", n.Ins[0].Name, in(n, 0), yt[0])
	}
	return []ir.Type{in(n, 1)}, nil
}

func flopsPool(n *ir.Node) int64 {
	return ir.MulSat(n.Outs[0].Type.SampleElems(), n.Attrs.Kernel[0], n.Attrs.Kernel[1])
}

func flopsPoolGrad(n *ir.Node) int64 {
	return ir.MulSat(n.Ins[0].Type.SampleElems(), n.Attrs.Kernel[0], n.Attrs.Kernel[1])
}

// maxWindow returns the flat input index of the maximum of one pooling
// window (the first one in scan order on ties, as PyTorch), or -1.
func maxWindow(x []float64, g geom, b, c, oy, ox int) int {
	best := -1
	for ky := 0; ky < g.kh; ky++ {
		iy := oy*g.sh - g.ph + ky
		if iy < 0 || iy >= g.h {
			continue
		}
		for kx := 0; kx < g.kw; kx++ {
			ix := ox*g.sw - g.pw + kx
			if ix < 0 || ix >= g.w {
				continue
			}
			i := ((b*g.c+c)*g.h+iy)*g.w + ix
			if best < 0 || x[i] > x[best] {
				best = i
			}
		}
	}
	return best
}

func poolGeom(n *ir.Node, x, y ir.Type) geom {
	g := windowGeom(n.Attrs, x, y)
	g.o = g.c
	return g
}

func refMaxPool2D(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	g := poolGeom(n, n.Ins[0].Type, n.Out().Type)
	y := make([]float64, env.Elems(n.Out()))
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					y[((b*g.c+c)*g.ho+oy)*g.wo+ox] = ins[0][maxWindow(ins[0], g, b, c, oy, ox)]
				}
			}
		}
	}
	return [][]float64{y}
}

func refMaxPool2DGrad(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	dy, x := ins[0], ins[1]
	g := poolGeom(n, n.Ins[1].Type, n.Ins[0].Type)
	dx := make([]float64, len(x))
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					dx[maxWindow(x, g, b, c, oy, ox)] += dy[((b*g.c+c)*g.ho+oy)*g.wo+ox]
				}
			}
		}
	}
	return [][]float64{dx}
}
