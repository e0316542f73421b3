package dsl

import (
	"io"
	"sort"

	plex "github.com/alecthomas/participle/v2/lexer"
)

// The participle side of the lexer: the grammar (grammar.go) reads the
// tokens of lex.go's one-pass lexer through this file, so token classes,
// columns (runes) and error messages are the lexer's own.

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
	symHole // a value parsed on its own (a chunk), where it stands
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

// chunkDepth: a call or list that opens at a multiple of this nesting
// depth is a chunk, parsed on its own. participle parses by recursion,
// about 3 KB of stack per level of nested calls: in one piece, a file
// nested MaxNesting deep (which Parse accepts) overflows Go's 1 GB stack
// limit, a fatal error (measured at 200,000 levels), and the garbage
// collector scans the whole stack at every cycle. In chunks no parse
// recurses deeper than chunkDepth levels. (A variable for the tests.)
var chunkDepth = 256

// tokens are a file's tokens as the grammar reads them.
type tokens struct {
	all    []plex.Token // NL tokens included, EOF last
	cut    *Diagnostic  // where the tokens were cut short, or nil
	chunks []chunk      // in source order
	top    []int        // the chunks directly inside the file
}

// chunk is a call or a list nested chunkDepth (or a multiple) deep:
// all[start:end], from the call's name or the list's "[" to its closer,
// or to the EOF when it is not closed.
type chunk struct {
	start, end int
	kids       []int // the chunks directly inside it
}

// Open brackets, as scanTokens keeps them.
const (
	openInputs = 'm' // the model's "(": its inputs
	openDims   = 'd' // an input's "[": its dimensions
	openCall   = 'c'
	openList   = 'l'
	openBlock  = 'b'
)

type openBracket struct {
	kind  byte
	chunk int // the chunk it opened, or -1
}

// scanner turns lex.go's tokens into the grammar's. It never fails:
// where the lexer finds no token (an invalid character) or calls and
// lists nest deeper than MaxNesting, it ends the tokens there (EOF) and
// keeps the diagnostic as the cut. Parse then reports the syntax error
// participle finds before the cut, if any, else the cut: the error a
// reader meets first, as a parser reading token by token would.
//
// It also gives a name its role from the tokens around it, as a parser
// with two tokens of lookahead would: where a value starts, a name
// followed by "(" is an op (Func); where a call's argument starts, a name
// followed by "=" is the argument's keyword (Key). The grammar then needs
// no lookahead for either.
type scanner struct {
	lex     *lexer
	t       *tokens
	next    token // read ahead when hasNext
	nextErr *Diagnostic
	hasNext bool
	prev    token // the last token
	prevAt  int   // its index in all
	open    []openBracket
	depth   int // calls and lists open
	chunks  []int
}

func scanTokens(filename string, src []byte) *tokens {
	s := &scanner{lex: newLexer(filename, src), t: &tokens{}}
	for {
		t, d := s.read()
		if d == nil {
			d = s.nest(t)
		}
		if d != nil {
			s.t.cut = d
			s.t.all = append(s.t.all, plex.Token{Type: plex.EOF, Pos: toLexerPos(d.Pos)})
			return s.t
		}
		lt := plex.Token{Type: s.role(t), Value: t.text, Pos: toLexerPos(t.pos)}
		if cap(s.t.all)-len(s.t.all) < 2 { // double: append grows large slices by a quarter
			s.t.all = append(make([]plex.Token, 0, 2*cap(s.t.all)+64), s.t.all...)
		}
		if s.prev.pos.Line > 0 && t.pos.Line > s.prev.pos.Line {
			s.t.all = append(s.t.all, plex.Token{Type: symNL, Value: lt.Value, Pos: lt.Pos})
		}
		s.prev, s.prevAt = t, len(s.t.all)
		s.t.all = append(s.t.all, lt)
		if t.kind == tokPunct && (t.text == ")" || t.text == "]") {
			s.closeChunk()
		}
		if t.kind == tokEOF {
			return s.t
		}
	}
}

func toLexerPos(p Pos) plex.Position {
	return plex.Position{Filename: p.File, Offset: p.Offset, Line: p.Line, Column: p.Col}
}

// read returns the lexer's next token.
func (s *scanner) read() (token, *Diagnostic) {
	if s.hasNext {
		s.hasNext = false
		return s.next, s.nextErr
	}
	return s.lex.next()
}

// peek returns the token after the one read last (a zero token where the
// lexer fails there: the failure is returned by the next read).
func (s *scanner) peek() token {
	if !s.hasNext {
		s.next, s.nextErr = s.lex.next()
		s.hasNext = true
	}
	if s.nextErr != nil {
		return token{}
	}
	return s.next
}

// role is the token type of t: Func and Key for names in those roles.
func (s *scanner) role(t token) plex.TokenType {
	if t.kind != tokIdent || s.prev.kind != tokPunct || len(s.open) == 0 {
		return symbolOf[t.kind]
	}
	after := s.peek()
	if after.kind != tokPunct {
		return symIdent
	}
	inner := s.open[len(s.open)-1].kind
	switch p := s.prev.text; {
	case after.text == "(" && inner != openInputs && (p == "=" || p == "(" || p == "," || p == "["):
		return symFunc
	case after.text == "=" && inner == openCall && (p == "(" || p == ","):
		return symKey
	}
	return symIdent
}

// nest keeps the open brackets, opens a chunk at every chunkDepth levels
// and refuses calls and lists nested deeper than MaxNesting: at the
// call's name, or at the list's "[".
func (s *scanner) nest(t token) *Diagnostic {
	if t.kind != tokPunct {
		return nil
	}
	b := openBracket{chunk: -1}
	switch t.text {
	case "{":
		b.kind = openBlock
	case "(":
		b.kind = openCall
		if len(s.open) == 0 {
			b.kind = openInputs
		}
	case "[":
		b.kind = openList
		if len(s.open) > 0 && s.open[len(s.open)-1].kind == openInputs {
			b.kind = openDims
		}
	default:
		return nil
	}
	if b.kind == openCall || b.kind == openList {
		s.depth++
		if s.depth > MaxNesting {
			at := t.pos
			if b.kind == openCall {
				at = s.prev.pos // the call's name
			}
			return Errorf(at, "calls and lists nest more than %d deep here; name the inner values in statements of their own", MaxNesting)
		}
		// a call's chunk starts at its name, a list's at its "[" (an NL
		// before it stays outside); a "(" after no op's name starts none
		start := len(s.t.all)
		if b.kind == openCall {
			start = s.prevAt
		}
		if s.depth%chunkDepth == 0 && (b.kind == openList || s.t.all[start].Type == symFunc) {
			b.chunk = len(s.t.chunks)
			if len(s.chunks) > 0 {
				parent := &s.t.chunks[s.chunks[len(s.chunks)-1]]
				parent.kids = append(parent.kids, b.chunk)
			} else {
				s.t.top = append(s.t.top, b.chunk)
			}
			s.t.chunks = append(s.t.chunks, chunk{start: start, end: -1})
			s.chunks = append(s.chunks, b.chunk)
		}
	}
	s.open = append(s.open, b)
	return nil
}

// closeChunk closes the innermost bracket, just appended to all, and the
// chunk it opened.
func (s *scanner) closeChunk() {
	n := len(s.open)
	if n == 0 {
		return
	}
	b := s.open[n-1]
	s.open = s.open[:n-1]
	if b.kind == openCall || b.kind == openList {
		s.depth--
	}
	if b.chunk >= 0 {
		s.t.chunks[b.chunk].end = len(s.t.all)
		s.chunks = s.chunks[:len(s.chunks)-1]
	}
}

// lexer returns the tokens of chunk c (-1: the file), each chunk directly
// inside it one Hole token, then an EOF.
func (t *tokens) lexer(c int) *chunkLexer {
	eof := t.all[len(t.all)-1]
	l := &chunkLexer{t: t, end: len(t.all), eof: eof}
	if c < 0 {
		l.kids = t.top
		return l
	}
	ch := t.chunks[c]
	l.i, l.kids = ch.start, ch.kids
	if ch.end >= 0 {
		l.end = ch.end
		l.eof = plex.Token{Type: plex.EOF, Pos: toLexerPos(endOf(t.all[ch.end-1]))}
	}
	return l
}

// chunkAt returns the chunk that starts at offset off.
func (t *tokens) chunkAt(off int) int {
	return sort.Search(len(t.chunks), func(i int) bool { return t.all[t.chunks[i].start].Pos.Offset >= off })
}

// chunkLexer is the plex.Lexer participle reads a chunk (or the file)
// from.
type chunkLexer struct {
	t      *tokens
	i, end int
	kids   []int
	eof    plex.Token
}

func (l *chunkLexer) Next() (plex.Token, error) {
	if len(l.kids) > 0 && l.i == l.t.chunks[l.kids[0]].start {
		c := l.t.chunks[l.kids[0]]
		l.kids = l.kids[1:]
		l.i = c.end
		if c.end < 0 { // runs to the EOF
			l.i = l.end
		}
		first := l.t.all[c.start]
		return plex.Token{Type: symHole, Value: first.Value, Pos: first.Pos}, nil
	}
	if l.i < l.end && l.t.all[l.i].Type != plex.EOF {
		l.i++
		return l.t.all[l.i-1], nil
	}
	return l.eof, nil
}

// tokenDef is the plex.Definition participle builds the parser with.
// Parse does not lex through it: it hands participle each chunk's tokens.
type tokenDef struct{}

func (tokenDef) Symbols() map[string]plex.TokenType {
	return map[string]plex.TokenType{
		"EOF": plex.EOF, "Ident": symIdent, "Func": symFunc, "Key": symKey, "Int": symInt, "Float": symFloat,
		"Size": symSize, "String": symString, "Punct": symPunct, "Hole": symHole, "NL": symNL,
	}
}

func (d tokenDef) Lex(filename string, r io.Reader) (plex.Lexer, error) {
	src, err := io.ReadAll(io.LimitReader(r, MaxSourceBytes+1))
	if err != nil {
		return nil, err
	}
	return d.LexBytes(filename, src)
}

// LexBytes returns the file's tokens, chunks included.
func (tokenDef) LexBytes(filename string, src []byte) (plex.Lexer, error) {
	t := scanTokens(filename, src)
	t.chunks, t.top = nil, nil
	return t.lexer(-1), nil
}
