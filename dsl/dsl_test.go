package dsl

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

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

// TestSyntaxErrorsArePositioned: every broken input gets one error that
// says what was expected, at the exact position where it is missing (the
// end of the line for a missing closer), never at the next line.
func TestSyntaxErrorsArePositioned(t *testing.T) {
	const m = "model M(image: f32[1,4,4], label: class[2]) {\n"
	cases := []struct{ src, want string }{
		{"model M(x: f32[1]) { a = @ }", `m.cnn:1:26: syntax error: invalid character "@"`},
		{"model M(x: f32[1]) { a = relu(x, }", `m.cnn:1:34: syntax error: expected an argument or ")" to close relu(, found "}"`},
		{"model M(x: f32[1]) { a = relu(x)", `m.cnn:1:33: syntax error: expected "}" to close the model M opened at 1:20, found the end of the file`},
		{m + "  a = relu(image\n  loss = cross_entropy(a, label)\n}\n", `m.cnn:2:17: syntax error: expected "," or ")" after the argument of relu( at the end of this line`},
		{m + "  a = linear(flatten(image), out=2\n  loss = cross_entropy(a, label)\n}\n", `m.cnn:2:35: syntax error: expected "," or ")" after the argument of linear( at the end of this line`},
		{m + "  a = relu(image)\n", `m.cnn:2:18: syntax error: expected "}" to close the model M opened at 1:45, found the end of the file`},
		{m + "  a relu(image)\n}\n", `m.cnn:2:5: syntax error: expected "=" after a, found "relu"`},
		{m + "  a =\n  b = relu(a)\n}\n", `m.cnn:2:6: syntax error: expected a value (an op call, a name, a number, a size, a string or a list) at the end of this line`},
		{m + "  a = relu(image))\n}\n", `m.cnn:2:18: syntax error: expected a statement (name = value) or "}" to close the model M, found ")"`},
		{"train {\n  batch = 4\n}\n", `m.cnn:1:1: syntax error: expected the model block first, found a train block`},
		{"data { train = mnist(\"d\") }\n", `m.cnn:1:1: syntax error: expected the model block first, found a data block`},
		{"", `m.cnn:1:1: syntax error: the file holds no model: expected the model block, model NAME(image: f32[C,H,W], label: class[N]) { ... }`},
		{"# only a comment\n\n", `m.cnn:1:1: syntax error: the file holds no model`},
		{"modle M() {}", `m.cnn:1:1: syntax error: expected the model block (model NAME(image: f32[C,H,W], label: class[N]) { ... }), found "modle"`},
		{"model (x: f32[1]) {}", `m.cnn:1:7: syntax error: expected the model's name after model, found "("`},
		{"model M x: f32[1]) {}", `m.cnn:1:9: syntax error: expected "(" and the inputs of model M, found "x"`},
		{"model M(x: f32[1])\n  a = relu(x)\n}\n", `m.cnn:1:19: syntax error: expected "{" to open the model M at the end of this line`},
		{"model M(x f32[1]) {}", `m.cnn:1:11: syntax error: expected ":" and the type of input x, found "f32"`},
		{"model M(x: [1]) {}", `m.cnn:1:12: syntax error: expected the type of input x: f32[C,H,W] or class[N], found "["`},
		{"model M(x: f32) {}", `m.cnn:1:15: syntax error: expected "[" and the dimensions of f32, found ")"`},
		{"model M(x: f32[1,2) {}", `m.cnn:1:19: syntax error: expected "," or "]" after the dimension of x, found ")"`},
		{"model M(x: f32[1] y: class[2]) {}", `m.cnn:1:19: syntax error: expected "," or ")" after input x, found "y"`},
		{"model M(x: f32[1]) {}\ntrain { b = [1, 2\n  seed = 1 }\n", `m.cnn:2:18: syntax error: expected "," or "]" after the list element at the end of this line`},
		{"model M(x: f32[1]) {}\ntrain { b = [1, }\n", `m.cnn:2:17: syntax error: expected a list element or "]" to close the list opened at 2:13, found "}"`},
		{"model M(x: f32[1]) {}\nmodel N(x: f32[1]) {}\n", `m.cnn:2:1: syntax error: expected a train or data block, found "model"`},
		{"model M(x: f32[1]) {}\nfoo\n", `m.cnn:2:1: syntax error: expected a train or data block (or the end of the file), found "foo"`},
		{"model M(x: f32[1]) {}\ntrain batch = 4\n", `m.cnn:2:7: syntax error: expected "{" to open the train block, found "batch"`},
		{"model M(x: f32[1]) { a = conv2d(x, kernel=3x3) }", `m.cnn:1:43: syntax error: "3x3" is not a number`},
		{"model M(x: f32[1]) {}\ntrain { memory_budget = 64Mib }", `m.cnn:2:25: syntax error: "64Mib" is not a memory size`},
		{"model M(x: f32[1]) {}\ntrain { memory_budget = -1MB }", `m.cnn:2:25: syntax error: "-1MB" is not a memory size: sizes cannot be negative`},
		{"model M(x: f32[1]) { a = 99999999999999999999 }", "m.cnn:1:26: integer 99999999999999999999 does not fit in 64 bits"},
		{"model M(x: f32[1]) { a = 1e999 }", "m.cnn:1:26: number 1e999 is out of range"},
		{"model M(x: f32[1]) {}\ntrain { b = 9999999999999999999GiB }", `m.cnn:2:13: memory size "9999999999999999999GiB" is too large`},
		{"model M(x: f32[1]) { a = \"open }", `m.cnn:1:26: syntax error: unterminated string: a string starts and ends with " on one line`},
		{"model M(x: f32[1]) { a = \"\\q\" }", `m.cnn:1:26: bad string literal "\q"`},
		{"model M(x: f32[1]) { a = relu(x) \x1b[31m }", `m.cnn:1:34: syntax error: invalid character "\x1b"`},
		{"model M(x: f32[1]) { a = \xff }", `m.cnn:1:26: syntax error: invalid character byte 0xff (the file is not UTF-8 text)`},
		{"model M(x: f32[1]) { é = relu(x) }", `m.cnn:1:22: syntax error: invalid character "é"`},
		{"model M(x: f32[1]) {\n\tb = . }", `m.cnn:2:6: syntax error: invalid character "."`},
	}
	for _, c := range cases {
		_, err := Parse("m.cnn", []byte(c.src))
		require.Error(t, err, c.src)
		var ds Diagnostics
		require.ErrorAs(t, err, &ds)
		require.Len(t, ds, 1, c.src)
		got := ds[0].Error()
		assert.True(t, strings.HasPrefix(got, c.want), "%q\n got: %s\nwant: %s", c.src, got, c.want)
		assert.GreaterOrEqual(t, ds[0].Pos.Line, 1, c.src)
		assert.GreaterOrEqual(t, ds[0].Pos.Col, 1, c.src)
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

// TestRenderEscapesWhatTheTerminalWouldRun: ANSI escapes, other control
// characters and bidirectional-text controls from the model file (in a
// comment, a name, the file's name) are printed escaped, and the caret
// still stands under the token.
func TestRenderEscapesWhatTheTerminalWouldRun(t *testing.T) {
	src := []byte("model M(x: f32[1]) {\n  a = relu(y) # \x1b[31mred\x1b[0m\u202e\n}\n")
	d := Errorf(Pos{File: "m\x1b]0;t\x07.cnn", Line: 2, Col: 12}, "unknown name y").Span(1).Hint("a hint with \x1b[2J")
	got := d.Render(src)
	assert.Equal(t, "m\\x1b]0;t\\x07.cnn:2:12: unknown name y\n"+
		"      a = relu(y) # \\x1b[31mred\\x1b[0m\\u202e\n"+
		"               ^\n"+
		"    a hint with \\x1b[2J\n", got)
	assert.NotContains(t, got, "\x1b")

	// a caret after escaped characters moves by their escaped width
	src = []byte("a = \x1b\x1b relu(y)\n")
	d = Errorf(Pos{File: "m.cnn", Line: 1, Col: 12}, "unknown name y")
	assert.Equal(t, "m.cnn:1:12: unknown name y\n    a = \\x1b\\x1b relu(y)\n                     ^\n", d.Render(src))

	// columns count runes: a caret after "é" lines up
	src = []byte("# é\nab = relu(é)\n")
	d = Errorf(Pos{File: "m.cnn", Line: 2, Col: 11}, "x").Span(1)
	assert.Equal(t, "m.cnn:2:11: x\n    ab = relu(é)\n              ^\n", d.Render(src))

	assert.Equal(t, `a\x00b\x7f\x9b\xff\u2028`, Printable("a\x00b\x7f\u009b\xff\u2028"))
	assert.Equal(t, "plain: é, ü, 中", Printable("plain: é, ü, 中"))
}

// allocated is the bytes f allocates: unlike time, it does not depend on
// the machine's load, so it can tell linear from quadratic in a unit test.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRenderAllIsLinear: four times the diagnostics over a four times
// longer source cost about four times the memory (the old per-diagnostic
// split of the whole source was quadratic: about 90 s for 40,000 unused
// layers). The bound, 6, leaves room for slice and builder growth.
func TestRenderAllIsLinear(t *testing.T) {
	render := func(n int) (string, uint64) {
		var b strings.Builder
		var ds Diagnostics
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "  u%d = relu(image)\n", i)
			ds = append(ds, Warnf(Pos{File: "m.cnn", Line: i + 1, Col: 3}, "u%d is not used", i))
		}
		src := map[string][]byte{"m.cnn": []byte(b.String())}
		var out string
		bytes := allocated(func() { out = ds.RenderAll(src) })
		return out, bytes
	}
	_, small := render(10000)
	out, large := render(40000)
	assert.Equal(t, 3*40000, strings.Count(out, "\n"))
	t.Logf("RenderAll: %d -> %d bytes allocated (x%.1f)", small, large, float64(large)/float64(small))
	assert.Less(t, float64(large)/float64(small), 6.0, "rendering grows faster than the diagnostics")
}

func TestReadFileRefusesWhatIsNoModelFile(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadFile(dir)
	assert.ErrorContains(t, err, dir+" is a directory, not a model file")

	_, err = ReadFile("/dev/zero")
	assert.EqualError(t, err, "/dev/zero is a character device, not a model file: give the path of a .cnn text file")

	fifo := filepath.Join(dir, "pipe.cnn")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() { _, err := ReadFile(fifo); done <- err }()
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "pipe.cnn is a named pipe (FIFO), not a model file")
	case <-time.After(5 * time.Second):
		t.Fatal("ReadFile blocks on a FIFO")
	}

	big := filepath.Join(dir, "big.cnn")
	require.NoError(t, os.WriteFile(big, make([]byte, MaxSourceBytes+1), 0o600))
	_, err = ReadFile(big)
	assert.EqualError(t, err, big+" is larger than 8.39 MB (8388608 bytes), the most a model file may hold")

	ok := filepath.Join(dir, "ok.cnn")
	require.NoError(t, os.WriteFile(ok, []byte("model M() {}"), 0o600))
	src, err := ReadFile(ok)
	require.NoError(t, err)
	assert.Equal(t, "model M() {}", string(src))

	_, err = Parse("big.cnn", make([]byte, MaxSourceBytes+1))
	assert.ErrorContains(t, err, "big.cnn:1:1: the file has 8388609 bytes; a model file may have at most 8388608 (8.39 MB)")
}

// TestDeepNestingIsLinear: four times the nesting costs about four times
// the memory (the old parser took memory quadratic in the depth), and nesting
// beyond MaxNesting is a positioned error, not a stack overflow.
func TestDeepNestingIsLinear(t *testing.T) {
	nested := func(n int) []byte {
		return []byte("model M(image: f32[1,4,4], label: class[2]) {\n  a = " + strings.Repeat("relu(", n) + "image" + strings.Repeat(")", n) + "\n}\n")
	}
	var f *File
	var err error
	small := allocated(func() { _, err = Parse("m.cnn", nested(25000)) })
	require.NoError(t, err)
	large := allocated(func() { f, err = Parse("m.cnn", nested(100000)) })
	require.NoError(t, err)
	t.Logf("nesting 25,000 -> 100,000: %d -> %d bytes allocated (x%.1f)", small, large, float64(large)/float64(small))
	assert.Less(t, float64(large)/float64(small), 6.0, "parsing grows faster than the nesting")
	depth := 0
	for e := f.Model.Stmts[0].Value; e.Kind == ExprCall; e = e.Call.Args[0].Value {
		depth++
	}
	assert.Equal(t, 100000, depth)

	_, err = Parse("m.cnn", nested(MaxNesting+1))
	assert.ErrorContains(t, err, fmt.Sprintf("m.cnn:2:%d: calls and lists nest more than 200000 deep here", 7+5*MaxNesting))
}

// A long line (a generated model may put a megabyte on one) is shown cut
// to the part around the caret.
func TestRenderCutsLongLines(t *testing.T) {
	line := "  a = " + strings.Repeat("relu(", 1000) + "x" + strings.Repeat(")", 1000)
	d := Errorf(Pos{File: "m.cnn", Line: 1, Col: 5007}, "unknown name x").Span(1)
	got := d.Render([]byte(line + "\n"))
	lines := strings.Split(got, "\n")
	require.Len(t, lines, 4)
	assert.LessOrEqual(t, len(lines[1]), 4+3+maxExcerpt+3)
	assert.True(t, strings.HasPrefix(lines[1], "    ...relu("), lines[1])
	assert.True(t, strings.HasSuffix(lines[1], ")..."), lines[1])
	caret := strings.Index(lines[2], "^")
	assert.Equal(t, "x", lines[1][caret:caret+1], "the caret stays under the token")
	assert.Equal(t, "x", lines[1][len("    ")+maxExcerpt/3+3:][:1])

	// short lines are whole
	d = Errorf(Pos{File: "m.cnn", Line: 1, Col: 3}, "x")
	assert.Equal(t, "m.cnn:1:3: x\n    ab c\n      ^\n", d.Render([]byte("ab c")))
}
