package dsl

import (
	"io"

	plex "github.com/alecthomas/participle/v2/lexer"
)

// The participle side of the lexer: the grammar (grammar.go) reads the
// tokens of lex.go's one-pass lexer through this plex.Definition, so
// token classes, columns (runes) and error messages are the lexer's own.

// Token types by the names the grammar's tags use.
const (
	symIdent plex.TokenType = iota + 1
	symFunc                 // a name followed by "(" where a value stands: a call's op
	symKey                  // a name followed by "=" where a call's argument starts
	symInt
	symFloat
	symSize
	symString
	symPunct
	// symNL is elided; it comes before a token that starts a line (the
	// grammar's (?! NL) looks for it) and repeats that token's text and
	// position: participle captures the first token of a capture's range
	// into a plex.Token field, elided ones included.
	symNL
)

var symbolOf = [...]plex.TokenType{
	tokEOF: plex.EOF, tokIdent: symIdent, tokInt: symInt, tokFloat: symFloat,
	tokSize: symSize, tokString: symString, tokPunct: symPunct,
}

// isName reports whether t is a name, whatever its role.
func isName(t plex.Token) bool {
	return t.Type == symIdent || t.Type == symFunc || t.Type == symKey
}

// tokenDef is the plex.Definition participle builds the parser with.
type tokenDef struct{}

func (tokenDef) Symbols() map[string]plex.TokenType {
	return map[string]plex.TokenType{
		"EOF": plex.EOF, "Ident": symIdent, "Func": symFunc, "Key": symKey, "Int": symInt,
		"Float": symFloat, "Size": symSize, "String": symString, "Punct": symPunct, "NL": symNL,
	}
}

func (d tokenDef) Lex(filename string, r io.Reader) (plex.Lexer, error) {
	src, err := io.ReadAll(io.LimitReader(r, MaxSourceBytes+1))
	if err != nil {
		return nil, err
	}
	return d.LexBytes(filename, src)
}

func (tokenDef) LexBytes(filename string, src []byte) (plex.Lexer, error) {
	return newTokenStream(filename, src), nil
}

// Open brackets, as tokenStream keeps them.
const (
	openInputs = 'm' // the model's "(": its inputs
	openDims   = 'd' // an input's "[": its dimensions
	openCall   = 'c'
	openList   = 'l'
	openBlock  = 'b'
)

// tokenStream hands lex.go's tokens to participle. It never fails:
// where the lexer finds no token (an invalid character) or calls and
// lists nest deeper than MaxNesting, it ends the stream there (EOF) and
// keeps the diagnostic as the cut. Parse then reports the syntax error
// participle finds before the cut, if any, else the cut: the error a
// reader meets first, as a parser reading token by token would.
//
// It also gives a name its role from the tokens around it, as a parser
// with two tokens of lookahead would: where a value starts, a name
// followed by "(" is an op (Func); where a call's argument starts, a name
// followed by "=" is the argument's keyword (Key). The grammar then needs
// no lookahead for either.
type tokenStream struct {
	lex     *lexer
	next    *token // read ahead, or nil
	nextErr *Diagnostic
	pending *plex.Token // to return after an NL
	prev    token       // the last token returned
	open    []byte      // open brackets, innermost last
	depth   int         // calls and lists among them
	cut     *Diagnostic
	done    bool
	emitted int // tokens returned, NL and EOF included
}

func newTokenStream(filename string, src []byte) *tokenStream {
	return &tokenStream{lex: newLexer(filename, src)}
}

func toLexerPos(p Pos) plex.Position {
	return plex.Position{Filename: p.File, Offset: p.Offset, Line: p.Line, Column: p.Col}
}

func (s *tokenStream) Next() (plex.Token, error) {
	s.emitted++
	if s.pending != nil {
		t := *s.pending
		s.pending = nil
		return t, nil
	}
	if s.done {
		return plex.Token{Type: plex.EOF, Pos: toLexerPos(s.prev.end)}, nil
	}
	t, d := s.read()
	if d == nil {
		d = s.nest(t)
	}
	if d != nil {
		s.cut, s.done = d, true
		return plex.Token{Type: plex.EOF, Pos: toLexerPos(d.Pos)}, nil
	}
	lt := plex.Token{Type: s.role(t), Value: t.text, Pos: toLexerPos(t.pos)}
	first := s.prev.pos.Line > 0 && t.pos.Line > s.prev.pos.Line
	s.prev = t
	if t.kind == tokEOF {
		s.done = true
	}
	if first {
		s.pending = &lt
		return plex.Token{Type: symNL, Value: lt.Value, Pos: lt.Pos}, nil
	}
	return lt, nil
}

// read returns the next token of the lexer.
func (s *tokenStream) read() (token, *Diagnostic) {
	if s.next != nil || s.nextErr != nil {
		t, d := s.next, s.nextErr
		s.next, s.nextErr = nil, nil
		if d != nil {
			return token{}, d
		}
		return *t, nil
	}
	return s.lex.next()
}

// peek returns the token after the one read last (a zero token where the
// lexer fails there: the failure is returned by the next read).
func (s *tokenStream) peek() token {
	if s.next == nil && s.nextErr == nil {
		t, d := s.lex.next()
		s.next, s.nextErr = &t, d
	}
	if s.nextErr != nil {
		return token{}
	}
	return *s.next
}

// role is the token type of t: Func and Key for names in those roles.
func (s *tokenStream) role(t token) plex.TokenType {
	if t.kind != tokIdent || s.prev.kind != tokPunct {
		return symbolOf[t.kind]
	}
	inner := byte(0)
	if len(s.open) > 0 {
		inner = s.open[len(s.open)-1]
	}
	after := s.peek()
	if after.kind != tokPunct {
		return symIdent
	}
	switch p := s.prev.text; {
	case after.text == "(" && inner != 0 && inner != openInputs && (p == "=" || p == "(" || p == "," || p == "["):
		return symFunc
	case after.text == "=" && inner == openCall && (p == "(" || p == ","):
		return symKey
	}
	return symIdent
}

// nest keeps the open brackets and refuses calls and lists nested deeper
// than MaxNesting: at the call's name, or at the list's "[".
func (s *tokenStream) nest(t token) *Diagnostic {
	if t.kind != tokPunct {
		return nil
	}
	kind := byte(0)
	switch t.text {
	case "{":
		kind = openBlock
	case "(":
		kind = openCall
		if len(s.open) == 0 {
			kind = openInputs
		}
	case "[":
		kind = openList
		if len(s.open) > 0 && s.open[len(s.open)-1] == openInputs {
			kind = openDims
		}
	case ")", "]", "}":
		if n := len(s.open); n > 0 {
			if c := s.open[n-1]; c == openCall || c == openList {
				s.depth--
			}
			s.open = s.open[:n-1]
		}
		return nil
	default:
		return nil
	}
	s.open = append(s.open, kind)
	if kind == openCall || kind == openList {
		s.depth++
		if s.depth > MaxNesting {
			at := t.pos
			if kind == openCall {
				at = s.prev.pos // the call's name
			}
			return Errorf(at, "calls and lists nest more than %d deep here; name the inner values in statements of their own", MaxNesting)
		}
	}
	return nil
}
