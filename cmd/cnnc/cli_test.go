package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/version"
)

func cnnc(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheckSimpleCNN(t *testing.T) {
	code, out, errOut := cnnc("check", "../../examples/simplecnn.cnn")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "total params:        3,692,906")
	assert.Contains(t, out, "[32,32,30,30]")
	assert.Contains(t, out, "conv2d")
	assert.Empty(t, errOut)
}

func TestCheckSeedModelFailsAtTheLine(t *testing.T) {
	code, out, errOut := cnnc("check", "../../examples/seed_simplecnn.cnn")
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "../../examples/seed_simplecnn.cnn:11:13: fc1: linear expects 28800 input features (32x30x30) but flatten gives 492032 (32x124x124)")
	assert.Contains(t, errOut, "a 2x2 max-pool after each conv gives exactly 32x30x30")
	assert.NotContains(t, errOut, "goroutine", "never a Go stack trace")
}

func TestFlagsBeforeOrAfterTheFile(t *testing.T) {
	c1, out1, _ := cnnc("check", "--batch", "8", "../../examples/mnist.cnn")
	c2, out2, _ := cnnc("check", "../../examples/mnist.cnn", "--batch=8")
	require.Equal(t, 0, c1)
	require.Equal(t, 0, c2)
	assert.Equal(t, out1, out2)
	assert.Contains(t, out1, "batch 8")
}

func TestDumpAfter(t *testing.T) {
	code, out, errOut := cnnc("check", "../../examples/mnist.cnn", "--dump-after", "shapes")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "# IR after shapes\ngraph MNISTNet\n")
	assert.NotContains(t, out, "backward:")
	code, out, _ = cnnc("check", "--dump-after=all", "../../examples/mnist.cnn")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "# IR after autodiff")
	assert.Contains(t, out, "update:\n  sgd_update(")
	code, _, errOut = cnnc("check", "--dump-after=bogus", "../../examples/mnist.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown pass "bogus" (passes: shapes, dce, autodiff, infer, bnfold, fuse)`)
}

func TestBadCommandLines(t *testing.T) {
	code, _, errOut := cnnc("check")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "check takes one model file")
	code, _, errOut = cnnc("check", "does/not/exist.cnn")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "does/not/exist.cnn")
	code, _, errOut = cnnc("frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "unknown command")
	code, _, errOut = cnnc("check", "--batch=-3", "../../examples/mnist.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "cnnc: --batch -3: the batch must be between 1 and 1,048,576")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.cnn")
	require.NoError(t, os.WriteFile(bad, []byte("model M(image: f32[1,4,4], label: class[2]) {\n  x = relu(imag)\n}\n"), 0o644))
	code, _, errOut = cnnc("check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, bad+":2:12: unknown name imag\n      x = relu(imag)\n               ^~~~\n    did you mean image?\n")
}

// A bad flag is one line naming the flag and what it wants (or the flag
// meant), and where help is, exit status 2: the trainers' language
// (runtime/trainer/cli.FlagError), never strconv's.
func TestFlagErrorsSpeakTheTrainersLanguage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--batch", "abc", "../../examples/mnist.cnn"}, `cnnc: --batch "abc": want a whole number; see cnnc plan --help` + "\n"},
		{[]string{"plan", "--memory-budjet", "1GB", "../../examples/mnist.cnn"}, "cnnc: unknown flag --memory-budjet (did you mean --memory-budget?); see cnnc plan --help\n"},
		{[]string{"build", "-target", "cpu", "../../examples/mnist.cnn"}, "cnnc: -target: flags take two dashes: --target; see cnnc build --help\n"},
		{[]string{"check", "--batch"}, "cnnc: --batch needs a value; see cnnc check --help\n"},
		{[]string{"check", "-x", "../../examples/mnist.cnn"}, "cnnc: unknown flag -x; see cnnc check --help\n"},
		{[]string{"--bogus"}, "cnnc: unknown flag --bogus; see cnnc --help\n"},
	} {
		code, out, errOut := cnnc(c.args...)
		assert.Equal(t, 2, code, "%v", c.args)
		assert.Empty(t, out, "%v", c.args)
		assert.Equal(t, c.want, errOut, "%v", c.args)
	}
}

func TestHelpForEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"check", "-h"}, {"passes", "-h"}} {
		code, out, _ := cnnc(args...)
		assert.Equal(t, 0, code, args)
		assert.Contains(t, out, "Usage:", args)
	}
	_, out, _ := cnnc("check", "-h")
	assert.Contains(t, out, "--dump-after")
	assert.Contains(t, out, "--batch")
}

// With passes disabled, check checks the model without planning or
// generating kernels (cnnc build always runs every pass).
func TestCheckWithDisabledPasses(t *testing.T) {
	for _, pass := range []string{"fuse", "dce", "fuse,dce"} {
		code, out, errOut := cnnc("check", "--disable", pass, "../../examples/mnist.cnn")
		assert.Equal(t, 0, code, "%s: %s", pass, errOut)
		assert.Contains(t, out, "total params:")
	}
}

func TestPassesLists(t *testing.T) {
	code, out, _ := cnnc("passes")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "shapes     required")
	assert.Contains(t, out, "dce        optional")
}

func TestVersion(t *testing.T) {
	want := version.Get().String() + "\n"
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errOut := cnnc(args...)
		assert.Equal(t, 0, code, errOut)
		assert.Equal(t, want, out, args)
		assert.True(t, strings.HasPrefix(out, "cnnc "), out)
	}
}

func TestHelpText(t *testing.T) {
	_, out, _ := cnnc("-h")
	assert.NotContains(t, out, "later stages")
	assert.Contains(t, out, "plans every byte of device memory")
	assert.Contains(t, out, "version")
	_, out, _ = cnnc("check", "-h")
	assert.Contains(t, out, "--disable PASSES ")
	assert.Contains(t, out, "--dump-after PASS ")
	assert.Contains(t, out, "--batch N ")
	assert.NotContains(t, out, "--disable cnnc passes")
	assert.NotContains(t, out, "--batch int")
	assert.NotContains(t, out, " string ")
	_, out, _ = cnnc("plan", "-h")
	assert.Contains(t, out, "--memory-budget SIZE ")
	assert.Contains(t, out, "--plot FILE ")
	// every flag that takes a value names it, never by its Go type
	for _, cmd := range []string{"check", "plan", "build", "gen", "export"} {
		_, out, _ = cnnc(cmd, "-h")
		assert.NotRegexp(t, `--[a-z-]+ (string|int|int64|strings|float64) `, out, cmd)
	}
}

// Model files must be regular files of bounded size, for every command:
// /dev/zero, a directory or a FIFO is refused by name (and a FIFO without
// waiting for a writer).
func TestModelFileArguments(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "model.cnn")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	big := filepath.Join(dir, "big.cnn")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat("#\n", dsl.MaxSourceBytes/2+1)), 0o600))
	for _, cmd := range [][]string{{"check"}, {"plan"}, {"build", "--emit-cuda", dir}, {"gen", "-o", filepath.Join(dir, "pkg")}} {
		for file, want := range map[string]string{
			"/dev/zero": "cnnc: /dev/zero is a character device, not a model file: give the path of a .cnn text file\n",
			dir:         "cnnc: " + dir + " is a directory, not a model file",
			fifo:        "cnnc: " + fifo + " is a named pipe (FIFO), not a model file",
			big:         "cnnc: " + big + " is larger than 8.39 MB (8388608 bytes), the most a model file may hold\n",
		} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				code, out, errOut := cnnc(append(cmd, file)...)
				assert.Equal(t, 1, code, "%v %s", cmd, file)
				assert.Empty(t, out)
				assert.True(t, strings.HasPrefix(errOut, want), "%v %s: %s", cmd, file, errOut)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("cnnc %v %s does not return", cmd, file)
			}
		}
	}
}

// refusals are models cnnc build refuses: cnnc check must refuse each too,
// with the same positioned error (file:line:col), before any kernel is
// compiled. (Issue #14: some of these passed check and failed at build or
// at run time, or printed no position.)
var refusals = []struct {
	name, src, want string
}{
	{"a third input", "model M(image: f32[1,28,28], label: class[10], extra: f32[1,28,28]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		":1:48: model M takes two inputs, an image and its labels; extra is a third"},
	{"labels before the image", "model M(label: class[10], image: f32[1,28,28]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		":1:16: input 1 of model M must be the image, f32[C,H,W]; label is class[...]"},
	{"a 4-channel model fed MNIST", "model M(image: f32[4,28,28], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = mnist(\"d\")\n}\n",
		":6:11: mnist images are 1x28x28 but the model's input is 4x28x28"},
	{"MNIST into 5 classes", "model M(image: f32[1,28,28], label: class[5]) {\n  f = linear(flatten(image), out=5)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = mnist(\"d\")\n}\n",
		":6:11: mnist has 10 classes (the digits 0 to 9) but the model's labels are class[5]"},
	{"an imagefolder resize that is not the input", "model M(image: f32[3,32,32], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = imagefolder(\"d\", resize=[64,64])\n}\n",
		":6:35: imagefolder resizes to 64x64 but the model's input is 32x32"},
	{"two channels", "model M(image: f32[2,8,8], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		":1:20: input image has 2 channels; the trainers read images with 1 (grayscale) or 3 (RGB)"},
	{"an image side beyond the loaders", "model M(image: f32[1,20000,8], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		":1:22: input image: a height of 20,000 pixels; the trainers read images of at most 16,384 a side"},
	{"a conv kernel beyond the kernels", "model M(image: f32[1,64,64], label: class[10]) {\n  c = conv2d(image, out=4, kernel=40)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		":2:35: conv2d: kernel must be at most 32, got 40"},
	{"output channels beyond a grid", "model M(image: f32[1,8,8], label: class[10]) {\n  f = linear(flatten(image), out=5000000)\n  g = linear(f, out=10)\n  loss = cross_entropy(g, label)\n}\n",
		":2:34: linear: out must be at most 4,194,240, got 5,000,000"},
	{"an input-gradient tile beyond shared memory", "model M(image: f32[3,64,64], label: class[10]) {\n  c1 = conv2d(image, out=64, kernel=3)\n  c2 = conv2d(c1, out=8, kernel=20)\n  f = linear(flatten(c2), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		":3:8: c2: cnnc's kernels cannot run this layer: the input-gradient tile needs 111716 bytes of shared memory"},
	{"a budget below the parameters", "model M(image: f32[3,64,64], label: class[10]) {\n  c = conv2d(image, out=8, kernel=3)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  memory_budget = 1MB\n}\n",
		":7:19: memory_budget 1.00 MB is too small for M: its parameters and optimizer state alone need 1.23 MB"},
	{"batch 2^31", "model M(image: f32[1,28,28], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 2147483648\n}\n",
		":6:11: train block: batch must be at most 1,048,576, got 2,147,483,648"},
	{"batch 2^62", "model M(image: f32[1,28,28], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 4611686018427387904\n}\n",
		":6:11: train block: batch must be at most 1,048,576, got 4,611,686,018,427,387,904"},
	{"a batch beyond a conv grid", "model M(image: f32[1,2048,2048], label: class[10]) {\n  c = conv2d(image, out=1, kernel=1)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 1024\n}\n",
		":2:7: at batch 1,024, c's kernels could launch up to 4,294,967,296 blocks in one grid dimension, more than CUDA allows (2,147,483,647)"},
	{"lr = 0", "model M(image: f32[1,28,28], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = sgd(lr=0)\n}\n",
		":6:22: sgd: lr must be positive, got 0"},
	{"a missing )", "model M(image: f32[1,28,28], label: class[10]) {\n  f = linear(flatten(image), out=10\n  loss = cross_entropy(f, label)\n}\n",
		":2:36: syntax error: expected \",\" or \")\" after the argument of linear( at the end of this line"},
}

func TestCheckRefusesWhatBuildRefuses(t *testing.T) {
	dir := t.TempDir()
	positioned := regexp.MustCompile(`^(\S+):([1-9][0-9]*):([1-9][0-9]*): `)
	for i, c := range refusals {
		path := filepath.Join(dir, fmt.Sprintf("m%d.cnn", i))
		require.NoError(t, os.WriteFile(path, []byte(c.src), 0o600))
		var first []string
		for _, cmd := range [][]string{{"check"}, {"build", "--emit-cuda", filepath.Join(dir, "out")}} {
			code, _, errOut := cnnc(append(cmd, path)...)
			assert.Equal(t, 1, code, "%s: cnnc %s: %s", c.name, cmd[0], errOut)
			line, _, _ := strings.Cut(errOut, "\n")
			m := positioned.FindStringSubmatch(line)
			if assert.NotNil(t, m, "%s: cnnc %s: no file:line:col: %s", c.name, cmd[0], errOut) {
				assert.Equal(t, path, m[1])
			}
			assert.True(t, strings.HasPrefix(line, path+c.want), "%s: cnnc %s:\n got: %s\nwant: %s%s", c.name, cmd[0], line, path, c.want)
			assert.NotContains(t, errOut, "goroutine")
			first = append(first, line)
		}
		assert.Equal(t, first[0], first[1], "%s: check and build say the same", c.name)
	}
	_, err := os.Stat(filepath.Join(dir, "out"))
	assert.True(t, os.IsNotExist(err), "build wrote no kernels for any of them")
}

// A max-pool larger than a conv tile used to pass check and fail in build
// (codegen: "pool window 9x9 is larger than a conv tile of 64"); now the
// pool runs on its own and both accept it.
func TestLargePoolBuilds(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "pool.cnn")
	require.NoError(t, os.WriteFile(path, []byte("model M(image: f32[1,28,28], label: class[10]) {\n  c = conv2d(image, out=4, kernel=3)\n  p = maxpool(c, kernel=9)\n  f = linear(flatten(p), out=10)\n  loss = cross_entropy(f, label)\n}\n"), 0o600))
	code, _, errOut := cnnc("check", path)
	assert.Equal(t, 0, code, errOut)
	code, _, errOut = cnnc("build", "--emit-cuda", dir, path)
	assert.Equal(t, 0, code, errOut)
}

// Thousands of warnings print the first hundred and a count; control
// characters from the file never reach the terminal.
func TestDiagnosticsAreCappedAndEscaped(t *testing.T) {
	var b strings.Builder
	b.WriteString("model M(image: f32[1,4,4], label: class[2]) {\n  a = linear(flatten(image), out=2)\n  loss = cross_entropy(a, label)\n")
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&b, "  u%d = relu(image)  # \x1b[2J\x1b]0;pwned\x07\n", i)
	}
	b.WriteString("}\n")
	path := filepath.Join(t.TempDir(), "m\x1b[31m.cnn")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	code, _, errOut := cnnc("check", path)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, 100, strings.Count(errOut, "warning: "))
	assert.Contains(t, errOut, "... and 200 more (0 errors, 200 warnings) not shown\n")
	assert.NotContains(t, errOut, "\x1b")
	assert.NotContains(t, errOut, "\x07")
	assert.Contains(t, errOut, `m\x1b[31m.cnn:4:8: warning: u0 is not used by the loss`)
	assert.Contains(t, errOut, `# \x1b[2J\x1b]0;pwned\x07`)
	for _, cmd := range [][]string{{"plan"}, {"build", "--emit-cuda", t.TempDir()}} {
		code, out, errOut := cnnc(append(cmd, path)...)
		require.Equal(t, 0, code, errOut)
		assert.Contains(t, out, `m\x1b[31m.cnn`, cmd)
		assert.NotContains(t, out+errOut, "\x1b", cmd)
	}
}
