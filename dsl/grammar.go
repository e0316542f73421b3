package dsl

import (
	"github.com/alecthomas/participle/v2"
	plex "github.com/alecthomas/participle/v2/lexer"
)

// The grammar of a .cnn file, as participle grammar structs. They are
// private: Parse converts them into the public AST (ast.go), so no other
// package depends on participle. In EBNF:
//
//	File    = Model Section* .
//	Model   = "model" Ident "(" Input* ")" Block .
//	Input   = Ident ":" Ident "[" Elem+ "]" Sep(")") .
//	Section = ( "train" | "data" ) Block .
//	Block   = "{" Assign* "}" .
//	Assign  = Ident "=" (?! NL) Value ";"? .
//	Value   = Call | List | Atom .
//	Call    = Ident "(" Arg* ")" .
//	Arg     = ( Ident "=" )? Value Sep(")") .
//	List    = "[" Elem* "]" .
//	Elem    = Value Sep("]") .
//	Atom    = Size | Float | Int | String | Ident .
//	Sep(c)  = (?= "," | c) ","? .    // a comma, optional before the closer c
//
// The parser runs without lookahead (UseLookahead(0)): a branch that
// consumed a token is taken, so participle's error is at the first token
// that does not fit, as a reader sees it. Where one token does not decide
// (a name or a call; a positional or a keyword argument) a lookahead
// group does, and (?! c) keeps a list's loop from trying an element at
// its closer.
//
// (?! NL): a statement's value starts on the line of its "=" (NL is the
// elided token before a token that starts a line), so a missing value is
// reported on that line rather than taking the next statement's name.

type gFile struct {
	Model    *gModel     `parser:"@@"`
	Sections []*gSection `parser:"@@*"`
}

type gModel struct {
	Keyword plex.Token `parser:"@'model':Ident"`
	Name    plex.Token `parser:"@Ident '(':Punct"`
	Inputs  []*gInput  `parser:"@@* ')':Punct"`
	Block   *gBlock    `parser:"@@"`
}

type gInput struct {
	Name plex.Token `parser:"(?! ')':Punct) @Ident ':':Punct"`
	Type plex.Token `parser:"@Ident '[':Punct"`
	Dims []*gElem   `parser:"@@+ ']':Punct (?= ',':Punct | ')':Punct) ',':Punct?"`
}

type gSection struct {
	Kind  plex.Token `parser:"@( 'train':Ident | 'data':Ident )"`
	Block *gBlock    `parser:"@@"`
}

// gBlock's Tokens end with its "}".
type gBlock struct {
	Tokens []plex.Token
	Stmts  []*gAssign `parser:"'{':Punct @@* '}':Punct"`
}

type gAssign struct {
	Name  plex.Token `parser:"@Ident '=':Punct (?! NL)"`
	Value gValue     `parser:"@@ ';':Punct?"`
}

// gValue is a *gCall, a *gList, a *gAtom or a *gHole. Calls and lists keep their
// tokens (the name or "[" first, the closer last) rather than capture
// them: a capture costs participle an allocation, and they are many.
type gValue interface{ value() }

type gCall struct {
	Tokens []plex.Token
	Args   []*gArg `parser:"Func '(':Punct @@* ')':Punct"`
}

type gArg struct {
	Key   *plex.Token `parser:"(?! ')':Punct) ( @Key '=':Punct )?"`
	Value gValue      `parser:"@@ (?= ',':Punct | ')':Punct) ',':Punct?"`
}

type gList struct {
	Tokens []plex.Token
	Elems  []*gElem `parser:"'[':Punct @@* ']':Punct"`
}

// gElem is a list element or an input's dimension.
type gElem struct {
	Value gValue `parser:"(?! ']':Punct) @@ (?= ',':Punct | ']':Punct) ',':Punct?"`
}

// gAtom is one token, the last of its Tokens.
type gAtom struct {
	Tokens []plex.Token
	Is     bool `parser:"Size | Float | Int | String | Ident"`
}

// gHole is a chunk (tokens.go), parsed on its own.
type gHole struct {
	Tokens []plex.Token
	Is     bool `parser:"Hole"`
}

func (*gCall) value() {}
func (*gHole) value() {}
func (*gList) value() {}
func (*gAtom) value() {}

// first and last are the first and last tokens of a value (its Tokens
// may start with elided ones).
func first(toks []plex.Token) plex.Token {
	for _, t := range toks {
		if t.Type != symNL {
			return t
		}
	}
	return toks[len(toks)-1]
}

func last(toks []plex.Token) plex.Token { return toks[len(toks)-1] }

var grammar = buildGrammar()

func buildGrammar() *participle.Parser[gFile] {
	// participle stops a loop after MaxIterations rounds (a million by
	// default); a file of MaxSourceBytes has fewer tokens than bytes.
	participle.MaxIterations = max(participle.MaxIterations, MaxSourceBytes)
	return participle.MustBuild[gFile](
		participle.Lexer(tokenDef{}),
		participle.Elide("NL"),
		participle.UseLookahead(0),
		participle.Union[gValue](&gCall{}, &gList{}, &gAtom{}, &gHole{}),
	)
}

// gChunk is a chunk's grammar: one value.
type gChunk struct {
	Value gValue `parser:"@@"`
}

var chunkGrammar = participle.MustBuild[gChunk](
	participle.Lexer(tokenDef{}),
	participle.Elide("NL"),
	participle.UseLookahead(0),
	participle.Union[gValue](&gCall{}, &gList{}, &gAtom{}, &gHole{}),
)
