package dsl

import "fmt"

// Pos is a position in a source file; Line and Col are 1-based.
type Pos struct {
	File   string
	Line   int
	Col    int
	Offset int
}

// String is "file:line:col", the file's name escaped for a terminal
// (Printable): reports print it as it is.
func (p Pos) String() string {
	if p.Line == 0 {
		return Printable(p.File)
	}
	return fmt.Sprintf("%s:%d:%d", Printable(p.File), p.Line, p.Col)
}

// IsValid reports whether p points into a file.
func (p Pos) IsValid() bool { return p.Line > 0 }

// File is a whole .cnn file: one model and any number of settings blocks.
type File struct {
	Name     string
	Model    *Model
	Sections []*Section
}

// Section returns the first block of the given kind ("train", "data"), or nil.
func (f *File) Section(kind string) *Section {
	for _, s := range f.Sections {
		if s.Kind == kind {
			return s
		}
	}
	return nil
}

// Model is `model Name(inputs) { statements }`.
type Model struct {
	Pos    Pos
	Name   string
	Inputs []*Input
	Stmts  []*Assign
	End    Pos // the closing brace
}

// Input is a model input such as `image: f32[3,128,128]` or `label: class[10]`.
type Input struct {
	Pos     Pos
	Name    string
	TypePos Pos
	Type    string // "f32", "class"
	Dims    []*Expr
}

// Section is a settings block: `train { ... }` or `data { ... }`.
type Section struct {
	Pos   Pos
	Kind  string
	Stmts []*Assign
}

// Assign is `name = expr`.
type Assign struct {
	Pos   Pos
	Name  string
	Value *Expr
}

// ExprKind says which field of an Expr is set.
type ExprKind int

const (
	ExprCall ExprKind = iota
	ExprIdent
	ExprInt
	ExprFloat
	ExprSize
	ExprString
	ExprList
)

func (k ExprKind) String() string {
	return [...]string{"call", "name", "integer", "number", "size", "string", "list"}[k]
}

// Expr is a value: a call, a name, a number, a memory size, a string or a list.
type Expr struct {
	Pos    Pos
	EndPos Pos // just past the expression, for carets that span it
	Kind   ExprKind
	Call   *Call
	Ident  string
	Int    int64
	Float  float64
	Size   int64 // bytes
	String string
	List   []*Expr
	Text   string // the token as written, for numbers and sizes
}

// Call is `op(arg, key=value, ...)`.
type Call struct {
	Pos  Pos
	Name string
	Args []*Arg
}

// Arg is a positional (Key == "") or keyword argument.
type Arg struct {
	Pos   Pos
	Key   string
	Value *Expr
}

// Positional returns the positional arguments in order.
func (c *Call) Positional() []*Arg {
	var out []*Arg
	for _, a := range c.Args {
		if a.Key == "" {
			out = append(out, a)
		}
	}
	return out
}
