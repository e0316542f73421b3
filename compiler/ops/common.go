package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// Helpers shared by the ops' type rules, FLOPs rules and reference kernels.

// one checks a single output type's size.
func one(t ir.Type) ([]ir.Type, error) {
	if err := ir.CheckSize(t); err != nil {
		return nil, err
	}
	return []ir.Type{t}, nil
}

func in(n *ir.Node, i int) ir.Type { return n.Ins[i].Type }

// needRank requires input i to be batched f32 with rank per-sample dims.
func needRank(n *ir.Node, i int, t ir.Type, rank int, layout string) error {
	if t.DType != ir.F32 || !t.Batched || len(t.Dims) != rank {
		return fmt.Errorf("%s needs a %s input, but %s is %s", n.Op, layout, n.Ins[i].Name, t)
	}
	return nil
}

// inferSameAsInput: one float output of the first input's type.
func inferSameAsInput(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if x.DType != ir.F32 {
		return nil, fmt.Errorf("%s needs a float tensor, but %s is %s", n.Op, n.Ins[0].Name, x)
	}
	return []ir.Type{x}, nil
}

// inferElementwiseGrad: dy and a saved tensor of one type give dx of it.
func inferElementwiseGrad(n *ir.Node) ([]ir.Type, error) {
	for i := 1; i < len(n.Ins); i++ {
		if !in(n, 0).Equal(in(n, i)) {
			return nil, fmt.Errorf("%s: %s is %s but %s is %s", n.Op, n.Ins[0].Name, in(n, 0), n.Ins[i].Name, in(n, i))
		}
	}
	return inferSameAsInput(n)
}

// windowOut is the output size of n's window (kernel, stride, padding and
// dilation attributes) over the [C,H,W] input x.
func windowOut(n *ir.Node, x ir.Type, what string) (int64, int64, error) {
	a := n.Attrs
	d := a.Dil()
	ho, ok1 := ir.ConvOutDilated(x.Dims[1], a.Kernel[0], a.Stride[0], a.Pad[0], d[0])
	wo, ok2 := ir.ConvOutDilated(x.Dims[2], a.Kernel[1], a.Stride[1], a.Pad[1], d[1])
	if !ok1 || !ok2 {
		size := fmt.Sprintf("%dx%d", a.Kernel[0], a.Kernel[1])
		if d != [2]int64{1, 1} {
			size += fmt.Sprintf(" (dilation %dx%d: spanning %dx%d)", d[0], d[1], d[0]*(a.Kernel[0]-1)+1, d[1]*(a.Kernel[1]-1)+1)
		}
		return 0, 0, fmt.Errorf("%s kernel %s (padding %dx%d) is larger than its %dx%d input %s",
			what, size, a.Pad[0], a.Pad[1], x.Dims[1], x.Dims[2], n.Ins[0].Name)
	}
	return ho, wo, nil
}

// FLOPs rules.

func flopsNone(*ir.Node) int64 { return 0 }

func flopsPerOutput(k int64) func(*ir.Node) int64 {
	return func(n *ir.Node) int64 { return ir.MulSat(k, n.Outs[0].Type.SampleElems()) }
}

func flopsInput0(n *ir.Node) int64 { return n.Ins[0].Type.SampleElems() }

// inPlace0 lets output 0 take over input 0's buffer; inPlaceAll any input's.
func inPlace0(*ir.Node) []int { return []int{0} }

func inPlaceAll(n *ir.Node) []int {
	idx := make([]int, len(n.Ins))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// geom is the geometry of a conv or pool: input C×H×W, output O×HO×WO,
// the window with its strides, padding and dilation, and groups.
type geom struct {
	c, h, w, o, ho, wo int
	kh, kw, sh, sw     int
	ph, pw, dh, dw     int
	groups             int
}

func windowGeom(a ir.Attrs, x, y ir.Type) geom {
	d := a.Dil()
	return geom{
		c: int(x.Dims[0]), h: int(x.Dims[1]), w: int(x.Dims[2]),
		o: int(y.Dims[0]), ho: int(y.Dims[1]), wo: int(y.Dims[2]),
		kh: int(a.Kernel[0]), kw: int(a.Kernel[1]),
		sh: int(a.Stride[0]), sw: int(a.Stride[1]),
		ph: int(a.Pad[0]), pw: int(a.Pad[1]),
		dh: int(d[0]), dw: int(d[1]),
		groups: int(a.GroupCount()),
	}
}

// stub is a value standing for a tensor of type t in a probe node.
func stub(name string, t ir.Type) *ir.Value { return &ir.Value{Name: name, Type: t} }

// same is the identity of an elementwise op's gradient: a rule returning
// dy unchanged for every input that needs it.
func passThrough(_ GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
	gs := make([]*ir.Value, len(n.Ins))
	for i := range gs {
		if need[i] {
			gs[i] = dy
		}
	}
	return gs
}

// elementwiseRef makes the reference kernel of y = f(x).
func elementwiseRef(f func(x float64) float64) RefKernel {
	return func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		y := make([]float64, len(ins[0]))
		for i, v := range ins[0] {
			y[i] = f(v)
		}
		return [][]float64{y}
	}
}

// elementwiseGradRef makes the reference kernel of dx = dy · f'(s), s being
// the saved tensor the derivative reads (the input x or the output y).
func elementwiseGradRef(df func(s float64) float64) RefKernel {
	return func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		dx := make([]float64, len(ins[0]))
		for i, d := range ins[0] {
			dx[i] = d * df(ins[1][i])
		}
		return [][]float64{dx}
	}
}
