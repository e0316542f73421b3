// Package gentext renders strings that cnnc does not choose — the model
// file's name as typed, model and layer names, data paths — into the
// comments of the files cnnc generates: Go (trainers, `cnnc gen`
// packages), CUDA C (the kernels, also compiled as C++ for the CPU) and
// go.mod. In: any string, any bytes. Out: text that each of those
// languages reads as part of one comment line and nothing else.
//
// Why one function for the three languages: the text must not end the
// comment or the line in any of them, and the safe alphabet is their
// intersection. A name is shown as it is when every byte is printable
// ASCII other than `\` and `"`, it contains neither "*/" (ends a /* */
// comment: jen writes multi-line comments so) nor "??" (a trigraph: "??/"
// is a backslash, which joins the next line to the comment in C compilers
// that translate trigraphs) nor two backquotes or two single quotes in a
// row (gofmt turns them into curly quotes in doc comments), and it does not
// begin or end with a space.
// Anything else — CR (a line break to g++ and nvcc though not to Go), LF,
// U+2028/U+2029, NUL and other control bytes (Go refuses NUL in source),
// invalid UTF-8 (Go refuses it), quotes, backslashes — is shown in Go's
// double-quoted syntax using ASCII only, with `*`, `?`, "`" and `'`
// escaped too, so strconv.Unquote gives the original bytes back.
//
// Strings in code (Go string literals) are not this package's business:
// they are rendered by strconv.Quote (jen.Lit), which is exact.
package gentext

import (
	"strconv"
	"strings"
)

// Comment returns s as it may appear inside a comment line of generated Go,
// C/C++/CUDA or go.mod: s itself when it is plain (see the package
// comment), else its quoted ASCII form.
func Comment(s string) string {
	if plain(s) {
		return s
	}
	q := strconv.QuoteToASCII(s)
	// QuoteToASCII's escapes are a backslash followed by letters and hex
	// digits, so every `*`, `?`, "`" and `'` in q is one of s's own.
	return quoteMore.Replace(q)
}

// plain reports whether s can be shown unquoted.
func plain(s string) bool {
	if s == "" || s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '\\' || c == '"' {
			return false
		}
	}
	for _, seq := range []string{"*/", "??", "``", "''"} {
		if strings.Contains(s, seq) {
			return false
		}
	}
	return true
}

var quoteMore = strings.NewReplacer("*", `\x2a`, "?", `\x3f`, "`", `\x60`, "'", `\x27`)
