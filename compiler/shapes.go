package compiler

import (
	"fmt"
	"math"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/units"
)

// shapesPass infers every tensor's type in schedule order. A parametric
// node first gets its parameter shapes from its input (like PyTorch's lazy
// modules); then its op's type rule gives the output type or a reason,
// which becomes an error at the node's DSL position.
func shapesPass(ctx *Context, g *ir.Graph) error {
	defer checkParamBytes(ctx, g)
	failed := map[*ir.Value]bool{}
	for _, n := range g.Nodes {
		skip := false
		for _, v := range n.Ins {
			if failed[v] {
				skip = true
			}
		}
		if skip {
			for _, v := range n.Outs {
				failed[v] = true
			}
			continue
		}
		if err := inferNode(n); err != nil {
			ctx.Diags = append(ctx.Diags, shapeDiagnostic(ctx, n, err))
			for _, v := range n.Outs {
				failed[v] = true
			}
		}
	}
	return nil
}

// MaxDeviceBytes bounds what a model's parameters may need: more than
// twice the largest GPU's memory (H200: 141 GB) cannot train anywhere.
const MaxDeviceBytes = 256 << 30

// checkParamBytes rejects models whose parameters alone cannot fit any GPU,
// at the largest layer.
func checkParamBytes(ctx *Context, g *ir.Graph) {
	if ctx.Diags.HasErrors() {
		return
	}
	var total int64
	var largest *ir.Param
	for _, p := range g.Params {
		b := p.Value.Type.Bytes(1)
		total += b
		if largest == nil || b > largest.Value.Type.Bytes(1) {
			largest = p
		}
	}
	if total > MaxDeviceBytes {
		ctx.Diags = append(ctx.Diags, dsl.Errorf(largest.Value.Pos, "the parameters need %s, more than any GPU holds (cnnc allows %s)", units.FormatBytes(total), units.FormatBytes(MaxDeviceBytes)).
			Span(len(largest.Layer)).
			Hint("%s alone has %s parameters (%s); shrink it", largest.Name, Commas(largest.Value.Type.SampleElems()), units.FormatBytes(largest.Value.Type.Bytes(1))))
	}
}

func inferNode(n *ir.Node) error {
	if types, fanIn, ok := ir.ParamTypes(n); ok {
		for _, v := range n.Ins {
			if v.Role != ir.RoleParam && v.Role != ir.RoleBuffer {
				continue
			}
			suffix := strings.TrimPrefix(v.Param.Name, v.Param.Layer+".")
			t, known := types[suffix]
			if !known {
				return fmt.Errorf("%s has no %s", n.Op, suffix)
			}
			if _, fits := ir.MulChecked(t.Dims...); !fits {
				return fmt.Errorf("its %s %s would have more than 2^40 elements; no GPU can hold it", suffix, t.ShapeString())
			}
			v.Type = t
			v.Param.Init.FanIn = fanIn
		}
	}
	for _, v := range n.Ins {
		if (v.Role == ir.RoleParam || v.Role == ir.RoleBuffer) && !v.Type.IsKnown() {
			// The type rule below explains why the input does not fit;
			// give the parameter a placeholder so it can run.
			v.Type = ir.F32Fixed()
		}
	}
	outs, err := n.Op.Info().Infer(n)
	if err != nil {
		return err
	}
	for i, t := range outs {
		n.Outs[i].Type = t
	}
	return nil
}

func shapeDiagnostic(ctx *Context, n *ir.Node, err error) *dsl.Diagnostic {
	d := dsl.Errorf(n.Pos, "%s: %v", n.Name, err).Span(len(n.Op.String()))
	if n.Op == ir.OpLinear && n.Attrs.In != 0 {
		linearInHints(ctx, n, d)
	}
	return d
}

// linearInHints explains a declared fan-in that does not match, the seed
// guide's bug: what flatten really gives, and a fix that makes it right.
func linearInHints(ctx *Context, n *ir.Node, d *dsl.Diagnostic) {
	x := n.Ins[0]
	if x.Type.DType != ir.F32 || len(x.Type.Dims) != 1 {
		return
	}
	got, want := x.Type.Dims[0], n.Attrs.In
	src := x
	if x.Def != nil && x.Def.Op == ir.OpFlatten {
		src = x.Def.Ins[0]
	}
	wantShape := ""
	if len(src.Type.Dims) == 3 {
		c := src.Type.Dims[0]
		if want%c == 0 {
			if s := isqrt(want / c); s*s == want/c {
				wantShape = fmt.Sprintf("%dx%dx%d", c, s, s)
			}
		}
	}
	d.Message = fmt.Sprintf("%s: linear expects %d input features", n.Name, want)
	if wantShape != "" {
		d.Message += fmt.Sprintf(" (%s)", wantShape)
	}
	if src != x {
		d.Message += fmt.Sprintf(" but flatten gives %d (%s)", got, src.Type.DimsString())
	} else {
		d.Message += fmt.Sprintf(" but %s gives %d", x.Name, got)
	}
	if fix, ok := poolingFix(ctx.File, n.Name, want); ok {
		d.Hint("fix: %s", fix)
	}
	d.Hint("or write in=%d (or leave in= out) if %s really is the input you mean: %s would then have %s parameters",
		got, src.Type.DimsString(), n.Name, Commas(got*n.Attrs.Out+n.Attrs.Out))
}

// isqrt is floor(sqrt(n)) for n >= 0, exact for every int64.
func isqrt(n int64) int64 {
	if n <= 0 {
		return 0
	}
	r := int64(math.Sqrt(float64(n)))
	for r > 0 && r > n/r { // r*r > n, without overflow
		r--
	}
	for r+1 <= n/(r+1) { // (r+1)^2 <= n
		r++
	}
	return r
}

// poolingFix tries the usual cure for a fan-in mismatch — a 2x2 max-pool
// after each conv (after its ReLU) — on a copy of the model, and describes
// it when it makes layer's input exactly want features.
func poolingFix(f *dsl.File, layer string, want int64) (string, bool) {
	if f == nil {
		return "", false
	}
	fixed, after := insertPools(f)
	if len(after) == 0 {
		return "", false
	}
	g, diags := Lower(fixed)
	if diags.HasErrors() {
		return "", false
	}
	for _, n := range g.Nodes {
		if err := inferNode(n); err != nil {
			if n.Name == layer && n.Op == ir.OpLinear {
				return "", false
			}
			break
		}
		if n.Name == layer && n.Op == ir.OpLinear {
			x := n.Ins[0]
			if x.Type.Dims[0] != want {
				return "", false
			}
			shape := x.Type.DimsString()
			if x.Def != nil && x.Def.Op == ir.OpFlatten {
				shape = x.Def.Ins[0].Type.DimsString()
			}
			where := ""
			for i, a := range after {
				switch {
				case i == 0:
				case i == len(after)-1:
					where += " and "
				default:
					where += ", "
				}
				where += a
			}
			return fmt.Sprintf("a 2x2 max-pool after each conv gives exactly %s = %d: add maxpool(..., kernel=2) after %s", shape, want, where), true
		}
	}
	return "", false
}

// insertPools returns a copy of f's model with `NAME_pool = maxpool(NAME,
// kernel=2)` after every conv2d statement (after its relu when a relu
// statement reads the conv), later statements reading the pooled value.
func insertPools(f *dsl.File) (*dsl.File, []string) {
	m := f.Model
	reader := map[string]*dsl.Assign{} // conv name -> relu statement reading it
	for _, s := range m.Stmts {
		if c := s.Value.Call; s.Value.Kind == dsl.ExprCall && c.Name == "relu" && len(c.Args) == 1 && c.Args[0].Value.Kind == dsl.ExprIdent {
			reader[c.Args[0].Value.Ident] = s
		}
	}
	var stmts []*dsl.Assign
	rename := map[string]string{}
	var after []string
	for _, s := range m.Stmts {
		s = renameIdents(s, rename)
		stmts = append(stmts, s)
		target := ""
		if s.Value.Kind == dsl.ExprCall && s.Value.Call.Name == "conv2d" {
			if _, hasReLU := reader[s.Name]; !hasReLU {
				target = s.Name
			}
		}
		if s.Value.Kind == dsl.ExprCall && s.Value.Call.Name == "relu" && len(s.Value.Call.Args) == 1 {
			if a := s.Value.Call.Args[0].Value; a.Kind == dsl.ExprIdent && isConv(m, a.Ident) {
				target = s.Name
			}
		}
		if target == "" {
			continue
		}
		pooled := target + "_pool"
		stmts = append(stmts, &dsl.Assign{Pos: s.Pos, Name: pooled, Value: &dsl.Expr{Pos: s.Pos, Kind: dsl.ExprCall, Call: &dsl.Call{
			Pos: s.Pos, Name: "maxpool2d", Args: []*dsl.Arg{
				{Pos: s.Pos, Value: &dsl.Expr{Pos: s.Pos, Kind: dsl.ExprIdent, Ident: target}},
				{Pos: s.Pos, Key: "kernel", Value: &dsl.Expr{Pos: s.Pos, Kind: dsl.ExprInt, Int: 2, Text: "2"}},
			}}}})
		rename[target] = pooled
		after = append(after, target)
	}
	cp := *m
	cp.Stmts = stmts
	return &dsl.File{Name: f.Name, Model: &cp}, after
}

func isConv(m *dsl.Model, name string) bool {
	for _, s := range m.Stmts {
		if s.Name == name {
			return s.Value.Kind == dsl.ExprCall && s.Value.Call.Name == "conv2d"
		}
	}
	return false
}

func renameIdents(s *dsl.Assign, rename map[string]string) *dsl.Assign {
	var walk func(e *dsl.Expr) *dsl.Expr
	walk = func(e *dsl.Expr) *dsl.Expr {
		c := *e
		switch e.Kind {
		case dsl.ExprIdent:
			if r, ok := rename[e.Ident]; ok {
				c.Ident = r
			}
		case dsl.ExprCall:
			call := *e.Call
			call.Args = nil
			for _, a := range e.Call.Args {
				na := *a
				na.Value = walk(a.Value)
				call.Args = append(call.Args, &na)
			}
			c.Call = &call
		}
		return &c
	}
	return &dsl.Assign{Pos: s.Pos, Name: s.Name, Value: walk(s.Value)}
}

// Commas formats n with thousands separators: 3692906 -> "3,692,906".
func Commas(n int64) string {
	s := fmt.Sprint(n)
	neg := ""
	if n < 0 {
		neg, s = "-", s[1:]
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return neg + s
}
