package codegen

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
)

// __restrict__ and in-place kernels. The memory planner may give a node's
// output 0 the buffer of one of its inputs (ir.Node.InPlaceInputs: the
// masked input gradients over the activation they mask, relu, relu_grad,
// dropout, add), so such a kernel receives two pointers to the same
// memory. A __restrict__ parameter promises the compiler that nothing else
// reaches its memory; a write through one of two aliased pointers breaks
// that promise (undefined behaviour: nvcc may reorder or cache loads). The
// templates therefore leave __restrict__ off every parameter that can alias
// (paramsFor decides it per argument, and templates with fixed signatures
// omit it there), and Generate checks the rendered signatures against the
// node's in-place rule (checkRestrict).

// Param is one parameter of a generated kernel, as its signature declares it.
type Param struct {
	Decl     string // e.g. "const float* __restrict__ x"
	Pointer  bool
	Const    bool // a pointer to const: the kernel only reads through it
	Restrict bool
}

// parseParams reads the parameter list of kernel name from its text.
func parseParams(text, name string) ([]Param, error) {
	i := strings.Index(text, " "+name+"(")
	if i < 0 {
		return nil, fmt.Errorf("codegen: kernel %s: no signature in its text", name)
	}
	rest := text[i+len(name)+2:]
	end := strings.IndexByte(rest, ')')
	if end < 0 {
		return nil, fmt.Errorf("codegen: kernel %s: unterminated parameter list", name)
	}
	var out []Param
	for _, decl := range strings.Split(rest[:end], ",") {
		decl = strings.Join(strings.Fields(decl), " ")
		if decl == "" {
			continue
		}
		star := strings.LastIndexByte(decl, '*')
		p := Param{Decl: decl, Pointer: star >= 0, Restrict: strings.Contains(decl, "__restrict__")}
		p.Const = p.Pointer && strings.Contains(" "+decl[:star]+" ", " const ")
		out = append(out, p)
	}
	return out, nil
}

// restrictIf is the qualifier of a pointer parameter that may (false) or
// may not (true) alias another argument of the launch.
func restrictIf(ok bool) string {
	if ok {
		return "__restrict__ "
	}
	return ""
}

// aliasable reports whether value v, an argument of node n's kernels, may
// share its buffer with another argument: an input the node's in-place rule
// lets output 0 overwrite, or output 0 itself when there is such an input.
func aliasable(n *ir.Node, v *ir.Value) bool {
	ins := n.InPlaceInputs()
	if len(ins) == 0 {
		return false
	}
	if v == n.Outs[0] {
		return true
	}
	for _, i := range ins {
		if n.Ins[i] == v {
			return true
		}
	}
	return false
}

// checkRestrict verifies every launch of p: no argument that may alias
// another (aliasable) is passed to a __restrict__ parameter.
func checkRestrict(p *Program) error {
	kernels := map[string]*Kernel{}
	for _, k := range p.Kernels {
		kernels[k.Name] = k
	}
	for _, l := range p.Launches {
		k := kernels[l.Kernel]
		if len(k.Params) != len(l.Args) {
			return fmt.Errorf("codegen: kernel %s declares %d parameters, its launch passes %d", k.Name, len(k.Params), len(l.Args))
		}
		for i, a := range l.Args {
			if a.Kind == kernelarg.Buffer && k.Params[i].Restrict && aliasable(l.Node, a.Value) {
				return fmt.Errorf("codegen: kernel %s: parameter %q receives %s, which the memory plan may alias with another argument (%s is in place); it must not be __restrict__",
					k.Name, k.Params[i].Decl, a.Value, l.Node.Op)
			}
		}
	}
	return nil
}
