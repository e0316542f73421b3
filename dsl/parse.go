package dsl

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/alecthomas/participle/v2"
	plex "github.com/alecthomas/participle/v2/lexer"

	"github.com/cnnc/cnnc/runtime/units"
)

// MaxNesting bounds how deeply calls and lists may nest (each level is a
// few stack frames in every stage that walks expressions).
const MaxNesting = 200_000

// Parse parses a .cnn file. On failure the error is Diagnostics.
func Parse(filename string, src []byte) (*File, error) {
	if len(src) > MaxSourceBytes {
		return nil, Diagnostics{Errorf(Pos{File: filename, Line: 1, Col: 1}, "the file has %d bytes; a model file may have at most %d (%s)",
			len(src), MaxSourceBytes, units.FormatBytes(MaxSourceBytes))}
	}
	t := scanTokens(filename, src)
	g, err := parseChunks(t)
	if err != nil {
		// participle's error stands unless the tokens were cut (an
		// invalid character, nesting too deep) before it
		if t.cut == nil || errorOffset(err) < t.cut.Pos.Offset {
			return nil, Diagnostics{syntaxError(filename, t.all, err)}
		}
	}
	if t.cut != nil {
		return nil, Diagnostics{t.cut}
	}
	c := converter{t: t, chunks: g.chunks}
	f := &File{Name: filename, Model: c.model(g.file.Model)}
	for _, s := range g.file.Sections {
		f.Sections = append(f.Sections, &Section{Pos: fromLexer(s.Kind.Pos), Kind: s.Kind.Value, Stmts: c.block(s.Block)})
	}
	if len(c.diags) > 0 {
		return nil, c.diags
	}
	return f, nil
}

// parsed is what participle made of a file and its chunks.
type parsed struct {
	file   *gFile
	chunks []gValue
}

// parseChunks parses the file and each chunk, and returns the error that
// comes first in the file, if any.
func parseChunks(t *tokens) (*parsed, error) {
	p := &parsed{chunks: make([]gValue, len(t.chunks))}
	var firstErr error
	firstAt := 0
	keep := func(err error) {
		if at := errorOffset(err); firstErr == nil || at < firstAt {
			firstErr, firstAt = err, at
		}
	}
	peek, err := plex.Upgrade(t.lexer(-1), symNL)
	if err == nil {
		p.file, err = grammar.ParseFromLexer(peek)
	}
	if err != nil {
		keep(err)
	}
	for i, c := range t.chunks {
		if firstErr != nil && t.all[c.start].Pos.Offset >= firstAt {
			continue // an error in it would come later
		}
		peek, err := plex.Upgrade(t.lexer(i), symNL)
		var g *gChunk
		if err == nil {
			g, err = chunkGrammar.ParseFromLexer(peek)
		}
		if err != nil {
			keep(err)
			continue
		}
		p.chunks[i] = g.Value
	}
	return p, firstErr
}

// errorOffset is where in the source participle's error is.
func errorOffset(err error) int {
	var uerr *participle.UnexpectedTokenError
	if errors.As(err, &uerr) {
		return uerr.Unexpected.Pos.Offset
	}
	var perr participle.Error
	if errors.As(err, &perr) {
		return perr.Position().Offset
	}
	return 0
}

func fromLexer(p plex.Position) Pos {
	return Pos{File: p.Filename, Line: p.Line, Col: p.Column, Offset: p.Offset}
}

// converter turns the grammar structs into the public AST and checks what
// the grammar cannot: that numbers, sizes and strings have values.
type converter struct {
	t      *tokens
	chunks []gValue
	diags  Diagnostics
}

func (c *converter) model(g *gModel) *Model {
	m := &Model{Pos: fromLexer(g.Keyword.Pos), Name: g.Name.Value, End: fromLexer(last(g.Block.Tokens).Pos)}
	for _, in := range g.Inputs {
		x := &Input{Pos: fromLexer(in.Name.Pos), Name: in.Name.Value, TypePos: fromLexer(in.Type.Pos), Type: in.Type.Value}
		for _, d := range in.Dims {
			x.Dims = append(x.Dims, c.value(d))
		}
		m.Inputs = append(m.Inputs, x)
	}
	m.Stmts = c.block(g.Block)
	return m
}

func (c *converter) block(b *gBlock) []*Assign {
	var out []*Assign
	for _, a := range b.Stmts {
		out = append(out, &Assign{Pos: fromLexer(a.Name.Pos), Name: a.Name.Value, Value: c.value(a.Value)})
	}
	return out
}

func (c *converter) value(g gValue) *Expr {
	switch g := g.(type) {
	case *gCall:
		name := first(g.Tokens)
		call := &Call{Pos: fromLexer(name.Pos), Name: name.Value}
		if len(g.Args) > 0 {
			call.Args = make([]*Arg, 0, len(g.Args))
		}
		for _, a := range g.Args {
			arg := &Arg{Value: c.value(a.Value)}
			arg.Pos = arg.Value.Pos
			if a.Key != nil {
				arg.Pos, arg.Key = fromLexer(a.Key.Pos), a.Key.Value
			}
			call.Args = append(call.Args, arg)
		}
		return &Expr{Pos: call.Pos, EndPos: endOf(last(g.Tokens)), Kind: ExprCall, Call: call}
	case *gList:
		e := &Expr{Pos: fromLexer(first(g.Tokens).Pos), EndPos: endOf(last(g.Tokens)), Kind: ExprList}
		for _, x := range g.Elems {
			e.List = append(e.List, c.value(x))
		}
		return e
	case *gAtom:
		return c.atom(last(g.Tokens))
	case *gHole:
		return c.value(c.chunks[c.t.chunkAt(last(g.Tokens).Pos.Offset)])
	}
	panic(fmt.Sprintf("dsl: %T is no value", g))
}

func (c *converter) atom(t plex.Token) *Expr {
	e := &Expr{Pos: fromLexer(t.Pos), EndPos: endOf(t), Text: t.Value}
	switch t.Type {
	case symIdent:
		e.Kind, e.Ident = ExprIdent, t.Value
	case symInt:
		e.Kind = ExprInt
		n, err := strconv.ParseInt(t.Value, 10, 64)
		if err != nil {
			c.diags = append(c.diags, Errorf(e.Pos, "integer %s does not fit in 64 bits", t.Value).Span(len(t.Value)))
		}
		e.Int = n
	case symFloat:
		e.Kind = ExprFloat
		f, err := strconv.ParseFloat(t.Value, 64)
		if err != nil || math.IsInf(f, 0) {
			c.diags = append(c.diags, Errorf(e.Pos, "number %s is out of range", t.Value).Span(len(t.Value)))
		}
		e.Float = f
	case symSize:
		e.Kind = ExprSize
		n, err := ParseSize(t.Value)
		if err != nil {
			c.diags = append(c.diags, Errorf(e.Pos, "%v", err).Span(len(t.Value)))
		}
		e.Size = n
	case symString:
		e.Kind = ExprString
		s, err := strconv.Unquote(t.Value)
		if err != nil {
			c.diags = append(c.diags, Errorf(e.Pos, "bad string literal %s", t.Value).Span(len(t.Value)).
				Hint(`escapes are Go's: \\ \" \n \t \xFF \u00e9`))
		}
		e.String = s
	default:
		panic(fmt.Sprintf("dsl: token type %d is no value", t.Type))
	}
	return e
}

// ParseSize parses a memory size such as "64MiB", "40MB", "1.5GiB" or
// "1024" (bytes); see units.ParseSize, which trainers share.
func ParseSize(s string) (int64, error) { return units.ParseSize(s) }

// FormatSize prints bytes with the largest binary unit, e.g. "14.10 MiB".
func FormatSize(n int64) string { return units.FormatSize(n) }
