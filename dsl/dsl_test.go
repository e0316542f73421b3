package dsl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSimpleCNN(t *testing.T) {
	src, err := os.ReadFile("../examples/simplecnn.cnn")
	require.NoError(t, err)
	f, err := Parse("simplecnn.cnn", src)
	require.NoError(t, err)
	m := f.Model
	assert.Equal(t, "SimpleCNN", m.Name)
	require.Len(t, m.Inputs, 2)
	assert.Equal(t, "image", m.Inputs[0].Name)
	assert.Equal(t, "f32", m.Inputs[0].Type)
	assert.Len(t, m.Inputs[0].Dims, 3)
	assert.Equal(t, "class", m.Inputs[1].Type)
	require.Len(t, m.Stmts, 9)
	fc1 := m.Stmts[6]
	assert.Equal(t, "fc1", fc1.Name)
	assert.Equal(t, Pos{File: "simplecnn.cnn", Line: 10, Col: 5, Offset: fc1.Pos.Offset}, fc1.Pos)
	call := fc1.Value.Call
	assert.Equal(t, "linear", call.Name)
	require.Len(t, call.Args, 2)
	assert.Equal(t, ExprCall, call.Args[0].Value.Kind)
	assert.Equal(t, "flatten", call.Args[0].Value.Call.Name)
	assert.Equal(t, "out", call.Args[1].Key)
	assert.Equal(t, int64(128), call.Args[1].Value.Int)

	train := f.Section("train")
	require.NotNil(t, train)
	assert.Equal(t, "optimizer", train.Stmts[0].Name)
	assert.Equal(t, 0.9, train.Stmts[0].Value.Call.Args[1].Value.Float)
	assert.Equal(t, int64(64<<20), train.Stmts[3].Value.Size)
	data := f.Section("data")
	require.NotNil(t, data)
	assert.Equal(t, "data/train", data.Stmts[0].Value.Call.Args[0].Value.String)
	assert.Len(t, data.Stmts[0].Value.Call.Args[1].Value.List, 2)
}

func TestParseEveryExample(t *testing.T) {
	files, err := filepath.Glob("../examples/*.cnn")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, p := range files {
		src, err := os.ReadFile(p)
		require.NoError(t, err)
		_, err = Parse(p, src)
		assert.NoError(t, err, p)
	}
}

func TestSyntaxFlexibility(t *testing.T) {
	// semicolons, trailing commas, // comments, empty blocks
	src := "// c\nmodel M(image: f32[1,2,2], label: class[2],) { a = relu(image,); b = relu(a) }\ntrain {}\n"
	f, err := Parse("m.cnn", []byte(src))
	require.NoError(t, err)
	assert.Len(t, f.Model.Stmts, 2)
}

func TestSyntaxErrorsArePositioned(t *testing.T) {
	cases := []struct{ src, want string }{
		{"model M(x: f32[1]) { a = @ }", "m.cnn:1:26: syntax error: invalid character \"@\""},
		{"model M(x: f32[1]) { a = relu(x, }", "m.cnn:1:34: syntax error: unexpected \"}\""},
		{"model M(x: f32[1]) { a = relu(x)", "m.cnn:1:33: syntax error: unexpected end of file"},
		{"model M(x: f32[1]) { a = 99999999999999999999 }", "m.cnn:1:26: integer 99999999999999999999 does not fit in 64 bits"},
		{"model M(x: f32[1]) { a = 1e999 }", "m.cnn:1:26: number 1e999 is out of range"},
		{"model M(x: f32[1]) {}\ntrain { b = 9999999999999999999GiB }", "m.cnn:2:13: memory size \"9999999999999999999GiB\" is too large"},
		{"modle M() {}", "m.cnn:1:1: syntax error: unexpected \"modle\""},
		{"", "m.cnn:1:1: syntax error: unexpected end of file"},
		{"model M(x: f32[1]) { a = \"open }", "m.cnn:1:26: syntax error: invalid character"},
	}
	for _, c := range cases {
		_, err := Parse("m.cnn", []byte(c.src))
		require.Error(t, err, c.src)
		var ds Diagnostics
		require.ErrorAs(t, err, &ds)
		assert.Contains(t, ds.Error(), c.want, c.src)
	}
}

func TestRenderShowsLineAndCaret(t *testing.T) {
	src := []byte("model M(x: f32[1]) {\n\ta = relu(y)\n}\n")
	d := Errorf(Pos{File: "m.cnn", Line: 2, Col: 11}, "unknown name y").Span(1).Hint("did you mean x?")
	assert.Equal(t, "m.cnn:2:11: unknown name y\n     a = relu(y)\n              ^\n    did you mean x?\n", d.Render(src))
	w := Warnf(Pos{File: "m.cnn", Line: 9, Col: 1}, "far away")
	assert.Equal(t, "m.cnn:9:1: warning: far away\n", w.Render(src), "no excerpt past the end of the file")
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"64MiB": 64 << 20, "40MB": 40e6, "1.5GiB": 3 << 29, "512KiB": 512 << 10, "2KB": 2000,
		"1GB": 1e9, "100B": 100, "1024": 1024, "1TiB": 1 << 40,
	} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "MiB", "-1MB", "1.5B", "x"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
	}
	assert.Equal(t, "14.09 MiB", FormatSize(14771624))
	assert.Equal(t, "512 B", FormatSize(512))
}
