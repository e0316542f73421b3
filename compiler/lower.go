package compiler

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
)

// Limits of the DSL ops' arguments (their files in compiler/ops hold them).
const (
	MaxConvKernel  = ops.MaxConvKernel
	MaxOutFeatures = ops.MaxOutFeatures
	MaxWindowArg   = ops.MaxWindowArg
)

// findDSLOp is the registered op a model writes as name.
func findDSLOp(name string) *ops.Def { return ops.ByDSLName(name) }

func dslOpNames() []string { return ops.DSLNames() }

// args are checked keyword arguments.
type args = ops.Args

// argSpec describes a keyword argument (ops.ArgSpec).
type argSpec = ops.ArgSpec

// checkArgs validates a call's keyword arguments against specs.
func checkArgs(what string, call *dsl.Call, specs []argSpec, diags *dsl.Diagnostics) args {
	out := args{}
	for _, a := range call.Args {
		if a.Key == "" {
			continue
		}
		var spec *argSpec
		for i := range specs {
			if specs[i].Name == a.Key {
				spec = &specs[i]
			}
		}
		if spec == nil {
			d := dsl.Errorf(a.Pos, "%s has no argument %q", what, a.Key).Span(len(a.Key))
			if s := suggest(a.Key, specNames(specs)); s != "" {
				d.Hint("did you mean %s=?", s)
			} else if len(specs) > 0 {
				d.Hint("%s takes %s", what, strings.Join(specNames(specs), ", "))
			} else {
				d.Hint("%s takes no keyword arguments", what)
			}
			*diags = append(*diags, d)
			continue
		}
		if out[a.Key] != nil {
			*diags = append(*diags, dsl.Errorf(a.Pos, "%s: argument %s given twice", what, a.Key).Span(len(a.Key)))
			continue
		}
		if d := checkValue(what, spec, a.Value); d != nil {
			*diags = append(*diags, d)
			continue
		}
		out[a.Key] = a.Value
	}
	for _, s := range specs {
		if s.Required && out[s.Name] == nil && !hasKey(call, s.Name) {
			*diags = append(*diags, dsl.Errorf(call.Pos, "%s needs %s=... (%s)", what, s.Name, s.Doc).Span(len(call.Name)))
		}
	}
	return out
}

func hasKey(call *dsl.Call, k string) bool {
	for _, a := range call.Args {
		if a.Key == k {
			return true
		}
	}
	return false
}

func specNames(specs []argSpec) []string {
	var n []string
	for _, s := range specs {
		n = append(n, s.Name)
	}
	return n
}

func exprSpan(e *dsl.Expr) int {
	if e.Text != "" {
		return len(e.Text)
	}
	if e.EndPos.Line == e.Pos.Line && e.EndPos.Col > e.Pos.Col {
		return e.EndPos.Col - e.Pos.Col
	}
	return 1
}

func checkValue(what string, s *argSpec, e *dsl.Expr) *dsl.Diagnostic {
	bad := func(format string, a ...any) *dsl.Diagnostic {
		return dsl.Errorf(e.Pos, "%s: %s %s", what, s.Name, fmt.Sprintf(format, a...)).Span(exprSpan(e))
	}
	checkInt := func(x *dsl.Expr) *dsl.Diagnostic {
		if x.Kind != dsl.ExprInt {
			return bad("must be an integer, got %s", describe(x))
		}
		if float64(x.Int) < s.Min {
			return dsl.Errorf(x.Pos, "%s: %s must be at least %g, got %d", what, s.Name, s.Min, x.Int).Span(exprSpan(x))
		}
		if s.MaxInt > 0 && x.Int > s.MaxInt {
			return dsl.Errorf(x.Pos, "%s: %s must be at most %s, got %s", what, s.Name, Commas(s.MaxInt), Commas(x.Int)).Span(exprSpan(x)).Hint("%s", s.MaxWhy)
		}
		return nil
	}
	checkNum := func(x *dsl.Expr) *dsl.Diagnostic {
		if x.Kind != dsl.ExprInt && x.Kind != dsl.ExprFloat {
			return bad("must be a number, got %s", describe(x))
		}
		v := ops.Number(x)
		if s.Positive && !(v > 0) {
			return dsl.Errorf(x.Pos, "%s: %s must be positive, got %s", what, s.Name, x.Text).Span(exprSpan(x))
		}
		if s.Positive && v < smallestNormalFloat32 {
			return dsl.Errorf(x.Pos, "%s: %s %s is below float32's smallest normal number (%.3g): the trainers compute in float32, where it would be 0 or lose its precision", what, s.Name, x.Text, smallestNormalFloat32).Span(exprSpan(x))
		}
		if math.Abs(v) > math.MaxFloat32 {
			return dsl.Errorf(x.Pos, "%s: %s %s is beyond float32's range (%.3g): the trainers compute in float32", what, s.Name, x.Text, math.MaxFloat32).Span(exprSpan(x))
		}
		if v < s.Min || (s.Max != 0 && v >= s.Max) {
			if s.Max != 0 {
				return dsl.Errorf(x.Pos, "%s: %s must be in [%g, %g), got %s", what, s.Name, s.Min, s.Max, x.Text).Span(exprSpan(x))
			}
			return dsl.Errorf(x.Pos, "%s: %s must be at least %g, got %s", what, s.Name, s.Min, x.Text).Span(exprSpan(x))
		}
		return nil
	}
	checkPair := func() *dsl.Diagnostic {
		if e.Kind == dsl.ExprList {
			if len(e.List) != 2 {
				return bad("must be one integer or a pair [h, w], got %d values", len(e.List))
			}
			for _, x := range e.List {
				if d := checkInt(x); d != nil {
					return d
				}
			}
			return nil
		}
		return checkInt(e)
	}
	switch s.Kind {
	case ops.ArgInt:
		return checkInt(e)
	case ops.ArgIntPair:
		return checkPair()
	case ops.ArgIntPairOrSame:
		if e.Kind == dsl.ExprString {
			if e.String != "same" {
				return bad("must be an integer, a pair [h, w] or \"same\", got \"%s\"", dsl.Printable(e.String))
			}
			return nil
		}
		return checkPair()
	case ops.ArgFloat:
		return checkNum(e)
	case ops.ArgFloatPair:
		if e.Kind != dsl.ExprList || len(e.List) != 2 {
			return bad("must be a pair [a, b], got %s", describe(e))
		}
		for _, x := range e.List {
			if d := checkNum(x); d != nil {
				return d
			}
		}
	case ops.ArgBool:
		if e.Kind != dsl.ExprIdent || (e.Ident != "true" && e.Ident != "false") {
			return bad("must be true or false, got %s", describe(e))
		}
	case ops.ArgString:
		if e.Kind != dsl.ExprString {
			return bad("must be a string, got %s", describe(e))
		}
	case ops.ArgSize:
		if e.Kind == dsl.ExprInt && e.Int >= 0 {
			e.Size = e.Int
			return nil
		}
		if e.Kind != dsl.ExprSize {
			return bad("must be a memory size such as 64MiB or 40MB, got %s", describe(e))
		}
	}
	return nil
}

// smallestNormalFloat32 is 2^-126: below it float32 loses precision (and
// below 2^-149 it is 0).
const smallestNormalFloat32 = 0x1p-126

func describe(e *dsl.Expr) string {
	switch e.Kind {
	case dsl.ExprCall:
		return "a call to " + e.Call.Name
	case dsl.ExprIdent:
		return "the name " + e.Ident
	case dsl.ExprList:
		return "a list"
	case dsl.ExprString:
		return "a string"
	}
	return e.Kind.String() + " " + e.Text
}

// lowerer builds the forward IR graph from the model AST.
type lowerer struct {
	g      *ir.Graph
	diags  dsl.Diagnostics
	values map[string]*ir.Value
	stmts  map[string]*dsl.Assign
	state  map[string]int // 0 unvisited, 1 in progress, 2 done
	path   []string
	stream int64
	// nested counts the statement's nested calls per op, for their names
	nested map[string]int
	// known caches the sorted names suggestions are drawn from; unknown
	// counts unknown names (only the first few get suggestions)
	known   []string
	unknown int
	// badInputs are inputs already reported (their uses are not)
	badInputs map[string]bool
}

// Lower builds the forward graph of f's model. Parameter and activation
// types are left for the shapes pass.
func Lower(f *dsl.File) (*ir.Graph, dsl.Diagnostics) {
	m := f.Model
	l := &lowerer{g: ir.NewGraph(m.Name), values: map[string]*ir.Value{}, stmts: map[string]*dsl.Assign{}, state: map[string]int{}}
	l.inputs(m)
	for _, s := range m.Stmts {
		if prev, ok := l.stmts[s.Name]; ok {
			l.diags = append(l.diags, dsl.Errorf(s.Pos, "%s is already defined at line %d", s.Name, prev.Pos.Line).Span(len(s.Name)))
			continue
		}
		if v, ok := l.values[s.Name]; ok {
			l.diags = append(l.diags, dsl.Errorf(s.Pos, "%s is already the name of a model input (line %d)", s.Name, v.Pos.Line).Span(len(s.Name)))
			continue
		}
		l.stmts[s.Name] = s
	}
	// Lower in dependency order, visiting statements in source order so
	// that a model written top-down keeps its order.
	for _, s := range m.Stmts {
		if l.stmts[s.Name] == s {
			l.visit(s)
		}
	}
	l.findLoss(m)
	return l.g, l.diags
}

func (l *lowerer) inputs(m *dsl.Model) {
	if len(m.Inputs) == 0 {
		l.diags = append(l.diags, dsl.Errorf(m.Pos, "model %s has no inputs", m.Name).
			Hint("declare them, e.g. model %s(image: f32[3,128,128], label: class[10])", m.Name))
	}
	l.badInputs = map[string]bool{}
	for _, in := range m.Inputs {
		l.badInputs[in.Name] = true // until it is added
		if _, dup := l.values[in.Name]; dup {
			l.diags = append(l.diags, dsl.Errorf(in.Pos, "input %s declared twice", in.Name).Span(len(in.Name)))
			continue
		}
		var dims []int64
		ok := true
		for _, d := range in.Dims {
			if d.Kind != dsl.ExprInt || d.Int < 1 {
				l.diags = append(l.diags, dsl.Errorf(d.Pos, "input %s: dimensions must be positive integers, got %s", in.Name, describe(d)).Span(exprSpan(d)))
				ok = false
				continue
			}
			dims = append(dims, d.Int)
		}
		if !ok {
			continue
		}
		var t ir.Type
		role := ir.RoleInput
		switch in.Type {
		case "f32":
			if len(dims) != 3 {
				l.diags = append(l.diags, dsl.Errorf(in.TypePos, "input %s: images are f32[C,H,W] (channels, height, width), got %d dimensions", in.Name, len(dims)).Span(len(in.Type)))
				continue
			}
			t = ir.F32Batched(dims...)
			if _, fits := ir.MulChecked(dims...); !fits {
				l.diags = append(l.diags, dsl.Errorf(in.TypePos, "input %s: f32[%s] has more than 2^40 elements per sample; no GPU can hold it", in.Name, strings.ReplaceAll(t.DimsString(), "x", ",")).Span(len(in.Type)))
				continue
			}
		case "class":
			if len(dims) != 1 {
				l.diags = append(l.diags, dsl.Errorf(in.TypePos, "input %s: labels are class[N] with N the number of classes", in.Name).Span(len(in.Type)))
				continue
			}
			if dims[0] > MaxClasses {
				l.diags = append(l.diags, dsl.Errorf(in.Dims[0].Pos, "input %s: class[%d] has more classes than the %s labels can name (int32 labels)", in.Name, dims[0], Commas(MaxClasses)).Span(exprSpan(in.Dims[0])))
				continue
			}
			t = ir.Type{DType: ir.Class, Batched: true, Classes: dims[0]}
			role = ir.RoleLabel
		default:
			d := dsl.Errorf(in.TypePos, "input %s: unknown type %q", in.Name, in.Type).Span(len(in.Type))
			d.Hint("inputs are images f32[C,H,W] or labels class[N]")
			l.diags = append(l.diags, d)
			continue
		}
		l.values[in.Name] = l.g.AddInput(in.Name, t, role, in.Pos)
		delete(l.badInputs, in.Name)
	}
	l.checkInputOrder(m)
}

// MaxClasses is the most classes a label may have: labels are int32.
const MaxClasses = 1<<31 - 1

// checkInputOrder: a model is an image classifier with two inputs, the
// image f32[C,H,W] first and its class labels second — what the fuse
// pass, the planner and the generated trainers read.
func (l *lowerer) checkInputOrder(m *dsl.Model) {
	want := []string{"f32", "class"}
	what := []string{"the image, f32[C,H,W]", "the labels, class[N]"}
	for i, in := range m.Inputs {
		switch {
		case i >= len(want):
			l.diags = append(l.diags, dsl.Errorf(in.Pos, "model %s takes two inputs, an image and its labels; %s is a third", m.Name, in.Name).Span(len(in.Name)).
				Hint("declare model %s(image: f32[C,H,W], label: class[N])", m.Name))
		case in.Type != want[i] && (in.Type == "f32" || in.Type == "class"):
			l.diags = append(l.diags, dsl.Errorf(in.TypePos, "input %d of model %s must be %s; %s is %s[...]", i+1, m.Name, what[i], in.Name, in.Type).Span(len(in.Type)).
				Hint("declare model %s(image: f32[C,H,W], label: class[N])", m.Name))
		}
	}
	if len(m.Inputs) == 1 && m.Inputs[0].Type == "f32" {
		l.diags = append(l.diags, dsl.Errorf(m.Inputs[0].Pos, "model %s has no labels: declare them after the image, e.g. label: class[10]", m.Name).Span(len(m.Inputs[0].Name)))
	}
}

// visit lowers statement s after the statements it reads.
func (l *lowerer) visit(s *dsl.Assign) *ir.Value {
	switch l.state[s.Name] {
	case 2:
		return l.values[s.Name]
	case 1:
		i := 0
		for l.path[i] != s.Name {
			i++
		}
		cycle := append(append([]string{}, l.path[i:]...), s.Name)
		l.diags = append(l.diags, dsl.Errorf(s.Pos, "%s depends on itself: %s", s.Name, strings.Join(cycle, " -> ")).Span(len(s.Name)).
			Hint("a model is a directed acyclic graph: every layer must read only earlier layers"))
		return nil
	}
	l.state[s.Name] = 1
	l.path = append(l.path, s.Name)
	outer := l.nested // a statement read before its line is lowered inside another
	l.nested = nil
	v := l.tensor(s.Value, s.Name, l.layerNames(s))
	l.nested = outer
	l.path = l.path[:len(l.path)-1]
	l.state[s.Name] = 2
	if v != nil {
		l.values[s.Name] = v
	}
	return v
}

// layerNames names the parametric calls of a statement: the statement's
// name when it has one parametric call (so `fc1 = linear(...)` owns
// fc1.weight, as in PyTorch), else name_op_i.
func (l *lowerer) layerNames(s *dsl.Assign) map[*dsl.Call]string {
	var calls []*dsl.Call
	var walk func(e *dsl.Expr)
	walk = func(e *dsl.Expr) {
		if e.Kind != dsl.ExprCall {
			return
		}
		if o := findDSLOp(e.Call.Name); o != nil && (o.DSL.Params != nil || o.DSL.Buffers != nil) {
			calls = append(calls, e.Call)
		}
		for _, a := range e.Call.Args {
			walk(a.Value)
		}
	}
	walk(s.Value)
	names := map[*dsl.Call]string{}
	for i, c := range calls {
		if len(calls) == 1 {
			names[c] = s.Name
		} else {
			names[c] = fmt.Sprintf("%s_%s%d", s.Name, c.Name, i)
		}
	}
	return names
}

// tensor lowers an expression that must produce a tensor.
func (l *lowerer) tensor(e *dsl.Expr, name string, layers map[*dsl.Call]string) *ir.Value {
	switch e.Kind {
	case dsl.ExprIdent:
		if v, ok := l.values[e.Ident]; ok {
			return v
		}
		if s, ok := l.stmts[e.Ident]; ok {
			return l.visit(s)
		}
		if l.badInputs[e.Ident] {
			return nil // its declaration is reported
		}
		d := dsl.Errorf(e.Pos, "unknown name %s", e.Ident).Span(len(e.Ident))
		if l.unknown++; l.unknown <= maxSuggestions {
			if s := suggest(e.Ident, l.knownNames()); s != "" {
				d.Hint("did you mean %s?", s)
			}
		}
		l.diags = append(l.diags, d)
		return nil
	case dsl.ExprCall:
		return l.call(e.Call, name, layers)
	}
	l.diags = append(l.diags, dsl.Errorf(e.Pos, "expected a tensor (a layer or input name, or an op call), got %s", describe(e)).Span(exprSpan(e)))
	return nil
}

// maxSuggestions bounds the "did you mean" searches (each compares with
// every name), so that a file of unknown names stays linear.
const maxSuggestions = 20

func (l *lowerer) knownNames() []string {
	if l.known != nil {
		return l.known
	}
	var names []string
	for n := range l.values {
		names = append(names, n)
	}
	for n := range l.stmts {
		names = append(names, n)
	}
	sort.Strings(names)
	l.known = names
	return names
}

func (l *lowerer) call(c *dsl.Call, name string, layers map[*dsl.Call]string) *ir.Value {
	o := findDSLOp(c.Name)
	if o == nil {
		d := dsl.Errorf(c.Pos, "unknown op %s", c.Name).Span(len(c.Name))
		if s := suggest(c.Name, dslOpNames()); s != "" {
			d.Hint("did you mean %s?", s)
		} else {
			d.Hint("ops: %s", strings.Join(dslOpNames(), ", "))
		}
		l.diags = append(l.diags, d)
		return nil
	}
	sig := o.DSL
	pos := c.Positional()
	switch {
	case sig.Variadic && len(pos) < sig.Tensors:
		l.diags = append(l.diags, dsl.Errorf(c.Pos, "%s takes at least %d tensor arguments, got %d", c.Name, sig.Tensors, len(pos)).Span(len(c.Name)))
		return nil
	case !sig.Variadic && len(pos) != sig.Tensors:
		l.diags = append(l.diags, dsl.Errorf(c.Pos, "%s takes %d tensor argument%s, got %d", c.Name, sig.Tensors, plural(sig.Tensors), len(pos)).Span(len(c.Name)))
		return nil
	}
	before := len(l.diags)
	a := checkArgs(c.Name, c, sig.Args, &l.diags)
	var attrs ir.Attrs
	if len(l.diags) == before && sig.Attrs != nil {
		var err error
		if attrs, err = sig.Attrs(a); err != nil {
			l.diags = append(l.diags, argDiagnostic(c, a, err))
		}
	}
	var ins []*ir.Value
	ok := len(l.diags) == before
	for _, p := range pos {
		// a nested call is named after its statement: fc1.flatten
		v := l.tensor(p.Value, l.nestedName(p.Value), layers)
		if v == nil {
			ok = false
		}
		ins = append(ins, v)
	}
	if !ok {
		return nil
	}
	if o.Random {
		attrs.Stream = l.stream
		l.stream++
	}
	layer := name
	if ln, ok := layers[c]; ok {
		layer = ln
	}
	if sig.Params != nil {
		// fan-ins are known after the shapes pass
		for _, ps := range sig.Params(a) {
			ins = append(ins, l.g.AddParam(layer, ps.Suffix, ir.Init{Kind: ps.Init}, c.Pos).Value)
		}
	}
	if sig.Buffers != nil {
		for _, ps := range sig.Buffers(a) {
			ins = append(ins, l.g.AddBuffer(layer, ps.Suffix, ir.Init{Kind: ps.Init}, c.Pos).Value)
		}
	}
	n := l.g.NewNode(o.Op, layer, ir.Forward, c.Pos, ins, []string{name}, ir.RoleActivation)
	n.Attrs = attrs
	if sig.Expand == nil {
		l.g.Append(n)
		return n.Out()
	}
	nodes := sig.Expand(n, l.g)
	for _, m := range nodes {
		l.g.Append(m)
	}
	return nodes[len(nodes)-1].Out()
}

// argDiagnostic positions an error of an op's attribute rule at the
// argument it concerns (an *ops.ArgError), else at the call.
func argDiagnostic(c *dsl.Call, a args, err error) *dsl.Diagnostic {
	var ae *ops.ArgError
	if errors.As(err, &ae) {
		if e := a[ae.Arg]; e != nil {
			return dsl.Errorf(e.Pos, "%s: %s", c.Name, ae.Msg).Span(exprSpan(e))
		}
	}
	return dsl.Errorf(c.Pos, "%s: %v", c.Name, err).Span(len(c.Name))
}

// nestedName names a nested call's output after its statement and op —
// fc1.flatten — numbering further calls of one op in the statement
// (a.relu, a.relu_2, ...), so that names stay short and unique however
// deep calls nest. Other expressions keep the statement's name.
func (l *lowerer) nestedName(e *dsl.Expr) string {
	stmt := l.path[len(l.path)-1]
	if e.Kind != dsl.ExprCall {
		return stmt
	}
	op := e.Call.Name
	if l.nested == nil {
		l.nested = map[string]int{}
	}
	l.nested[op]++
	if k := l.nested[op]; k > 1 {
		return fmt.Sprintf("%s.%s_%d", stmt, op, k)
	}
	return stmt + "." + op
}

// findLoss marks the model's loss: exactly one cross_entropy result.
func (l *lowerer) findLoss(m *dsl.Model) {
	if l.diags.HasErrors() {
		return
	}
	var losses []*ir.Node
	for _, n := range l.g.Nodes {
		if n.Op.Info().Loss {
			losses = append(losses, n)
		}
	}
	switch {
	case len(losses) == 0:
		l.diags = append(l.diags, dsl.Errorf(m.Pos, "model %s has no loss", m.Name).Span(len("model")).
			Hint("add one as the last statement, e.g. loss = cross_entropy(logits, label)"))
	case len(losses) > 1:
		l.diags = append(l.diags, dsl.Errorf(losses[1].Pos, "model %s has a second loss; cnnc trains one cross_entropy", m.Name).Span(len("cross_entropy")).
			Hint("the first is at line %d", losses[0].Pos.Line))
	default:
		l.g.Loss = losses[0].Out()
		l.g.Loss.Role = ir.RoleLoss
		l.g.Logits = losses[0].Ins[0]
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// suggest returns the candidate closest to s by edit distance, if close.
func suggest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	if bestD > max(1, len(s)/3) {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and adjacent transpositions ("sdg" -> "sgd")
// each cost 1.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
