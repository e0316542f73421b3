package dsl

import (
	"errors"
	"fmt"
	"sort"
	"unicode/utf8"

	"github.com/alecthomas/participle/v2"
	plex "github.com/alecthomas/participle/v2/lexer"
)

// The translation of participle's errors into diagnostics. participle
// says which token does not fit (the grammar runs without lookahead, so
// it is the first such token); this file says what was expected there,
// in the user's terms ("," or ")" after the argument of relu(), and
// where: at that token, or just past the previous one when the token
// starts a later line (the end of the line missing a ")").
//
// What was expected follows from where the token stands: the innermost
// bracket open before it (the model's inputs, an input's dimensions, a
// call, a list, a block) and the token before it. participle accepted
// every token before this one, so one forward pass over them finds the
// open brackets.

const modelShape = "model NAME(image: f32[C,H,W], label: class[N]) { ... }"

const valueKinds = "a value (an op call, a name, a number, a size, a string or a list)"

// syntaxError returns the diagnostic for err, participle's error on the
// tokens toks (NL tokens included, EOF last).
func syntaxError(filename string, toks []plex.Token, err error) *Diagnostic {
	var perr participle.Error
	if !errors.As(err, &perr) {
		return Errorf(Pos{File: filename, Line: 1, Col: 1}, "syntax error: %v", err)
	}
	at := perr.Position().Offset
	var uerr *participle.UnexpectedTokenError
	if errors.As(err, &uerr) {
		at = uerr.Unexpected.Pos.Offset
	}
	k := sort.Search(len(toks), func(i int) bool { return toks[i].Pos.Offset >= at })
	for k < len(toks) && toks[k].Type == symNL {
		k++
	}
	if uerr == nil || k == len(toks) {
		// not a token that does not fit (participle's own limits)
		pos := fromLexer(perr.Position())
		if pos.Line == 0 {
			pos = Pos{File: filename, Line: 1, Col: 1}
		}
		return Errorf(pos, "syntax error: %s", perr.Message())
	}
	s := scanTo(toks, k)
	return s.expected()
}

// syntaxScan is where the token that does not fit stands.
type syntaxScan struct {
	toks       []plex.Token
	k          int   // the token that does not fit
	prev       int   // the token before it, or -1
	open       []int // brackets open before it, innermost last
	modelParen int   // the "(" of the model's inputs, or -1
	modelBrace int   // the "{" of the model block, or -1
	closed     int   // the opener of the last bracket closed before k, or -1
}

func scanTo(toks []plex.Token, k int) *syntaxScan {
	s := &syntaxScan{toks: toks, k: k, prev: -1, modelParen: -1, modelBrace: -1, closed: -1}
	n := 0 // tokens seen
	for i := 0; i < k; i++ {
		t := toks[i]
		if t.Type == symNL {
			continue
		}
		if t.Type == symPunct {
			switch t.Value {
			case "(", "[", "{":
				if t.Value == "(" && n == 2 && toks[s.nth(0)].Value == "model" {
					s.modelParen = i
				}
				if t.Value == "{" && s.modelBrace < 0 {
					s.modelBrace = i
				}
				s.open = append(s.open, i)
			case ")", "]", "}":
				if len(s.open) > 0 {
					s.closed = s.open[len(s.open)-1]
					s.open = s.open[:len(s.open)-1]
				}
			}
		}
		s.prev = i
		n++
	}
	return s
}

// nth is the index of the n-th token that is not NL (n from 0).
func (s *syntaxScan) nth(n int) int {
	for i, t := range s.toks {
		if t.Type != symNL {
			if n == 0 {
				return i
			}
			n--
		}
	}
	return len(s.toks) - 1
}

// before is the index of the n-th token before i that is not NL, or -1.
func (s *syntaxScan) before(i, n int) int {
	for i--; i >= 0; i-- {
		if s.toks[i].Type != symNL {
			if n--; n == 0 {
				return i
			}
		}
	}
	return -1
}

func (s *syntaxScan) text(i int) string {
	if i < 0 {
		return ""
	}
	return s.toks[i].Value
}

func (s *syntaxScan) isPunct(i int, texts ...string) bool {
	if i < 0 || s.toks[i].Type != symPunct {
		return false
	}
	for _, t := range texts {
		if s.toks[i].Value == t {
			return true
		}
	}
	return false
}

// expected is the diagnostic for the token at k, from where it stands.
func (s *syntaxScan) expected() *Diagnostic {
	tok, prev := s.toks[s.k], s.prev
	if prev < 0 { // the file's first token
		switch {
		case tok.EOF():
			return Errorf(Pos{File: tok.Pos.Filename, Line: 1, Col: 1}, "syntax error: the file holds no model: expected the model block, %s", modelShape)
		case isName(tok) && (tok.Value == "train" || tok.Value == "data"):
			return Errorf(fromLexer(tok.Pos), "syntax error: expected the model block first, found a %s block", tok.Value).Span(len(tok.Value)).
				Hint("a .cnn file starts with %s; train and data blocks follow it", modelShape)
		}
		return s.fail("the model block ("+modelShape+")", "a .cnn file starts with its model block; train and data blocks follow it")
	}
	if len(s.open) == 0 {
		return s.expectedAtTop()
	}
	opener := s.open[len(s.open)-1]
	switch s.toks[opener].Value {
	case "{":
		return s.expectedInBlock(opener)
	case "(":
		if opener == s.modelParen {
			return s.expectedInInputs()
		}
		name := s.text(s.before(opener, 1))
		switch {
		case s.isPunct(prev, "(", ","):
			return s.fail(fmt.Sprintf(`an argument or ")" to close %s(`, name))
		case s.isPunct(prev, "="):
			return s.fail(valueKinds)
		}
		return s.fail(fmt.Sprintf(`"," or ")" after the argument of %s(`, name))
	}
	if len(s.open) == 2 && s.open[0] == s.modelParen { // an input's dimensions
		if s.isPunct(prev, "[", ",") {
			return s.fail(valueKinds)
		}
		return s.fail(fmt.Sprintf(`"," or "]" after the dimension of %s`, s.text(s.before(opener, 3))))
	}
	if s.isPunct(prev, "[", ",") {
		p := s.toks[opener].Pos
		return s.fail(fmt.Sprintf(`a list element or "]" to close the list opened at %d:%d`, p.Line, p.Column))
	}
	return s.fail(`"," or "]" after the list element`)
}

// expectedAtTop: outside every bracket, between the model's parts or
// between blocks.
func (s *syntaxScan) expectedAtTop() *Diagnostic {
	prev := s.prev
	switch {
	case prev == s.nth(0):
		return s.fail("the model's name after model")
	case prev == s.nth(1):
		return s.fail(fmt.Sprintf(`"(" and the inputs of model %s`, s.text(prev)))
	case s.isPunct(prev, ")") && s.closed == s.modelParen:
		return s.fail(fmt.Sprintf(`"{" to open the model %s`, s.text(s.nth(1))))
	case s.isPunct(prev, "}"):
		hint := "a file holds one model block, then train and data blocks"
		if t := s.toks[s.k]; isName(t) && t.Value == "model" {
			return s.failAt("a train or data block", hint+"; a second model needs a file of its own")
		}
		return s.failAt("a train or data block (or the end of the file)", hint)
	}
	return s.fail(fmt.Sprintf(`"{" to open the %s block`, s.text(prev)))
}

// expectedInBlock: inside the model block or a train or data block.
func (s *syntaxScan) expectedInBlock(opener int) *Diagnostic {
	what := s.text(s.before(opener, 1)) + " block"
	if opener == s.modelBrace {
		what = "model " + s.text(s.nth(1))
	}
	prev := s.prev
	switch {
	case s.isPunct(prev, "="):
		return s.fail(valueKinds)
	case isName(s.toks[prev]) && !s.isPunct(s.before(prev, 1), "="): // a statement's name
		return s.fail(fmt.Sprintf(`"=" after %s`, s.text(prev)))
	case s.toks[s.k].EOF():
		p := s.toks[opener].Pos
		return s.fail(fmt.Sprintf(`"}" to close the %s opened at %d:%d`, what, p.Line, p.Column))
	}
	return s.failAt(fmt.Sprintf(`a statement (name = value) or "}" to close the %s`, what))
}

// expectedInInputs: inside the parentheses of the model's inputs.
func (s *syntaxScan) expectedInInputs() *Diagnostic {
	prev := s.prev
	switch {
	case s.isPunct(prev, "(", ","):
		return s.fail(`an input such as image: f32[3,32,32] or ")"`)
	case s.isPunct(prev, ":"):
		return s.fail(fmt.Sprintf("the type of input %s: f32[C,H,W] or class[N]", s.text(s.before(prev, 1))))
	case s.isPunct(prev, "]"):
		return s.fail(fmt.Sprintf(`"," or ")" after input %s`, s.text(s.before(s.closed, 3))))
	case s.isPunct(s.before(prev, 1), ":"): // the input's type
		return s.fail(fmt.Sprintf(`"[" and the dimensions of %s`, s.text(prev)))
	}
	return s.fail(fmt.Sprintf(`":" and the type of input %s`, s.text(prev)))
}

// fail says what was expected: at the token that does not fit when it is
// on the line of the previous token, else just past the previous token
// (the end of the line where it is missing).
func (s *syntaxScan) fail(what string, hints ...string) *Diagnostic {
	return s.failHere(what, false, hints)
}

// failAt is fail for a token that is itself wrong wherever it stands (it
// cannot start what must start there): the error points at it.
func (s *syntaxScan) failAt(what string, hints ...string) *Diagnostic {
	return s.failHere(what, true, hints)
}

func (s *syntaxScan) failHere(what string, atToken bool, hints []string) *Diagnostic {
	tok := s.toks[s.k]
	var d *Diagnostic
	switch {
	case s.prev < 0 || (atToken && !tok.EOF()):
		d = Errorf(fromLexer(tok.Pos), "syntax error: expected %s, found %s", what, describe(tok)).Span(len(tok.Value))
	case tok.EOF():
		d = Errorf(endOf(s.toks[s.prev]), "syntax error: expected %s, found the end of the file", what)
	case tok.Pos.Line > s.toks[s.prev].Pos.Line:
		d = Errorf(endOf(s.toks[s.prev]), "syntax error: expected %s at the end of this line", what).
			Hint("the next line starts with %s", describe(tok))
	default:
		d = Errorf(fromLexer(tok.Pos), "syntax error: expected %s, found %s", what, describe(tok)).Span(len(tok.Value))
	}
	for _, h := range hints {
		d.Hint("%s", h)
	}
	return d
}

// describe names a token in an error message: `"loss"`, `the end of the file`.
func describe(t plex.Token) string {
	if t.EOF() {
		return "the end of the file"
	}
	return fmt.Sprintf("%q", t.Value)
}

// endOf is the position just past a token (tokens never span lines).
func endOf(t plex.Token) Pos {
	p := fromLexer(t.Pos)
	p.Col += utf8.RuneCountInString(t.Value)
	p.Offset += len(t.Value)
	return p
}
