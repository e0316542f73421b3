package dsl

import (
	"fmt"
	"sort"
	"strings"
)

// Severity of a diagnostic.
type Severity int

const (
	SeverityError Severity = iota
	SeverityWarning
)

// Diagnostic is one positioned message about the user's source.
type Diagnostic struct {
	Severity Severity
	Pos      Pos
	// Len is the width of the underline (at least 1 caret).
	Len     int
	Message string
	// Hints are printed after the source excerpt, one per line.
	Hints []string
}

// Errorf makes an error diagnostic at pos.
func Errorf(pos Pos, format string, args ...any) *Diagnostic {
	return &Diagnostic{Severity: SeverityError, Pos: pos, Message: fmt.Sprintf(format, args...)}
}

// Warnf makes a warning diagnostic at pos.
func Warnf(pos Pos, format string, args ...any) *Diagnostic {
	return &Diagnostic{Severity: SeverityWarning, Pos: pos, Message: fmt.Sprintf(format, args...)}
}

// Hint appends a hint line and returns d, for chaining.
func (d *Diagnostic) Hint(format string, args ...any) *Diagnostic {
	d.Hints = append(d.Hints, fmt.Sprintf(format, args...))
	return d
}

// Span sets the underline width and returns d.
func (d *Diagnostic) Span(n int) *Diagnostic {
	d.Len = n
	return d
}

func (d *Diagnostic) Error() string {
	prefix := ""
	if d.Severity == SeverityWarning {
		prefix = "warning: "
	}
	return fmt.Sprintf("%s: %s%s", d.Pos, prefix, d.Message)
}

// Diagnostics is a list of diagnostics; as an error it stands for its errors.
type Diagnostics []*Diagnostic

func (ds Diagnostics) Error() string {
	var b strings.Builder
	for i, d := range ds {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(d.Error())
	}
	return b.String()
}

// HasErrors reports whether any diagnostic is an error.
func (ds Diagnostics) HasErrors() bool {
	for _, d := range ds {
		if d.Severity == SeverityError {
			return true
		}
	}
	return false
}

// Errors returns only the errors.
func (ds Diagnostics) Errors() Diagnostics {
	var out Diagnostics
	for _, d := range ds {
		if d.Severity == SeverityError {
			out = append(out, d)
		}
	}
	return out
}

// Sort orders diagnostics by position, keeping the order of equal positions.
func (ds Diagnostics) Sort() {
	sort.SliceStable(ds, func(i, j int) bool {
		a, b := ds[i].Pos, ds[j].Pos
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
}

// Render prints d in the compiler's format: "file:line:col: message", the
// offending source line, a caret under the token, then any hints.
// src is the text of d.Pos.File (may be nil, then no excerpt is shown).
func (d *Diagnostic) Render(src []byte) string {
	var b strings.Builder
	b.WriteString(d.Error())
	b.WriteByte('\n')
	if line, ok := sourceLine(src, d.Pos.Line); ok && d.Pos.Col > 0 {
		b.WriteString("    ")
		b.WriteString(strings.ReplaceAll(line, "\t", " "))
		b.WriteByte('\n')
		b.WriteString("    ")
		col := d.Pos.Col - 1
		if col > len(line) {
			col = len(line)
		}
		b.WriteString(strings.Repeat(" ", col))
		n := d.Len
		if n < 1 {
			n = 1
		}
		if col+n > len(line) && len(line) > col {
			n = len(line) - col
		}
		b.WriteByte('^')
		if n > 1 {
			b.WriteString(strings.Repeat("~", n-1))
		}
		b.WriteByte('\n')
	}
	for _, h := range d.Hints {
		b.WriteString("    ")
		b.WriteString(h)
		b.WriteByte('\n')
	}
	return b.String()
}

// RenderAll renders every diagnostic; sources maps a file name to its text.
func (ds Diagnostics) RenderAll(sources map[string][]byte) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.Render(sources[d.Pos.File]))
	}
	return b.String()
}

func sourceLine(src []byte, line int) (string, bool) {
	if src == nil || line < 1 {
		return "", false
	}
	lines := strings.Split(string(src), "\n")
	if line > len(lines) {
		return "", false
	}
	return strings.TrimRight(lines[line-1], "\r"), true
}
