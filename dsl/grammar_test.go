package dsl

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parseResult is Parse's result as text: the AST as JSON, or every
// diagnostic with its underline and hints.
func parseResult(t testing.TB, src string) string {
	f, err := Parse("m.cnn", []byte(src))
	if err == nil {
		b, jerr := json.Marshal(f)
		require.NoError(t, jerr)
		return string(b)
	}
	var ds Diagnostics
	if !errors.As(err, &ds) {
		t.Fatalf("%q: the error is not Diagnostics: %T %v", src, err, err)
	}
	var b strings.Builder
	for _, d := range ds {
		if !d.Pos.IsValid() || d.Pos.File != "m.cnn" {
			t.Fatalf("%q: a diagnostic without a position: %v", src, d)
		}
		fmt.Fprintf(&b, "%s|%d|%q\n", d.Error(), d.Len, d.Hints)
	}
	return b.String()
}

// withChunkDepth parses src with calls and lists parsed in chunks of
// depth levels.
func withChunkDepth(t testing.TB, depth int, src string) string {
	saved := chunkDepth
	chunkDepth = depth
	defer func() { chunkDepth = saved }()
	return parseResult(t, src)
}

// brokenModels: deep nesting with an error at every kind of place, and
// the syntax errors of TestSyntaxErrorsArePositioned's kinds.
func brokenModels() []string {
	const head = "model M(image: f32[1,4,4], label: class[2]) {\n  a = "
	nested := func(inner string) string {
		return head + strings.Repeat("f(g([h(k=", 3) + inner + strings.Repeat(")])), 1)", 3) + "\n}\n"
	}
	srcs := []string{
		nested("x"), nested("x y"), nested("x,,"), nested(""), nested("[1, 2,]"), nested("@"),
		nested("x)"), nested("x]"), nested("relu\n(x)"), nested("k=\n1"),
		head + strings.Repeat("relu(", 12) + "image" + strings.Repeat(")", 11) + "\n  b = 1\n}\n",
		head + strings.Repeat("relu(", 12) + "image" + strings.Repeat(")", 12) + " b\n}\n",
		head + strings.Repeat("[", 12) + "1" + strings.Repeat("]", 12) + "\n}\n",
		head + strings.Repeat("[", 12) + "1" + strings.Repeat("]", 13) + "\n}\n",
		head + strings.Repeat("[(", 6) + "\n}\n",
		head + strings.Repeat("relu(", 12),
		"model M(x: f32[[[[[1]]]]], y: class[f(g(h(2)))]) {}\n",
		"model M(x: f32[[[[[1]]]], y: class[2]) {}\n",
		"model M(x f32[1]) { a = " + strings.Repeat("relu(", 12) + "x" + strings.Repeat(")", 12) + " }",
		"model M(x: f32[1]) { a = relu(x, }",
		"model M(x: f32[1]) { a = relu(x)",
		"model M(x: f32[1]) {\n  a =\n  b = relu(a)\n}\n",
		"model M(x: f32[1]) {}\ntrain batch = 4\n",
		"model M(x: f32[1]) {}\nmodel N(x: f32[1]) {}\n",
		"model M(x: f32[1])\n  a = relu(x)\n}\n",
		"train { batch = 4 }", "", "modle M() {}", "model M(x: [1]) {}",
	}
	files, _ := filepath.Glob("../examples/*.cnn")
	for _, p := range files {
		if src, err := os.ReadFile(p); err == nil {
			srcs = append(srcs, string(src))
		}
	}
	return srcs
}

// TestChunksChangeNothing: parsing deep calls and lists in chunks (a
// chunk every 1, 2, 3 levels, or at the default depth) gives the same
// AST and the same diagnostics as parsing each file in one piece, also
// with errors inside, around and after chunks.
func TestChunksChangeNothing(t *testing.T) {
	srcs := brokenModels()
	// and some with a random token deleted, doubled or replaced
	rng := rand.New(rand.NewSource(1))
	pieces := []string{"(", ")", "[", "]", ",", "=", "x", "1", "\n", "{", "}", ";"}
	for _, src := range srcs[:len(srcs)] {
		for i := 0; i < 20 && len(src) > 0; i++ {
			at := rng.Intn(len(src))
			switch rng.Intn(3) {
			case 0:
				srcs = append(srcs, src[:at]+src[at+1:])
			case 1:
				srcs = append(srcs, src[:at]+src[at:at+1]+src[at:])
			default:
				srcs = append(srcs, src[:at]+pieces[rng.Intn(len(pieces))]+src[at+1:])
			}
		}
	}
	for _, src := range srcs {
		whole := withChunkDepth(t, 1<<30, src)
		for _, depth := range []int{1, 2, 3, chunkDepth} {
			require.Equal(t, whole, withChunkDepth(t, depth, src), "chunks of %d levels: %q", depth, src)
		}
	}
}

// FuzzParse: on any input Parse returns an AST or positioned
// diagnostics, never panics, and chunks change nothing.
func FuzzParse(f *testing.F) {
	for _, src := range brokenModels() {
		f.Add(src)
	}
	f.Fuzz(func(t *testing.T, src string) {
		whole := withChunkDepth(t, 1<<30, src)
		if chunked := withChunkDepth(t, 1, src); chunked != whole {
			t.Fatalf("chunks change the result of %q\nwhole:   %s\nchunked: %s", src, whole, chunked)
		}
	})
}

// TestErrorsBeforeTheNestingLimitComeFirst: nesting beyond MaxNesting
// is reported where the reader meets it, so a syntax error or an invalid
// character before it is reported instead.
func TestErrorsBeforeTheNestingLimitComeFirst(t *testing.T) {
	deep := strings.Repeat("relu(", MaxNesting+1) + "x" + strings.Repeat(")", MaxNesting+1)
	_, err := Parse("m.cnn", []byte("model M(x f32[1]) {\n  a = "+deep+"\n}\n"))
	assert.EqualError(t, err, `m.cnn:1:11: syntax error: expected ":" and the type of input x, found "f32"`)
	_, err = Parse("m.cnn", []byte("model M(x: f32[1]) {\n  a = $ "+deep+"\n}\n"))
	assert.EqualError(t, err, `m.cnn:2:7: syntax error: invalid character "$"`)
}

// TestNamesTakeTheirRoleFromTheirNeighbours: a name is an op before "("
// where a value stands, a keyword before "=" where an argument starts,
// whatever it is called and however the tokens are spaced.
func TestNamesTakeTheirRoleFromTheirNeighbours(t *testing.T) {
	src := "model model(model: f32[1]) {\n  train = relu (model)\n  data = f(\n    model\n    (1), k\n    = data, train=[g(h=1)])\n}\ntrain { model = sgd(lr=0.1) }\n"
	f, err := Parse("m.cnn", []byte(src))
	require.NoError(t, err)
	assert.Equal(t, "model", f.Model.Name)
	assert.Equal(t, "model", f.Model.Inputs[0].Name)
	s := f.Model.Stmts
	require.Len(t, s, 2)
	assert.Equal(t, "train", s[0].Name)
	assert.Equal(t, "relu", s[0].Value.Call.Name)
	assert.Equal(t, "model", s[0].Value.Call.Args[0].Value.Ident)
	args := s[1].Value.Call.Args
	require.Len(t, args, 3)
	assert.Equal(t, "model", args[0].Value.Call.Name)
	assert.Equal(t, Pos{File: "m.cnn", Line: 4, Col: 5, Offset: args[0].Pos.Offset}, args[0].Pos)
	assert.Equal(t, "k", args[1].Key)
	assert.Equal(t, "data", args[1].Value.Ident)
	assert.Equal(t, "train", args[2].Key)
	assert.Equal(t, "h", args[2].Value.List[0].Call.Args[0].Key)
	assert.Equal(t, Pos{File: "m.cnn", Line: 6, Col: 28, Offset: s[1].Value.EndPos.Offset}, s[1].Value.EndPos)
	assert.Equal(t, "model", f.Section("train").Stmts[0].Name)

	// a name before "(" or "=" where neither an op nor a keyword can stand
	for src, want := range map[string]string{
		"model M(x (1)) {}":                  `m.cnn:1:11: syntax error: expected ":" and the type of input x, found "("`,
		"model M(x: f32(1)) {}":              `m.cnn:1:15: syntax error: expected "[" and the dimensions of f32, found "("`,
		"model M(x: f32[1]) { a (x) }":       `m.cnn:1:24: syntax error: expected "=" after a, found "("`,
		"model M(x: f32[1]) { a = [b = 1] }": `m.cnn:1:29: syntax error: expected "," or "]" after the list element, found "="`,
		"model M(x: f32[1]) {}\ntrain (x)":   `m.cnn:2:7: syntax error: expected "{" to open the train block, found "("`,
	} {
		_, err := Parse("m.cnn", []byte(src))
		assert.EqualError(t, err, want, src)
	}
}
