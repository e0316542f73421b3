package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// concat(a, b, ...): the inputs side by side along channels (their first
// per-sample dimension; every other dimension equal), torch.cat(..., 1).
// Its gradient hands each input its slice of dy (concat_grad, a copy).

var Concat = New(&Def{
	OpInfo: ir.OpInfo{Name: "concat", Infer: inferConcat, FLOPs: flopsNone},
	Doc:    "the inputs side by side along channels",
	DSL: &DSL{
		Name: "concat", Order: 85, Tensors: 2, Variadic: true,
		Shape:    "`[C1,H,W]`, `[C2,H,W]`, ... -> `[C1+C2+...,H,W]` (also `[F1]`, `[F2]`, ... -> `[F1+F2+...]`)",
		PyTorch:  "torch.cat(..., 1)",
		Examples: []string{"concat(x, y)", "concat(x, y, z)", "concat(x, x)"},
		Torch:    []string{"torch.cat([x, y], 1)", "torch.cat([x, y, z], 1)", "torch.cat([x, x], 1)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
		gs := make([]*ir.Value, len(n.Ins))
		off := int64(0)
		for i, x := range n.Ins {
			if need[i] {
				gs[i] = b.Emit(ConcatGrad, n, ir.Attrs{Offset: off, Dims: x.Type.Dims}, x, dy)
			}
			off += x.Type.Dims[0]
		}
		return gs
	},
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		y := make([]float64, 0, env.Elems(n.Out()))
		for b := 0; b < env.Batch; b++ {
			for i, v := range n.Ins {
				per := int(v.Type.SampleElems())
				y = append(y, ins[i][b*per:(b+1)*per]...)
			}
		}
		return [][]float64{y}
	},
	Kernel: Kernel{Elementwise: "concat", Data: concatData, Suffix: concatSuffix},
	ONNX:   &ONNX{Op: "Concat", Attrs: func(*ir.Node) []ONNXAttr { return []ONNXAttr{IntAttr("axis", 1)} }},
})

var attrOffset = ir.AttrSpec{Name: "offset", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Offset) }}

var ConcatGrad = New(&Def{
	OpInfo: ir.OpInfo{Name: "concat_grad", Attrs: []ir.AttrSpec{attrOffset, ir.AttrDims}, Infer: inferConcatGrad, FLOPs: flopsNone},
	Doc:    "one input's slice of a concat's gradient: channels [offset, offset+dims[0])",
	NoGrad: "a gradient op",
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		all, per, first := sliceGeometry(n)
		dx := make([]float64, 0, env.Elems(n.Out()))
		for b := 0; b < env.Batch; b++ {
			dx = append(dx, ins[0][b*all+first:b*all+first+per]...)
		}
		return [][]float64{dx}
	},
	Kernel: Kernel{Elementwise: "concat_grad", Data: func(n *ir.Node) map[string]any {
		all, per, first := sliceGeometry(n)
		return map[string]any{"All": all, "Per": per, "First": first}
	}, Suffix: func(n *ir.Node) string {
		all, _, first := sliceGeometry(n)
		return fmt.Sprintf("of%d_at%d", all, first)
	}},
})

func inferConcat(n *ir.Node) ([]ir.Type, error) {
	if len(n.Ins) < 2 {
		return nil, fmt.Errorf("concat needs at least two tensors")
	}
	x0 := in(n, 0)
	c := int64(0)
	for _, v := range n.Ins {
		t := v.Type
		if t.DType != ir.F32 || !t.Batched || len(t.Dims) == 0 || len(t.Dims) != len(x0.Dims) {
			return nil, fmt.Errorf("concat needs tensors of one rank, but %s is %s and %s is %s", n.Ins[0].Name, x0, v.Name, t)
		}
		for d := 1; d < len(t.Dims); d++ {
			if t.Dims[d] != x0.Dims[d] {
				return nil, fmt.Errorf("concat joins along channels: every other dimension must agree, but %s is %s and %s is %s", n.Ins[0].Name, x0, v.Name, t)
			}
		}
		c += t.Dims[0]
	}
	dims := append([]int64{c}, x0.Dims[1:]...)
	return one(ir.F32Batched(dims...))
}

func inferConcatGrad(n *ir.Node) ([]ir.Type, error) {
	dy, dims := in(n, 0), n.Attrs.Dims
	if dy.DType != ir.F32 || !dy.Batched || len(dy.Dims) != len(dims) || len(dims) == 0 {
		return nil, fmt.Errorf("concat_grad: gradient %s is %s, which dims=%v does not slice", n.Ins[0].Name, dy, dims)
	}
	if n.Attrs.Offset < 0 || n.Attrs.Offset+dims[0] > dy.Dims[0] {
		return nil, fmt.Errorf("concat_grad: channels [%d, %d) are outside %s's %d", n.Attrs.Offset, n.Attrs.Offset+dims[0], n.Ins[0].Name, dy.Dims[0])
	}
	for d := 1; d < len(dims); d++ {
		if dims[d] != dy.Dims[d] {
			return nil, fmt.Errorf("concat_grad: dims=%v do not match %s", dims, dy)
		}
	}
	return one(ir.F32Batched(dims...))
}

// sliceGeometry: per sample, the gradient's elements, the slice's, and the
// slice's first element.
func sliceGeometry(n *ir.Node) (all, per, first int) {
	dy := n.Ins[0].Type
	rest := dy.SampleElems() / dy.Dims[0] // elements per channel
	return int(dy.SampleElems()), int(n.Out().Type.SampleElems()), int(n.Attrs.Offset * rest)
}

// concatData gives the concat template its inputs' per-sample sizes and
// where each starts in an output sample.
func concatData(n *ir.Node) map[string]any {
	type part struct {
		Index       int
		Start, Size int64
	}
	var parts []part
	start := int64(0)
	for i, v := range n.Ins {
		size := v.Type.SampleElems()
		parts = append(parts, part{Index: i, Start: start, Size: size})
		start += size
	}
	return map[string]any{"Parts": parts, "All": start}
}

// concatSuffix names the inputs' channel counts.
func concatSuffix(n *ir.Node) string {
	s := "of"
	for i, v := range n.Ins {
		if i > 0 {
			s += "_"
		}
		s += fmt.Sprint(v.Type.Dims[0])
	}
	return s
}
