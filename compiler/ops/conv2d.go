package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// conv2d: 2-D convolution, PyTorch's nn.Conv2d (in_channels inferred),
// and its gradients with respect to input, weight and bias.
//
//	y[b,o,oy,ox] = bias[o] + Σ_{c in o's group, ky, kx} w[o,c',ky,kx]·x[b,c,oy·sh-ph+ky·dh, ox·sw-pw+kx·dw]
//
// The fuse pass turns a plain one (with a ReLU and a max-pool after it)
// into a conv2d_block, whose kernels run it; grouped and dilated convs run
// the direct kernels (codegen/direct_conv.go). Such a conv whose output
// only a batch norm reads (in training) also writes the statistics'
// partials as its second output (Attrs.BNStats, printed bnstats=true;
// BNPartialsType, in the tiling the target declares: RefEnv.BNTiles, flat
// otherwise), as a conv block does (batchnorm.go).

// Limits of the arguments, from what the generated kernels can launch.
const (
	// MaxConvKernel: the conv templates unroll windows up to 32x32.
	MaxConvKernel = 32
	// MaxOutFeatures: a conv's or linear layer's output channels are a
	// grid dimension of 64-row tiles, and CUDA allows 65,535 blocks there.
	MaxOutFeatures = 65535 * 64
	// MaxWindowArg bounds window sizes, strides and padding (sizes stay
	// far from overflowing).
	MaxWindowArg = 1 << 20
)

const (
	outWhy    = "the kernels tile output channels 64 at a time over at most 65,535 blocks"
	windowWhy = "no image is that large"
)

var convAttrs = []ir.AttrSpec{ir.AttrOut, ir.AttrKernel, ir.AttrStride, ir.AttrPad, ir.AttrDilation, ir.AttrGroups}

// conv2dAttrs are the forward's: a direct conv may write batch norm's
// partials (Attrs.BNStats).
var conv2dAttrs = ir.AttrList(convAttrs, ir.AttrBNStats)

var _ = Register(ir.OpConv2D, &Def{
	OpInfo: ir.OpInfo{
		Name: "conv2d", Attrs: conv2dAttrs, Infer: inferConv2DNode, FLOPs: flopsConv2D,
		ParamTypes: convParamTypes,
	},
	Doc: "2-D convolution",
	DSL: &DSL{
		Name: "conv2d", Order: 10, Tensors: 1,
		Args: []ArgSpec{
			{Name: "out", Kind: ArgInt, Required: true, Min: 1, MaxInt: MaxOutFeatures, MaxWhy: outWhy, Doc: "output channels"},
			{Name: "kernel", Kind: ArgIntPair, Required: true, Min: 1, MaxInt: MaxConvKernel, MaxWhy: "cnnc's convolution kernels take windows up to 32x32", Doc: "kernel size"},
			{Name: "stride", Kind: ArgIntPair, Min: 1, MaxInt: MaxWindowArg, MaxWhy: windowWhy, Default: "1", Doc: "stride"},
			{Name: "padding", Kind: ArgIntPairOrSame, Min: 0, MaxInt: MaxWindowArg, MaxWhy: windowWhy, Default: "0",
				Note: "`\"same\"` keeps the size: stride 1 and an odd kernel, padding dilation·(k-1)/2", Doc: "zero padding on each side"},
			{Name: "dilation", Kind: ArgIntPair, Min: 1, MaxInt: MaxWindowArg, MaxWhy: windowWhy, Default: "1", Doc: "spacing of the kernel's taps"},
			{Name: "groups", Kind: ArgInt, Min: 1, MaxInt: MaxOutFeatures, MaxWhy: outWhy, Default: "1",
				Note: "divides the input channels and out; groups = input channels is a depthwise conv", Doc: "channel groups"},
			{Name: "bias", Kind: ArgBool, Default: "true", Doc: "learn a bias"},
		},
		Attrs:    convAttrsOf,
		Params:   weightAndBias,
		Shape:    "`[C,H,W]` -> `[out, (H+2ph-dh(kh-1)-1)/sh+1, (W+2pw-dw(kw-1)-1)/sw+1]` (floor)",
		ParamDoc: "`weight [out,C/groups,kh,kw]`, `bias [out]`",
		PyTorch:  "nn.Conv2d",
		Examples: []string{"conv2d(x, out=3, kernel=3)", "conv2d(x, out=3, kernel=3, stride=2, padding=1)",
			"conv2d(x, out=3, kernel=[3,2], stride=[1,2], padding=[0,1], bias=false)",
			"conv2d(x, out=6, kernel=3, groups=2, padding=\"same\")",
			"conv2d(x, out=4, kernel=3, groups=4, stride=2, padding=1)",
			"conv2d(x, out=5, kernel=[3,1], dilation=[2,3], padding=[2,1])",
			"conv2d(x, out=4, kernel=[3,5], dilation=2, padding=\"same\", groups=4, bias=false)"},
		Torch: []string{"F.conv2d(x, weight, bias)", "F.conv2d(x, weight, bias, stride=2, padding=1)",
			"F.conv2d(x, weight, None, stride=(1, 2), padding=(0, 1))",
			"F.conv2d(x, weight, bias, groups=2, padding='same')",
			"F.conv2d(x, weight, bias, groups=4, stride=2, padding=1)",
			"F.conv2d(x, weight, bias, dilation=(2, 3), padding=(2, 1))",
			"F.conv2d(x, weight, None, dilation=2, padding='same', groups=4)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
		x, w := n.Ins[0], n.Ins[1]
		gs := make([]*ir.Value, len(n.Ins))
		fa := n.Attrs
		fa.BNStats = false // the forward's alone
		if need[0] {
			a := fa
			a.Dims = x.Type.Dims
			gs[0] = b.Emit(ir.OpConv2DGradInput, n, a, x, dy, w)
		}
		gs[1] = b.Emit(ir.OpConv2DGradWeight, n, fa, w, dy, x)
		if len(n.Ins) > 2 {
			gs[2] = b.Emit(ir.OpConv2DGradBias, n, ir.Attrs{}, n.Ins[2], dy)
		}
		return gs
	},
	Ref: refConv2DNode,
	// plain convs run in conv2d_block (the fuse pass); grouped and dilated
	// ones in the direct family
	Kernel: Kernel{Custom: "direct_conv"},
	ONNX: &ONNX{Op: "Conv", Attrs: func(n *ir.Node) []ONNXAttr {
		// weight [out,C/groups,kh,kw] and bias [out] are Conv's W and B as they are
		d := n.Attrs.Dil()
		return append(windowAttrs(n.Attrs), IntsAttr("dilations", d[0], d[1]), IntAttr("group", n.Attrs.GroupCount()))
	}},
})

var _ = Register(ir.OpConv2DGradInput, &Def{
	OpInfo: ir.OpInfo{
		Name: "conv2d_grad_input", Attrs: ir.AttrList(convAttrs, ir.AttrDims), Infer: inferConv2DGradInput,
		FLOPs:     func(n *ir.Node) int64 { return ir.MulSat(2, convMACs(n.Ins[0].Type, n.Ins[1].Type)) },
		GradInput: true,
	},
	Doc:    "the gradient of a conv2d's input: the transposed convolution of dy",
	NoGrad: "a gradient op",
	Ref:    refConv2DGradInput,
	Kernel: Kernel{Custom: "direct_conv"},
})

var _ = Register(ir.OpConv2DGradWeight, &Def{
	OpInfo: ir.OpInfo{
		Name: "conv2d_grad_weight", Attrs: convAttrs, Infer: inferConv2DGradWeight,
		FLOPs: func(n *ir.Node) int64 { return ir.MulSat(2, convMACs(n.Ins[0].Type, n.Outs[0].Type)) },
	},
	Doc:    "the gradient of a conv2d's weight: dy correlated with the input",
	NoGrad: "a gradient op",
	Ref:    refConv2DGradWeight,
	Kernel: Kernel{Custom: "direct_conv"},
})

var _ = Register(ir.OpConv2DGradBias, &Def{
	OpInfo: ir.OpInfo{Name: "conv2d_grad_bias", Infer: inferChannelSum, FLOPs: flopsInput0},
	Doc:    "the gradient of a conv2d's bias: dy summed over batch and space",
	NoGrad: "a gradient op",
	Ref:    refConv2DGradBias,
	Kernel: Kernel{Custom: "direct_conv"},
})

// convAttrsOf reads a conv2d call's arguments; padding="same" becomes the
// symmetric padding that keeps the size, which needs stride 1 (as
// PyTorch) and an odd kernel (PyTorch would pad one side more).
func convAttrsOf(a Args) (ir.Attrs, error) {
	at := ir.Attrs{Out: a.Int("out", 0), Kernel: a.Pair("kernel", 0), Stride: a.Pair("stride", 1),
		Dilation: a.Pair("dilation", 1), Groups: a.Int("groups", 1)}
	if a.String("padding", "") != "same" {
		at.Pad = a.Pair("padding", 0)
		return at, nil
	}
	if at.Stride != [2]int64{1, 1} {
		return at, &ArgError{Arg: "padding", Msg: fmt.Sprintf("padding=\"same\" needs stride 1 (the output keeps the input's size), but stride is %dx%d", at.Stride[0], at.Stride[1])}
	}
	for i, k := range at.Kernel {
		if k%2 == 0 {
			return at, &ArgError{Arg: "padding", Msg: fmt.Sprintf("padding=\"same\" needs an odd kernel, but it is %dx%d: an even one would pad one side more (write the padding out)", at.Kernel[0], at.Kernel[1])}
		}
		at.Pad[i] = at.Dilation[i] * (k - 1) / 2
	}
	return at, nil
}

// weightAndBias: a weight (kaiming_uniform) and, unless bias=false, a bias
// (uniform over ±1/sqrt(fan_in)), PyTorch's defaults.
func weightAndBias(a Args) []ParamSpec {
	ps := []ParamSpec{{Suffix: "weight", Init: ir.InitKaimingUniform}}
	if a.Bool("bias", true) {
		ps = append(ps, ParamSpec{Suffix: "bias", Init: ir.InitUniformFanIn})
	}
	return ps
}

// windowAttrs are a conv's or pool's kernel, strides and pads for ONNX
// (pads ordered [top, left, bottom, right]; the DSL pads both sides alike).
func windowAttrs(a ir.Attrs) []ONNXAttr {
	return []ONNXAttr{
		IntsAttr("kernel_shape", a.Kernel[0], a.Kernel[1]),
		IntsAttr("strides", a.Stride[0], a.Stride[1]),
		IntsAttr("pads", a.Pad[0], a.Pad[1], a.Pad[0], a.Pad[1]),
	}
}

// checkGroups: groups must divide the input and output channels.
func checkGroups(n *ir.Node, c int64) error {
	g := n.Attrs.GroupCount()
	if c%g != 0 {
		return fmt.Errorf("conv2d groups=%d must divide the input's %d channels (%s)", g, c, n.Ins[0].Name)
	}
	if n.Attrs.Out%g != 0 {
		return fmt.Errorf("conv2d groups=%d must divide out=%d", g, n.Attrs.Out)
	}
	return nil
}

func convParamTypes(n *ir.Node) (map[string]ir.Type, int64, bool) {
	x := n.Ins[0].Type
	if x.DType != ir.F32 || len(x.Dims) != 3 || checkGroups(n, x.Dims[0]) != nil {
		return nil, 0, false
	}
	w := ir.ConvWeightType(n.Attrs, x)
	return map[string]ir.Type{"weight": w, "bias": ir.F32Fixed(n.Attrs.Out)}, w.Dims[1] * w.Dims[2] * w.Dims[3], true
}

func inferConv2D(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if err := needRank(n, 0, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	if err := checkGroups(n, x.Dims[0]); err != nil {
		return nil, err
	}
	ho, wo, err := windowOut(n, x, "conv2d")
	if err != nil {
		return nil, err
	}
	if w := in(n, 1); !w.Equal(ir.ConvWeightType(n.Attrs, x)) {
		return nil, fmt.Errorf("conv2d weight %s is %s, want %s", n.Ins[1].Name, w, ir.ConvWeightType(n.Attrs, x))
	}
	if len(n.Ins) > 2 && !in(n, 2).Equal(ir.F32Fixed(n.Attrs.Out)) {
		return nil, fmt.Errorf("conv2d bias %s is %s, want f32[%d]", n.Ins[2].Name, in(n, 2), n.Attrs.Out)
	}
	return one(ir.F32Batched(n.Attrs.Out, ho, wo))
}

// inferConv2DNode is a conv2d node's outputs: y, and the batch norm
// partials after it when it writes them (Attrs.BNStats).
func inferConv2DNode(n *ir.Node) ([]ir.Type, error) {
	ts, err := inferConv2D(n)
	if err != nil || !n.Attrs.BNStats {
		return ts, err
	}
	return append(ts, BNPartialsType(ts[0])), nil
}

func inferConv2DGradInput(n *ir.Node) ([]ir.Type, error) {
	dy, w := in(n, 0), in(n, 1)
	if err := needRank(n, 0, dy, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	if len(n.Attrs.Dims) != 3 {
		return nil, fmt.Errorf("conv2d_grad_input needs dims=[C,H,W]")
	}
	x := ir.F32Batched(n.Attrs.Dims...)
	probe := &ir.Node{Op: ir.OpConv2D, Ins: []*ir.Value{stub("x", x), stub(n.Ins[1].Name, w)}, Attrs: n.Attrs}
	yt, err := inferConv2D(probe)
	if err != nil {
		return nil, err
	}
	if !yt[0].Equal(dy) {
		return nil, fmt.Errorf("conv2d_grad_input: gradient %s is %s but the conv gives %s", n.Ins[0].Name, dy, yt[0])
	}
	return []ir.Type{x}, nil
}

func inferConv2DGradWeight(n *ir.Node) ([]ir.Type, error) {
	dy, x := in(n, 0), in(n, 1)
	if err := needRank(n, 1, x, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	probe := &ir.Node{Op: ir.OpConv2D, Ins: []*ir.Value{n.Ins[1]}, Attrs: n.Attrs}
	if err := checkGroups(probe, x.Dims[0]); err != nil {
		return nil, err
	}
	ho, wo, err := windowOut(probe, x, "conv2d")
	if err != nil {
		return nil, err
	}
	if want := ir.F32Batched(n.Attrs.Out, ho, wo); !dy.Equal(want) {
		return nil, fmt.Errorf("conv2d_grad_weight: gradient %s is %s, want %s", n.Ins[0].Name, dy, want)
	}
	return []ir.Type{ir.ConvWeightType(n.Attrs, x)}, nil
}

func inferChannelSum(n *ir.Node) ([]ir.Type, error) {
	dy := in(n, 0)
	if err := needRank(n, 0, dy, 3, "[B,C,H,W]"); err != nil {
		return nil, err
	}
	return []ir.Type{ir.F32Fixed(dy.Dims[0])}, nil
}

// convMACs: per output element, (C/groups)·kh·kw multiply-adds.
func convMACs(out ir.Type, w ir.Type) int64 {
	return ir.MulSat(out.SampleElems(), w.Dims[1], w.Dims[2], w.Dims[3])
}

func flopsConv2D(n *ir.Node) int64 {
	f := ir.MulSat(2, convMACs(n.Outs[0].Type, n.Ins[1].Type))
	if len(n.Ins) > 2 {
		f = ir.AddSat(f, n.Outs[0].Type.SampleElems())
	}
	return f
}

// convTaps visits the taps of output (o, oy, ox) of sample b that fall
// inside the input: the input's flat index and the weight's.
func convTaps(g geom, b, o, oy, ox int, visit func(xi, wi int)) {
	cg, og := g.c/g.groups, g.o/g.groups
	c0 := (o / og) * cg
	for cl := 0; cl < cg; cl++ {
		c := c0 + cl
		for ky := 0; ky < g.kh; ky++ {
			iy := oy*g.sh - g.ph + ky*g.dh
			if iy < 0 || iy >= g.h {
				continue
			}
			for kx := 0; kx < g.kw; kx++ {
				ix := ox*g.sw - g.pw + kx*g.dw
				if ix < 0 || ix >= g.w {
					continue
				}
				visit(((b*g.c+c)*g.h+iy)*g.w+ix, ((o*cg+cl)*g.kh+ky)*g.kw+kx)
			}
		}
	}
}

func refConv2D(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	g := windowGeom(n.Attrs, n.Ins[0].Type, n.Out().Type)
	x, w := ins[0], ins[1]
	y := make([]float64, env.Elems(n.Out()))
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < g.o; o++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					s := 0.0
					if len(ins) > 2 {
						s = ins[2][o]
					}
					convTaps(g, b, o, oy, ox, func(xi, wi int) { s += x[xi] * w[wi] })
					y[((b*g.o+o)*g.ho+oy)*g.wo+ox] = s
				}
			}
		}
	}
	return [][]float64{y}
}

// refConv2DNode is a conv2d node's reference: y, and its batch norm
// partials when it writes them (Attrs.BNStats; refBNPartials).
func refConv2DNode(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	outs := refConv2D(env, n, ins)
	if n.Attrs.BNStats {
		outs = append(outs, refBNPartials(env, n, n.Out().Type, outs[0]))
	}
	return outs
}

func refConv2DGradInput(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	g := windowGeom(n.Attrs, n.Out().Type, n.Ins[0].Type)
	dy, w := ins[0], ins[1]
	dx := make([]float64, env.Elems(n.Out()))
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < g.o; o++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					d := dy[((b*g.o+o)*g.ho+oy)*g.wo+ox]
					convTaps(g, b, o, oy, ox, func(xi, wi int) { dx[xi] += d * w[wi] })
				}
			}
		}
	}
	return [][]float64{dx}
}

func refConv2DGradWeight(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	g := windowGeom(n.Attrs, n.Ins[1].Type, n.Ins[0].Type)
	dy, x := ins[0], ins[1]
	dw := make([]float64, n.Out().Type.SampleElems())
	for b := 0; b < env.Batch; b++ {
		for o := 0; o < g.o; o++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					d := dy[((b*g.o+o)*g.ho+oy)*g.wo+ox]
					convTaps(g, b, o, oy, ox, func(xi, wi int) { dw[wi] += d * x[xi] })
				}
			}
		}
	}
	return [][]float64{dw}
}

func refConv2DGradBias(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	t := n.Ins[0].Type
	o, hw := int(t.Dims[0]), int(t.Dims[1]*t.Dims[2])
	db := make([]float64, o)
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < o; c++ {
			for i := 0; i < hw; i++ {
				db[c] += ins[0][(b*o+c)*hw+i]
			}
		}
	}
	return [][]float64{db}
}
