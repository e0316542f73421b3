package ops

import (
	"fmt"
	"math"
	"strings"
)

// The op and optimizer tables of docs/dsl.md are generated from the
// registry: the docs cannot drift from what the compiler accepts. The
// registry's tests compare the file with them, and rewrite it with
// -update (go test ./compiler/ops -run TestDocs -update).

// Markers around the generated tables in docs/dsl.md.
const (
	OpTableBegin        = "<!-- op table: generated from compiler/ops (go test ./compiler/ops -run TestDocs -update); edit the op files, not this table -->"
	OpTableEnd          = "<!-- end of the op table -->"
	OptimizerTableBegin = "<!-- optimizer table: generated from compiler/ops (go test ./compiler/ops -run TestDocs -update) -->"
	OptimizerTableEnd   = "<!-- end of the optimizer table -->"
)

// OpTable is the markdown table of the DSL's ops.
func OpTable() string {
	var b strings.Builder
	b.WriteString("| op | arguments | input -> output | parameters | PyTorch |\n|---|---|---|---|---|\n")
	for _, d := range DSLOps() {
		s := d.DSL
		call := "`" + callText(s) + "`"
		if len(s.Aliases) > 0 {
			call += ", alias `" + strings.Join(s.Aliases, "`, `") + "`"
		}
		params := s.ParamDoc
		if params == "" {
			params = "—"
		}
		pt := s.PyTorch
		if pt == "" {
			pt = "—"
		} else if !strings.HasPrefix(pt, "`") {
			pt = "`" + pt + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", call, argsText(s.Args), s.Shape, params, pt)
	}
	return b.String()
}

// OptimizerTable is the markdown table of the optimizers.
func OptimizerTable() string {
	var b strings.Builder
	b.WriteString("| optimizer | arguments | PyTorch |\n|---|---|---|\n")
	for _, o := range Optimizers() {
		fmt.Fprintf(&b, "| `%s` — %s | %s | `%s` |\n", o.Name, o.Doc, argsText(o.Args), o.PyTorch)
	}
	return b.String()
}

func callText(s *DSL) string {
	tensors := []string{"x"}
	switch {
	case s.TensorNames != nil:
		tensors = append([]string(nil), s.TensorNames...)
	case s.Variadic:
		tensors = []string{"a", "b", "..."}
	case s.Tensors == 2:
		tensors = []string{"a", "b"}
	}
	if len(s.Args) > 0 {
		tensors = append(tensors, "...")
	}
	return s.Name + "(" + strings.Join(tensors, ", ") + ")"
}

// argsText documents each argument: name, what it is, required or its
// default, its bounds.
func argsText(args []ArgSpec) string {
	if len(args) == 0 {
		return "—"
	}
	var parts []string
	for _, a := range args {
		var notes []string
		switch {
		case a.Required:
			notes = append(notes, "required")
		case a.Default != "":
			notes = append(notes, "default "+a.Default)
		}
		switch a.Kind {
		case ArgIntPair:
			notes = append(notes, "`k` or `[kh,kw]`")
		case ArgIntPairOrSame:
			notes = append(notes, "`k`, `[kh,kw]` or `\"same\"`")
		}
		if a.MaxInt > 0 {
			notes = append(notes, "at most "+commas(a.MaxInt))
		}
		if a.Positive {
			notes = append(notes, "positive")
		} else if a.Kind == ArgFloat || a.Kind == ArgFloatPair {
			switch {
			case a.Max != 0:
				notes = append(notes, fmt.Sprintf("in [%g, %g)", a.Min, a.Max))
			case math.IsInf(a.Min, -1):
			case a.Min != 0 || a.Kind == ArgFloat:
				notes = append(notes, fmt.Sprintf("at least %g", a.Min))
			}
		}
		if a.Note != "" {
			notes = append(notes, a.Note)
		}
		parts = append(parts, fmt.Sprintf("`%s`: %s (%s)", a.Name, a.Doc, strings.Join(notes, "; ")))
	}
	return strings.Join(parts, "<br>")
}

func commas(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ReplaceTables returns doc with the text between each pair of markers
// replaced by the generated table, or an error naming a missing marker.
func ReplaceTables(doc string) (string, error) {
	var err error
	for _, t := range []struct{ begin, end, table string }{
		{OpTableBegin, OpTableEnd, OpTable()},
		{OptimizerTableBegin, OptimizerTableEnd, OptimizerTable()},
	} {
		if doc, err = replaceBetween(doc, t.begin, t.end, t.table); err != nil {
			return "", err
		}
	}
	return doc, nil
}

func replaceBetween(doc, begin, end, body string) (string, error) {
	i := strings.Index(doc, begin)
	if i < 0 {
		return "", fmt.Errorf("no marker %q", begin)
	}
	j := strings.Index(doc[i:], end)
	if j < 0 {
		return "", fmt.Errorf("no marker %q after %q", end, begin)
	}
	j += i
	return doc[:i+len(begin)] + "\n" + body + doc[j:], nil
}
