package dsl

import (
	"fmt"
	"math"
	"strconv"

	"github.com/cnnc/cnnc/runtime/units"
)

// The grammar (a .cnn file), read by recursive descent with one token of
// lookahead (two to tell a keyword argument from a positional one):
//
//	file    = model { section }
//	model   = "model" Ident "(" [ input { "," input } [ "," ] ] ")" "{" { assign } "}"
//	input   = Ident ":" Ident "[" expr { "," expr } [ "," ] "]"
//	section = ( "train" | "data" ) "{" { assign } "}"
//	assign  = Ident "=" expr [ ";" ]
//	expr    = call | Size | Float | Int | String | list | Ident
//	call    = Ident "(" [ arg { "," arg } [ "," ] ] ")"
//	arg     = [ Ident "=" ] expr
//	list    = "[" [ expr { "," expr } [ "," ] ] "]"
//
// Newlines matter in one place only: a statement's value starts on the
// line of its "=" (so a missing value is reported on that line). A syntax
// error names what was expected where it is missing: when the
// token that does not fit starts a later line, the error points just past
// the last token that did (the end of the line missing a ")"), not at the
// next line.

// MaxNesting bounds how deeply calls and lists may nest (each level is a
// few stack frames in every stage that walks expressions).
const MaxNesting = 200_000

// Parse parses a .cnn file. On failure the error is Diagnostics.
func Parse(filename string, src []byte) (*File, error) {
	if len(src) > MaxSourceBytes {
		return nil, Diagnostics{Errorf(Pos{File: filename, Line: 1, Col: 1}, "the file has %d bytes; a model file may have at most %d (%s)",
			len(src), MaxSourceBytes, units.FormatBytes(MaxSourceBytes))}
	}
	p := &parser{lex: newLexer(filename, src), file: filename}
	f, d := p.parseFile()
	if d != nil {
		return nil, Diagnostics{d}
	}
	if len(p.diags) > 0 {
		return nil, p.diags
	}
	return f, nil
}

// parser holds the current token and the previous one (whose end is where
// a missing token belongs when the current one starts a later line).
type parser struct {
	lex   *lexer
	file  string
	tok   token
	prev  token
	peek  *token
	depth int
	diags Diagnostics // value errors (numbers out of range); parsing goes on
}

// bail carries a syntax error up the recursion: the parser stops at the
// first one.
type bail struct{ d *Diagnostic }

func (p *parser) parseFile() (f *File, d *Diagnostic) {
	defer func() {
		if r := recover(); r != nil {
			b, ok := r.(bail)
			if !ok {
				panic(r)
			}
			f, d = nil, b.d
		}
	}()
	p.advance()
	f = &File{Name: p.file}
	f.Model = p.model()
	for p.tok.kind != tokEOF {
		f.Sections = append(f.Sections, p.section())
	}
	return f, nil
}

func (p *parser) advance() {
	p.prev = p.tok
	if p.peek != nil {
		p.tok, p.peek = *p.peek, nil
		return
	}
	t, d := p.lex.next()
	if d != nil {
		panic(bail{d})
	}
	p.tok = t
}

func (p *parser) lookahead() token {
	if p.peek == nil {
		t, d := p.lex.next()
		if d != nil {
			panic(bail{d})
		}
		p.peek = &t
	}
	return *p.peek
}

func (p *parser) is(text string) bool {
	return (p.tok.kind == tokPunct || p.tok.kind == tokIdent) && p.tok.text == text
}

// fail stops parsing with "expected WHAT": at the token that does not
// fit when it is on the line of the previous token, else just past the
// previous token (the end of the line where WHAT is missing).
func (p *parser) fail(what string, hints ...string) { p.failHere(what, false, hints...) }

// failAt is fail for a token that is itself wrong wherever it stands (it
// cannot start what must start there): the error points at it.
func (p *parser) failAt(what string, hints ...string) { p.failHere(what, true, hints...) }

func (p *parser) failHere(what string, atToken bool, hints ...string) {
	var d *Diagnostic
	switch {
	case p.prev.pos.Line == 0 || (atToken && p.tok.kind != tokEOF): // nothing read yet, or the token is the fault
		d = Errorf(p.tok.pos, "syntax error: expected %s, found %s", what, p.tok.describe()).Span(len(p.tok.text))
	case p.tok.kind == tokEOF:
		d = Errorf(p.prev.end, "syntax error: expected %s, found the end of the file", what)
	case p.tok.pos.Line > p.prev.end.Line:
		d = Errorf(p.prev.end, "syntax error: expected %s at the end of this line", what).
			Hint("the next line starts with %s", p.tok.describe())
	default:
		d = Errorf(p.tok.pos, "syntax error: expected %s, found %s", what, p.tok.describe()).Span(len(p.tok.text))
	}
	for _, h := range hints {
		d.Hint("%s", h)
	}
	panic(bail{d})
}

// expect consumes the punctuation text or fails with what.
func (p *parser) expect(text, what string) token {
	if p.tok.kind != tokPunct || p.tok.text != text {
		p.fail(what)
	}
	t := p.tok
	p.advance()
	return t
}

func (p *parser) ident(what string) token {
	if p.tok.kind != tokIdent {
		p.fail(what)
	}
	t := p.tok
	p.advance()
	return t
}

const modelShape = "model NAME(image: f32[C,H,W], label: class[N]) { ... }"

func (p *parser) model() *Model {
	switch {
	case p.tok.kind == tokEOF:
		panic(bail{Errorf(Pos{File: p.file, Line: 1, Col: 1}, "syntax error: the file holds no model: expected the model block, %s", modelShape)})
	case p.is("train") || p.is("data"):
		panic(bail{Errorf(p.tok.pos, "syntax error: expected the model block first, found a %s block", p.tok.text).Span(len(p.tok.text)).
			Hint("a .cnn file starts with %s; train and data blocks follow it", modelShape)})
	case !p.is("model"):
		p.fail("the model block ("+modelShape+")", "a .cnn file starts with its model block; train and data blocks follow it")
	}
	m := &Model{Pos: p.tok.pos}
	p.advance()
	m.Name = p.ident("the model's name after model").text
	p.expect("(", fmt.Sprintf(`"(" and the inputs of model %s`, m.Name))
	for !p.is(")") {
		m.Inputs = append(m.Inputs, p.input())
		if !p.is(",") {
			if !p.is(")") {
				p.fail(fmt.Sprintf(`"," or ")" after input %s`, m.Inputs[len(m.Inputs)-1].Name))
			}
			break
		}
		p.advance()
	}
	p.advance()
	m.Stmts, m.End = p.block("model " + m.Name)
	return m
}

func (p *parser) input() *Input {
	if p.tok.kind != tokIdent {
		p.fail(`an input such as image: f32[3,32,32] or ")"`)
	}
	in := &Input{Pos: p.tok.pos, Name: p.tok.text}
	p.advance()
	p.expect(":", fmt.Sprintf(`":" and the type of input %s`, in.Name))
	if p.tok.kind != tokIdent {
		p.fail(fmt.Sprintf("the type of input %s: f32[C,H,W] or class[N]", in.Name))
	}
	in.TypePos, in.Type = p.tok.pos, p.tok.text
	p.advance()
	p.expect("[", fmt.Sprintf(`"[" and the dimensions of %s`, in.Type))
	for {
		in.Dims = append(in.Dims, p.expr())
		if p.is("]") {
			break
		}
		p.expect(",", fmt.Sprintf(`"," or "]" after the dimension of %s`, in.Name))
		if p.is("]") {
			break
		}
	}
	p.advance()
	return in
}

func (p *parser) section() *Section {
	if !p.is("train") && !p.is("data") {
		hint := "a file holds one model block, then train and data blocks"
		if p.is("model") {
			p.failAt("a train or data block", hint+"; a second model needs a file of its own")
		}
		p.failAt("a train or data block (or the end of the file)", hint)
	}
	s := &Section{Pos: p.tok.pos, Kind: p.tok.text}
	p.advance()
	s.Stmts, _ = p.block(s.Kind + " block")
	return s
}

// block reads "{ assign* }" and returns the statements and the closing
// brace's position.
func (p *parser) block(what string) ([]*Assign, Pos) {
	start := p.expect("{", fmt.Sprintf(`"{" to open the %s`, what))
	var stmts []*Assign
	for !p.is("}") {
		if p.tok.kind != tokIdent {
			if p.tok.kind == tokEOF {
				p.fail(fmt.Sprintf(`"}" to close the %s opened at %d:%d`, what, start.pos.Line, start.pos.Col))
			}
			p.failAt(fmt.Sprintf(`a statement (name = value) or "}" to close the %s`, what))
		}
		stmts = append(stmts, p.assign())
	}
	end := p.tok.pos
	p.advance()
	return stmts, end
}

func (p *parser) assign() *Assign {
	a := &Assign{Pos: p.tok.pos, Name: p.tok.text}
	p.advance()
	eq := p.expect("=", fmt.Sprintf(`"=" after %s`, a.Name))
	if p.tok.pos.Line > eq.end.Line { // a statement's value starts on its line
		p.fail(valueKinds)
	}
	a.Value = p.expr()
	if p.is(";") {
		p.advance()
	}
	return a
}

const valueKinds = "a value (an op call, a name, a number, a size, a string or a list)"

func (p *parser) expr() *Expr {
	t := p.tok
	e := &Expr{Pos: t.pos, Text: t.text}
	switch t.kind {
	case tokIdent:
		if p.lookahead().kind == tokPunct && p.lookahead().text == "(" {
			e.Kind, e.Text = ExprCall, ""
			e.Call = p.call()
			e.EndPos = p.prev.end
			return e
		}
		e.Kind, e.Ident = ExprIdent, t.text
	case tokInt:
		e.Kind = ExprInt
		n, err := strconv.ParseInt(t.text, 10, 64)
		if err != nil {
			p.diags = append(p.diags, Errorf(t.pos, "integer %s does not fit in 64 bits", t.text).Span(len(t.text)))
		}
		e.Int = n
	case tokFloat:
		e.Kind = ExprFloat
		f, err := strconv.ParseFloat(t.text, 64)
		if err != nil || math.IsInf(f, 0) {
			p.diags = append(p.diags, Errorf(t.pos, "number %s is out of range", t.text).Span(len(t.text)))
		}
		e.Float = f
	case tokSize:
		e.Kind = ExprSize
		n, err := ParseSize(t.text)
		if err != nil {
			p.diags = append(p.diags, Errorf(t.pos, "%v", err).Span(len(t.text)))
		}
		e.Size = n
	case tokString:
		e.Kind = ExprString
		s, err := strconv.Unquote(t.text)
		if err != nil {
			p.diags = append(p.diags, Errorf(t.pos, "bad string literal %s", t.text).Span(len(t.text)).
				Hint(`escapes are Go's: \\ \" \n \t \xFF \u00e9`))
		}
		e.String = s
	case tokPunct:
		if t.text == "[" {
			e.Kind, e.Text = ExprList, ""
			e.List = p.list()
			e.EndPos = p.prev.end
			return e
		}
		p.fail(valueKinds)
	default:
		p.fail(valueKinds)
	}
	p.advance()
	e.EndPos = p.prev.end
	return e
}

func (p *parser) nest() {
	p.depth++
	if p.depth > MaxNesting {
		panic(bail{Errorf(p.tok.pos, "calls and lists nest more than %d deep here; name the inner values in statements of their own", MaxNesting)})
	}
}

func (p *parser) call() *Call {
	p.nest()
	defer func() { p.depth-- }()
	c := &Call{Pos: p.tok.pos, Name: p.tok.text}
	p.advance()
	p.advance() // "("
	for !p.is(")") {
		if p.tok.kind == tokEOF || (p.tok.kind == tokPunct && p.tok.text != "[") {
			p.fail(fmt.Sprintf(`an argument or ")" to close %s(`, c.Name))
		}
		a := &Arg{Pos: p.tok.pos}
		if p.tok.kind == tokIdent && p.lookahead().kind == tokPunct && p.lookahead().text == "=" {
			a.Key = p.tok.text
			p.advance()
			p.advance()
		}
		a.Value = p.expr()
		c.Args = append(c.Args, a)
		if !p.is(",") {
			if !p.is(")") {
				p.fail(fmt.Sprintf(`"," or ")" after the argument of %s(`, c.Name))
			}
			break
		}
		p.advance()
	}
	p.advance()
	return c
}

func (p *parser) list() []*Expr {
	p.nest()
	defer func() { p.depth-- }()
	open := p.tok
	p.advance()
	var xs []*Expr
	for !p.is("]") {
		if p.tok.kind == tokEOF || (p.tok.kind == tokPunct && p.tok.text != "[") {
			p.fail(fmt.Sprintf(`a list element or "]" to close the list opened at %d:%d`, open.pos.Line, open.pos.Col))
		}
		xs = append(xs, p.expr())
		if !p.is(",") {
			if !p.is("]") {
				p.fail(`"," or "]" after the list element`)
			}
			break
		}
		p.advance()
	}
	p.advance()
	return xs
}

// ParseSize parses a memory size such as "64MiB", "40MB", "1.5GiB" or
// "1024" (bytes); see units.ParseSize, which trainers share.
func ParseSize(s string) (int64, error) { return units.ParseSize(s) }

// FormatSize prints bytes with the largest binary unit, e.g. "14.10 MiB".
func FormatSize(n int64) string { return units.FormatSize(n) }
