package dsl

import (
	"github.com/alecthomas/participle/v2"
	plex "github.com/alecthomas/participle/v2/lexer"
)

// The grammar of a .cnn file, as participle grammar structs. They are
// private: Parse converts them into the public AST (ast.go), so no other
// package depends on participle. In EBNF (literals are typed in the tags,
// "(":Punct, so that an elided NL token, which repeats the text of the
// token after it, never matches one):
//
//	File      = Model Section* .
//	Model     = "model" Ident "(" Items(Input, ")")? ")" Block .
//	Input     = Ident ":" Ident "[" Items(Value, "]") "]" .
//	Section   = ( "train" | "data" ) Block .
//	Block     = "{" Assign* "}" .
//	Assign    = Ident "=" (?! NL) Value ";"? .
//	Value     = Call | List | Atom | Hole .
//	Call      = Func "(" Items(Arg, ")")? ")" .
//	Arg       = ( Key "=" )? Value .
//	List      = "[" Items(Value, "]")? "]" .
//	Atom      = Ident | Int | Float | String | Size .
//	Items(x, c) = x ( (?! "," c) "," x )* ","? .  // a comma before the closer c is allowed
//
// The parser runs without lookahead (UseLookahead(0)): a branch that has
// consumed a token is taken, so participle's error is at the first token
// that does not fit, where a reader sees it (syntax.go says what was
// expected there). Func and Key are names the token stream marks by the
// token after them (an op's name before "(", an argument's keyword before
// "="; tokens.go), so no branch needs to look ahead to choose between a
// name and a call or a positional and a keyword argument; (?! "," c)
// keeps a list of items from taking a trailing comma for the start of one
// more item. (?! NL): a statement's value starts on the line of its "="
// (NL is the elided token before a token that starts a line), so a
// missing value is reported on that line rather than taking the next
// statement's name. A Hole is a call or list nested so deep that it is
// parsed on its own (a chunk, tokens.go).

type gFile struct {
	Model    *gModel     `parser:"@@"`
	Sections []*gSection `parser:"@@*"`
}

type gModel struct {
	Keyword plex.Token `parser:"@'model':Ident"`
	Name    plex.Token `parser:"@Ident '(':Punct"`
	Inputs  []*gInput  `parser:"( @@ ( (?! ',':Punct ')':Punct) ',':Punct @@ )* ',':Punct? )? ')':Punct"`
	Block   *gBlock    `parser:"@@"`
}

type gInput struct {
	Name plex.Token `parser:"@Ident ':':Punct"`
	Type plex.Token `parser:"@Ident '[':Punct"`
	Dims []gValue   `parser:"@@ ( (?! ',':Punct ']':Punct) ',':Punct @@ )* ',':Punct? ']':Punct"`
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

// gValue is a *gCall, a *gList, a *gAtom or a *gHole. Values keep their
// Tokens (a call's name or a list's "[" first, after any elided ones; the
// closer last) rather than capture them: each capture costs participle an
// allocation, and values are most of a file.
type gValue interface{ value() }

type gCall struct {
	Tokens []plex.Token
	Args   []*gArg `parser:"Func '(':Punct ( @@ ( (?! ',':Punct ')':Punct) ',':Punct @@ )* ',':Punct? )? ')':Punct"`
}

type gArg struct {
	Key   *plex.Token `parser:"( @Key '=':Punct )?"`
	Value gValue      `parser:"@@"`
}

type gList struct {
	Tokens []plex.Token
	Elems  []gValue `parser:"'[':Punct ( @@ ( (?! ',':Punct ']':Punct) ',':Punct @@ )* ',':Punct? )? ']':Punct"`
}

// gAtom is one token, the last of its Tokens.
type gAtom struct {
	Tokens []plex.Token
	Is     bool `parser:"Ident | Int | Float | String | Size"`
}

// gHole is a chunk (tokens.go), parsed on its own.
type gHole struct {
	Tokens []plex.Token
	Is     bool `parser:"Hole"`
}

func (*gCall) value() {}
func (*gList) value() {}
func (*gAtom) value() {}
func (*gHole) value() {}

// first and last are the first and last tokens of a value's Tokens,
// elided ones aside.
func first(toks []plex.Token) plex.Token {
	for _, t := range toks {
		if t.Type != symNL {
			return t
		}
	}
	return toks[len(toks)-1]
}

func last(toks []plex.Token) plex.Token { return toks[len(toks)-1] }

// gChunk is a chunk's grammar: one value.
type gChunk struct {
	Value gValue `parser:"@@"`
}

var (
	grammar      = participle.MustBuild[gFile](grammarOptions()...)
	chunkGrammar = participle.MustBuild[gChunk](grammarOptions()...)
)

func grammarOptions() []participle.Option {
	// participle stops a loop after MaxIterations rounds (a million by
	// default); a file of MaxSourceBytes has fewer tokens than bytes.
	participle.MaxIterations = max(participle.MaxIterations, MaxSourceBytes)
	return []participle.Option{
		participle.Lexer(tokenDef{}),
		participle.Elide("NL"),
		participle.UseLookahead(0),
		participle.Union[gValue](&gCall{}, &gList{}, &gAtom{}, &gHole{}),
	}
}
