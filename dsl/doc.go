// Package dsl turns cnnc model text into an AST.
//
// In:  the bytes of a .cnn file and its name.
// Out: a *File (model, train and data blocks) whose every node carries its
// source position, or Diagnostics — errors that print as
// "file:line:col: message", the source line and a caret under the token.
//
// Why it is shaped so: the parser knows only syntax. What an op means, which
// arguments it takes and what shapes flow between layers is the compiler's
// business, so the grammar stays small (assignments of calls, numbers,
// sizes, strings and lists) and every later stage can still point at the
// user's line through the positions kept here. The grammar is a
// participle one (grammar.go) over lex.go's lexer (tokens.go); syntax.go
// turns participle's errors into diagnostics that say what was expected.
package dsl
