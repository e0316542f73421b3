package dsl

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// tokKind is a token's class.
type tokKind uint8

const (
	tokEOF    tokKind = iota
	tokIdent          // conv1, model, true
	tokInt            // 42, -1
	tokFloat          // 0.9, 1e-3, .5
	tokSize           // 64MiB, 1.5GB
	tokString         // "data/train"
	tokPunct          // ( ) { } [ ] , = : ;
)

// token is one lexeme; end is the position just past it.
type token struct {
	kind     tokKind
	text     string
	pos, end Pos
}

// sizeUnits are the memory-size suffixes the lexer reads (units.ParseSize
// gives their values); longer suffixes first so "MiB" is not read as "B".
var sizeUnits = []string{"KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB", "B"}

// lexer turns source bytes into tokens in one pass. Columns count runes
// (1-based), so that a caret under a token lines up in a terminal.
type lexer struct {
	file      string
	src       []byte
	off       int
	line, col int
}

func newLexer(file string, src []byte) *lexer {
	return &lexer{file: file, src: src, line: 1, col: 1}
}

func (l *lexer) pos() Pos { return Pos{File: l.file, Line: l.line, Col: l.col, Offset: l.off} }

// advance moves past n bytes of one line (no newline among them).
func (l *lexer) advance(n int) {
	l.col += utf8.RuneCount(l.src[l.off : l.off+n])
	l.off += n
}

func isIdentStart(c byte) bool { return c == '_' || (c|0x20) >= 'a' && (c|0x20) <= 'z' }
func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }

// next returns the next token, or a diagnostic for text no token matches.
func (l *lexer) next() (token, *Diagnostic) {
	l.skipSpaceAndComments()
	start := l.pos()
	if l.off >= len(l.src) {
		return token{kind: tokEOF, pos: start, end: start}, nil
	}
	c := l.src[l.off]
	n, kind := 0, tokPunct
	switch {
	case strings.IndexByte("(){}[],=:;", c) >= 0:
		n = 1
	case isIdentStart(c):
		for n < len(l.src)-l.off && isIdentChar(l.src[l.off+n]) {
			n++
		}
		kind = tokIdent
	case isDigit(c) || c == '.' || (c == '-' && l.off+1 < len(l.src) && (isDigit(l.src[l.off+1]) || l.src[l.off+1] == '.')):
		var d *Diagnostic
		n, kind, d = l.number()
		if d != nil {
			return token{}, d
		}
	case c == '"':
		var d *Diagnostic
		if n, d = l.str(); d != nil {
			return token{}, d
		}
		kind = tokString
	default:
		r, _ := utf8.DecodeRune(l.src[l.off:])
		what := fmt.Sprintf("%q", string(r))
		if r == utf8.RuneError {
			what = fmt.Sprintf("byte 0x%02x (the file is not UTF-8 text)", c)
		}
		return token{}, Errorf(start, "syntax error: invalid character %s", what)
	}
	text := string(l.src[l.off : l.off+n])
	l.advance(n)
	return token{kind: kind, text: text, pos: start, end: l.pos()}, nil
}

func (l *lexer) skipSpaceAndComments() {
	for l.off < len(l.src) {
		switch c := l.src[l.off]; {
		case c == '\n':
			l.off++
			l.line++
			l.col = 1
		case c == ' ' || c == '\t' || c == '\r':
			l.off++
			l.col++
		case c == '#' || (c == '/' && l.off+1 < len(l.src) && l.src[l.off+1] == '/'):
			end := l.off
			for end < len(l.src) && l.src[end] != '\n' {
				end++
			}
			l.advance(end - l.off)
		default:
			return
		}
	}
}

// number reads an integer, a float (0.9, 1e-3, .5, 2.) or a memory size
// (64MiB, 1.5GB) at the current offset and returns its length. A number
// run into letters ("3x3", "64Mib") is an error naming the whole run.
func (l *lexer) number() (int, tokKind, *Diagnostic) {
	s := l.src[l.off:]
	i := 0
	if s[0] == '-' {
		i++
	}
	digits := func() int {
		j := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		return i - j
	}
	intDigits := digits()
	kind := tokInt
	fracDigits := 0
	if i < len(s) && s[i] == '.' {
		i++
		fracDigits = digits()
		kind = tokFloat
		if intDigits == 0 && fracDigits == 0 {
			return 0, 0, Errorf(l.pos(), "syntax error: invalid character %q", string(s[:i]))
		}
	}
	mantissa := i
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			i = j
			digits()
			kind = tokFloat
		}
	}
	if i == mantissa && s[0] != '-' && (kind == tokInt || fracDigits > 0) {
		for _, u := range sizeUnits {
			if strings.HasPrefix(string(s[i:min(len(s), i+len(u))]), u) && (i+len(u) == len(s) || !isIdentChar(s[i+len(u)])) {
				return i + len(u), tokSize, nil
			}
		}
	}
	if i < len(s) && (isIdentChar(s[i]) || s[i] == '.') {
		end := i
		for end < len(s) && (isIdentChar(s[end]) || s[end] == '.') {
			end++
		}
		run := string(s[:end])
		d := Errorf(l.pos(), "syntax error: %q is not a number", run).Span(utf8.RuneCountInString(run))
		suffix := strings.ToLower(string(s[mantissa:end]))
		for _, u := range sizeUnits {
			if suffix == strings.ToLower(u) {
				d.Message = fmt.Sprintf("syntax error: %q is not a memory size", run)
				if s[0] == '-' {
					d.Message += ": sizes cannot be negative"
				}
				d.Hint("memory sizes are written like 64MiB or 40MB: units B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024)")
				return 0, 0, d
			}
		}
		if s[0] != '-' && kind == tokInt && end > i && (s[i] == 'x' || s[i] == 'X') {
			d.Hint("a kernel or stride of two sizes is a list: [3, 5]")
		}
		return 0, 0, d
	}
	return i, kind, nil
}

// str reads a string literal: double quotes around any characters but a
// newline, with backslash escapes.
func (l *lexer) str() (int, *Diagnostic) {
	s := l.src[l.off:]
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		case '\n':
			i = len(s)
		}
	}
	return 0, Errorf(l.pos(), "syntax error: unterminated string: a string starts and ends with \" on one line")
}
