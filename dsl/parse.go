package dsl

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/alecthomas/participle/v2"
	"github.com/alecthomas/participle/v2/lexer"

	"github.com/cnnc/cnnc/runtime/units"
)

// The lexer. Order matters: sizes before floats before integers, so that
// "64MiB" is one Size token and "0.9" one Float.
var cnnLexer = lexer.MustSimple([]lexer.SimpleRule{
	{Name: "Comment", Pattern: `(#|//)[^\n]*`},
	{Name: "Whitespace", Pattern: `[ \t\r\n]+`},
	{Name: "Size", Pattern: `[0-9]+(\.[0-9]+)?(KiB|MiB|GiB|TiB|KB|MB|GB|TB|B)\b`},
	{Name: "Float", Pattern: `-?([0-9]+\.[0-9]*([eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|\.[0-9]+([eE][-+]?[0-9]+)?)`},
	{Name: "Int", Pattern: `-?[0-9]+`},
	{Name: "String", Pattern: `"(\\.|[^"\\\n])*"`},
	{Name: "Ident", Pattern: `[A-Za-z_][A-Za-z0-9_]*`},
	{Name: "Punct", Pattern: `[(){}\[\],=:;]`},
})

// Grammar structs: participle fills these; toAST converts them into the
// public AST so that no other package depends on participle.
type gFile struct {
	Model    *gModel     `parser:"@@"`
	Sections []*gSection `parser:"@@*"`
}

type gModel struct {
	Pos    lexer.Position
	Name   string     `parser:"'model' @Ident"`
	Inputs []*gInput  `parser:"'(' ( @@ ( ',' @@ )* ','? )? ')'"`
	Stmts  []*gAssign `parser:"'{' @@* '}'"`
	EndPos lexer.Position
}

type gInput struct {
	Pos  lexer.Position
	Name string   `parser:"@Ident ':'"`
	Type *gTypeEx `parser:"@@"`
}

type gTypeEx struct {
	Pos  lexer.Position
	Name string   `parser:"@Ident"`
	Dims []*gExpr `parser:"'[' @@ ( ',' @@ )* ']'"`
}

type gSection struct {
	Pos   lexer.Position
	Kind  string     `parser:"@( 'train' | 'data' )"`
	Stmts []*gAssign `parser:"'{' @@* '}'"`
}

type gAssign struct {
	Pos   lexer.Position
	Name  string `parser:"@Ident '='"`
	Value *gExpr `parser:"@@ ';'?"`
}

type gExpr struct {
	Pos    lexer.Position
	EndPos lexer.Position
	Call   *gCall   `parser:"  @@"`
	Size   *string  `parser:"| @Size"`
	Float  *string  `parser:"| @Float"`
	Int    *string  `parser:"| @Int"`
	Str    *string  `parser:"| @String"`
	List   []*gExpr `parser:"| '[' ( @@ ( ',' @@ )* ','? )? ']'"`
	Ident  *string  `parser:"| @Ident"`
}

type gCall struct {
	Pos  lexer.Position
	Name string  `parser:"@Ident '('"`
	Args []*gArg `parser:"( @@ ( ',' @@ )* ','? )? ')'"`
}

type gArg struct {
	Pos   lexer.Position
	Key   string `parser:"( @Ident '=' )?"`
	Value *gExpr `parser:"@@"`
}

var parser = participle.MustBuild[gFile](
	participle.Lexer(cnnLexer),
	participle.Elide("Comment", "Whitespace"),
	participle.UseLookahead(2),
)

// Parse parses a .cnn file. On failure the error is Diagnostics.
func Parse(filename string, src []byte) (*File, error) {
	g, err := parser.ParseBytes(filename, src)
	if err != nil {
		return nil, Diagnostics{syntaxDiagnostic(filename, src, err)}
	}
	c := converter{}
	f := &File{Name: filename, Model: c.model(g.Model)}
	for _, s := range g.Sections {
		f.Sections = append(f.Sections, c.section(s))
	}
	if len(c.diags) > 0 {
		return nil, c.diags
	}
	return f, nil
}

// syntaxDiagnostic rewords participle's messages into plain language.
func syntaxDiagnostic(filename string, src []byte, err error) *Diagnostic {
	var perr participle.Error
	if !errors.As(err, &perr) {
		return Errorf(Pos{File: filename}, "%v", err)
	}
	pos := fromLexer(perr.Position())
	if pos.File == "" {
		pos.File = filename
	}
	msg := perr.Message()
	var uerr *participle.UnexpectedTokenError
	if errors.As(err, &uerr) {
		tok := uerr.Unexpected
		switch {
		case tok.EOF():
			msg = "unexpected end of file"
		default:
			msg = fmt.Sprintf("unexpected %q", tok.Value)
		}
		if uerr.Expect != "" {
			msg += fmt.Sprintf(" (expected %s)", uerr.Expect)
		}
		d := Errorf(pos, "syntax error: %s", msg).Span(len(tok.Value))
		return d
	}
	var lerr *lexer.Error
	if errors.As(err, &lerr) {
		bad := ""
		if pos.Offset < len(src) {
			bad = string([]rune(string(src[pos.Offset:]))[:1])
		}
		return Errorf(pos, "syntax error: invalid character %q", bad)
	}
	return Errorf(pos, "syntax error: %s", msg)
}

type converter struct{ diags Diagnostics }

func (c *converter) model(g *gModel) *Model {
	m := &Model{Pos: fromLexer(g.Pos), Name: g.Name, End: fromLexer(g.EndPos)}
	for _, in := range g.Inputs {
		x := &Input{Pos: fromLexer(in.Pos), Name: in.Name, TypePos: fromLexer(in.Type.Pos), Type: in.Type.Name}
		for _, d := range in.Type.Dims {
			x.Dims = append(x.Dims, c.expr(d))
		}
		m.Inputs = append(m.Inputs, x)
	}
	for _, s := range g.Stmts {
		m.Stmts = append(m.Stmts, c.assign(s))
	}
	return m
}

func (c *converter) section(g *gSection) *Section {
	s := &Section{Pos: fromLexer(g.Pos), Kind: g.Kind}
	for _, a := range g.Stmts {
		s.Stmts = append(s.Stmts, c.assign(a))
	}
	return s
}

func (c *converter) assign(g *gAssign) *Assign {
	return &Assign{Pos: fromLexer(g.Pos), Name: g.Name, Value: c.expr(g.Value)}
}

func (c *converter) expr(g *gExpr) *Expr {
	e := &Expr{Pos: fromLexer(g.Pos), EndPos: fromLexer(g.EndPos)}
	switch {
	case g.Call != nil:
		e.Kind = ExprCall
		call := &Call{Pos: fromLexer(g.Call.Pos), Name: g.Call.Name}
		for _, a := range g.Call.Args {
			call.Args = append(call.Args, &Arg{Pos: fromLexer(a.Pos), Key: a.Key, Value: c.expr(a.Value)})
		}
		e.Call = call
	case g.Size != nil:
		e.Kind = ExprSize
		e.Text = *g.Size
		n, err := ParseSize(*g.Size)
		if err != nil {
			c.diags = append(c.diags, Errorf(e.Pos, "%v", err).Span(len(e.Text)))
		}
		e.Size = n
	case g.Float != nil:
		e.Kind = ExprFloat
		e.Text = *g.Float
		f, err := strconv.ParseFloat(*g.Float, 64)
		if err != nil || math.IsInf(f, 0) {
			c.diags = append(c.diags, Errorf(e.Pos, "number %s is out of range", *g.Float).Span(len(e.Text)))
		}
		e.Float = f
	case g.Int != nil:
		e.Kind = ExprInt
		e.Text = *g.Int
		n, err := strconv.ParseInt(*g.Int, 10, 64)
		if err != nil {
			c.diags = append(c.diags, Errorf(e.Pos, "integer %s does not fit in 64 bits", *g.Int).Span(len(e.Text)))
		}
		e.Int = n
	case g.Str != nil:
		e.Kind = ExprString
		e.Text = *g.Str
		s, err := strconv.Unquote(*g.Str)
		if err != nil {
			c.diags = append(c.diags, Errorf(e.Pos, "bad string literal %s", *g.Str))
		}
		e.String = s
	case g.Ident != nil:
		e.Kind = ExprIdent
		e.Ident = *g.Ident
		e.Text = *g.Ident
	default:
		e.Kind = ExprList
		for _, x := range g.List {
			e.List = append(e.List, c.expr(x))
		}
	}
	return e
}

// ParseSize parses a memory size such as "64MiB", "40MB", "1.5GiB" or
// "1024" (bytes); see units.ParseSize, which trainers share.
func ParseSize(s string) (int64, error) { return units.ParseSize(s) }

// FormatSize prints bytes with the largest binary unit, e.g. "14.10 MiB".
func FormatSize(n int64) string { return units.FormatSize(n) }
