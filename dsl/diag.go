package dsl

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
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
// Control characters, invalid UTF-8 and bidirectional-text controls from
// the file (in a comment, a string, the file's name) are shown escaped
// (\x1b, \u202e), never sent to the terminal as they are.
func (d *Diagnostic) Render(src []byte) string {
	return d.render(newLineIndex(src))
}

func (d *Diagnostic) render(lines *lineIndex) string {
	var b strings.Builder
	b.WriteString(Printable(d.Error()))
	b.WriteByte('\n')
	if line, ok := lines.line(d.Pos.Line); ok && d.Pos.Col > 0 {
		shown, caret, width := excerpt(line, d.Pos.Col-1, max(d.Len, 1))
		b.WriteString("    ")
		b.WriteString(shown)
		b.WriteByte('\n')
		b.WriteString("    ")
		b.WriteString(strings.Repeat(" ", caret))
		b.WriteByte('^')
		if width > 1 {
			b.WriteString(strings.Repeat("~", width-1))
		}
		b.WriteByte('\n')
	}
	for _, h := range d.Hints {
		b.WriteString("    ")
		b.WriteString(Printable(h))
		b.WriteByte('\n')
	}
	return b.String()
}

// RenderAll renders every diagnostic; sources maps a file name to its text.
// Each source is indexed once, so the time is linear in the sources and
// the output.
func (ds Diagnostics) RenderAll(sources map[string][]byte) string {
	var b strings.Builder
	index := map[string]*lineIndex{}
	for _, d := range ds {
		li, ok := index[d.Pos.File]
		if !ok {
			li = newLineIndex(sources[d.Pos.File])
			index[d.Pos.File] = li
		}
		b.WriteString(d.render(li))
	}
	return b.String()
}

// lineIndex finds a source's lines by number.
type lineIndex struct {
	src    []byte
	starts []int // byte offset of each line
}

func newLineIndex(src []byte) *lineIndex {
	li := &lineIndex{src: src}
	if src == nil {
		return li
	}
	li.starts = append(li.starts, 0)
	for i, c := range src {
		if c == '\n' {
			li.starts = append(li.starts, i+1)
		}
	}
	return li
}

// line returns line n (1-based) without its line ending.
func (li *lineIndex) line(n int) (string, bool) {
	if n < 1 || n > len(li.starts) {
		return "", false
	}
	end := len(li.src)
	if n < len(li.starts) {
		end = li.starts[n] - 1
	}
	return strings.TrimRight(string(li.src[li.starts[n-1]:end]), "\r"), true
}

// maxExcerpt is the widest source excerpt shown: of a longer line (a
// generated model may put a megabyte on one), the part around the caret.
const maxExcerpt = 120

// excerpt escapes a source line for the terminal (a tab shows as one
// space), cut to maxExcerpt columns around rune col with "..." where cut,
// and returns it with the caret's display column and the underline's
// width for n runes from col: carets count runes, not bytes.
func excerpt(line string, col, n int) (shown string, caret, width int) {
	var pieces []string
	cols := []int{0} // cols[i]: display column where rune i starts
	for _, r := range line {
		p := " "
		if r != '\t' {
			p = printableRune(r)
		}
		pieces = append(pieces, p)
		cols = append(cols, cols[len(cols)-1]+utf8.RuneCountInString(p))
	}
	last := len(pieces) // the position just past the line
	col = min(col, last)
	end := min(col+n, last)
	lo, hi := 0, last
	if cols[last] > maxExcerpt {
		for lo < col && cols[col]-cols[lo] > maxExcerpt/3 {
			lo++
		}
		for hi > lo && cols[hi]-cols[lo] > maxExcerpt {
			hi--
		}
	}
	var b strings.Builder
	if lo > 0 {
		b.WriteString("...")
	}
	shift := b.Len() - cols[lo]
	for _, p := range pieces[lo:hi] {
		b.WriteString(p)
	}
	if hi < last {
		b.WriteString("...")
	}
	return b.String(), cols[col] + shift, max(cols[min(end, hi)]-cols[col], 1)
}

// Printable returns s with every character a terminal would act on rather
// than show — C0 and C1 control characters (ESC starts colour codes and
// cursor moves), DEL, invalid UTF-8 bytes, line and paragraph separators,
// and bidirectional-text controls (which reorder what is shown) — written
// as Go escapes: "\x1b[31m" prints as \x1b[31m. Other text is unchanged.
func Printable(s string) string {
	clean := true
	for _, r := range s {
		if printableRune(r) != string(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "\\x%02x", s[i])
		} else {
			b.WriteString(printableRune(r))
		}
		i += n
	}
	return b.String()
}

func printableRune(r rune) string {
	switch {
	case r == utf8.RuneError:
		return `\ufffd`
	case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
		return fmt.Sprintf(`\x%02x`, r)
	case r == 0x2028 || r == 0x2029 || r == 0x200e || r == 0x200f || r == 0x061c ||
		(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0xfeff:
		return fmt.Sprintf(`\u%04x`, r)
	}
	return string(r)
}
