package compiler

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
)

// compileFile compiles an example, verifying the IR after every pass.
func compileFile(t *testing.T, path string, opts Options) *Result {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	opts.AfterPass = verifyAfter(t)
	res, err := CompileSource(path, src, opts)
	require.NoError(t, err)
	return res
}

func verifyAfter(t *testing.T) func(string, *ir.Graph) error {
	return func(pass string, g *ir.Graph) error {
		t.Helper()
		require.NoError(t, g.Verify(), "IR invalid after pass %s:\n%s", pass, g.Text())
		return nil
	}
}

func TestSimpleCNNHasPyTorchsParameterCount(t *testing.T) {
	res := compileFile(t, "../examples/simplecnn.cnn", Options{})
	assert.Equal(t, int64(3692906), res.Graph.ParamCount())
	s := res.Summary
	assert.Equal(t, int64(3692906), s.Params)
	var b strings.Builder
	s.Print(&b)
	assert.Contains(t, b.String(), "3,692,906")
	assert.Contains(t, b.String(), "[32,32,30,30]")
	assert.Equal(t, int64(32), res.Train.Batch)
	assert.Equal(t, int64(64<<20), res.Train.MemoryBudget)
	assert.Equal(t, ir.SGD, res.Train.Optimizer.Kind)
	assert.Equal(t, 0.9, res.Train.Optimizer.Momentum)
	require.NotNil(t, res.Data.Train)
	assert.Equal(t, "data/train", res.Data.Train.Path)
	assert.Equal(t, [2]int64{128, 128}, res.Data.Train.Resize)
	// PyTorch state_dict names
	var names []string
	for _, p := range res.Graph.Params {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}, names)
}

func TestSummaryFLOPs(t *testing.T) {
	res := compileFile(t, "../examples/simplecnn.cnn", Options{Batch: 1})
	s := res.Summary
	byLayer := map[string]SummaryRow{}
	for _, r := range s.Rows {
		byLayer[r.Layer] = r
	}
	// conv1: 2*3*3*3 MACs... per output element, 16x126x126 outputs, plus bias
	assert.Equal(t, int64(2*27*16*126*126+16*126*126), byLayer["conv1"].FLOPs)
	assert.Equal(t, int64(2*28800*128+128), byLayer["fc1"].FLOPs)
	assert.Equal(t, "[1,16,126,126]", byLayer["conv1"].Output)
}

// The OOM guide's model as written: fc1 expects 32x30x30 but gets 32x124x124.
func TestSeedModelFailsAtFc1WithTheFix(t *testing.T) {
	src, err := os.ReadFile("../examples/seed_simplecnn.cnn")
	require.NoError(t, err)
	_, err = CompileSource("examples/seed_simplecnn.cnn", src, Options{})
	require.Error(t, err)
	var ds dsl.Diagnostics
	require.ErrorAs(t, err, &ds)
	require.Len(t, ds, 1)
	out := ds.RenderAll(map[string][]byte{"examples/seed_simplecnn.cnn": src})
	assert.Contains(t, out, "examples/seed_simplecnn.cnn:11:13: fc1: linear expects 28800 input features (32x30x30) but flatten gives 492032 (32x124x124)\n")
	assert.Contains(t, out, "        fc1   = linear(flat, in=28800, out=128)\n                ^~~~~~\n")
	assert.Contains(t, out, "a 2x2 max-pool after each conv gives exactly 32x30x30 = 28800: add maxpool(..., kernel=2) after relu1 and relu2")
}

const header = "model M(image: f32[3,32,32], label: class[10]) {\n"

// TestErrors: every rejection is a positioned diagnostic with the message
// a user needs.
// errorCases are the front end's rejections with the messages users see;
// they also seed the fuzzer.
var errorCases = []struct {
	name, src string
	want      []string // substrings of the rendered diagnostics
}{
	{"lexical", header + "  a = relu(image) $\n}\n", []string{"m.cnn:2:19: syntax error: invalid character \"$\""}},
	{"syntax", header + "  a = relu(image\n  b = relu(a)\n}\n", []string{"m.cnn:2:17: syntax error: expected \",\" or \")\" after the argument of relu( at the end of this line"}},
	{"unknown op", header + "  c = convv2d(image, out=4, kernel=3)\n}\n", []string{"m.cnn:2:7: unknown op convv2d", "did you mean conv2d?"}},
	{"unknown name", header + "  conv1 = conv2d(image, out=4, kernel=3)\n  r = relu(conv)\n}\n", []string{"m.cnn:3:12: unknown name conv", "did you mean conv1?"}},
	{"duplicate", header + "  a = relu(image)\n  a = relu(image)\n}\n", []string{"m.cnn:3:3: a is already defined at line 2"}},
	{"input name reused", header + "  image = relu(image)\n}\n", []string{"m.cnn:2:3: image is already the name of a model input"}},
	{"bad argument value", header + "  c = conv2d(image, out=4, kernel=0)\n}\n", []string{"m.cnn:2:35: conv2d: kernel must be at least 1, got 0"}},
	{"bad argument type", header + "  c = conv2d(image, out=4, kernel=\"3\")\n}\n", []string{"m.cnn:2:35: conv2d: kernel must be an integer, got a string"}},
	{"unknown argument", header + "  c = conv2d(image, out=4, kernal=3)\n}\n", []string{"m.cnn:2:28: conv2d has no argument \"kernal\"", "did you mean kernel=?", "m.cnn:2:7: conv2d needs kernel=..."}},
	{"missing argument", header + "  c = linear(flatten(image))\n}\n", []string{"m.cnn:2:7: linear needs out=... (output features)"}},
	{"tensor count", header + "  c = add(image)\n}\n", []string{"m.cnn:2:7: add takes 2 tensor arguments, got 1"}},
	{"shape mismatch", header + "  c = conv2d(image, out=4, kernel=3)\n  s = add(c, image)\n  f = linear(flatten(s), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:3:7: s: add needs two float tensors of one shape, but c is f32[B,4,30,30] and image is f32[B,3,32,32]"}},
	{"kernel larger than input", header + "  p = maxpool(image, kernel=2)\n  c = conv2d(p, out=4, kernel=20)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:3:7: c: conv2d kernel 20x20 (padding 0x0) is larger than its 16x16 input p"}},
	{"pool larger than input", header + "  p = maxpool(image, kernel=[2, 64])\n  f = linear(flatten(p), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: p: maxpool2d kernel 2x64 (padding 0x0) is larger than its 32x32 input image"}},
	{"class count", header + "  f = linear(flatten(image), out=12)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:3:10: loss: cross_entropy: f has 12 outputs but label has 10 classes"}},
	{"label type", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, f)\n}\n",
		[]string{"m.cnn:3:10: loss: cross_entropy's second argument must be class labels (class[N]), but f is f32[B,10]"}},
	{"linear without flatten", header + "  f = linear(image, out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: f: linear needs [B,features], but image is f32[B,3,32,32]: flatten it first"}},
	{"missing loss", header + "  f = linear(flatten(image), out=10)\n}\n", []string{"m.cnn:1:1: model M has no loss", "loss = cross_entropy(logits, label)"}},
	{"two losses", header + "  f = linear(flatten(image), out=10)\n  l1 = cross_entropy(f, label)\n  l2 = cross_entropy(f, label)\n}\n", []string{"m.cnn:4:8: model M has a second loss"}},
	{"cycle", header + "  a = relu(b)\n  b = relu(a)\n  f = linear(flatten(b), out=10)\n  loss = cross_entropy(f, label)\n}\n", []string{"m.cnn:2:3: a depends on itself: a -> b -> a"}},
	{"integer overflow", header + "  f = linear(flatten(image), out=99999999999999999999)\n}\n", []string{"m.cnn:2:34: integer 99999999999999999999 does not fit in 64 bits"}},
	{"absurd shape", "model M(image: f32[3,2000000,2000000], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:1:16: input image: f32[3,2000000,2000000] has more than 2^40 elements per sample; no GPU can hold it"}},
	{"absurd weight", "model M(image: f32[3,512,512], label: class[10]) {\n  f = linear(flatten(image), out=4000000)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: f: its weight [4000000,786432] would have more than 2^40 elements"}},
	{"parameters beyond any GPU", "model M(image: f32[3,128,128], label: class[10]) {\n  h = linear(flatten(image), out=2000000)\n  f = linear(h, out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:7: the parameters need 393.30 GB, more than any GPU holds (cnnc allows 274.88 GB)", "h.weight alone has 98,304,000,000 parameters (393.22 GB); shrink it"}},
	{"bad input type", "model M(image: f16[3,8,8], label: class[10]) {\n}\n", []string{"m.cnn:1:16: input image: unknown type \"f16\""}},
	{"unknown optimizer", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = sdg(lr=0.1)\n}\n",
		[]string{"m.cnn:6:15: unknown optimizer sdg", "did you mean sgd?"}},
	{"unknown setting", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  bach = 3\n}\n",
		[]string{"m.cnn:6:3: train block has no argument \"bach\"", "did you mean batch=?"}},
	{"bad budget", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  memory_budget = 64\n  batch = 0\n}\n",
		[]string{"m.cnn:7:11: train block: batch must be at least 1, got 0"}},
	{"budget type", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  memory_budget = \"lots\"\n}\n",
		[]string{"m.cnn:6:19: train block: memory_budget must be a memory size such as 64MiB or 40MB, got a string"}},
	{"nesterov without momentum", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = sgd(lr=0.1, nesterov=true)\n}\n",
		[]string{"m.cnn:6:15: sgd: nesterov=true needs a momentum above 0"}},
	{"resize mismatch", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = imagefolder(\"d\", resize=[64,64])\n}\n",
		[]string{"m.cnn:6:35: imagefolder resizes to 64x64 but the model's input is 32x32"}},
	{"dropout p", header + "  d = dropout(image, p=1)\n  f = linear(flatten(d), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:2:24: dropout: p must be in [0, 1), got 1"}},
	// issue #14/#16: refusals that used to come late, unpositioned or not at all
	{"missing paren at the end of its line", header + "  a = linear(flatten(image), out=10\n  loss = cross_entropy(a, label)\n}\n",
		[]string{"m.cnn:2:36: syntax error: expected \",\" or \")\" after the argument of linear( at the end of this line"}},
	{"no model block", "train {\n  batch = 4\n}\n", []string{"m.cnn:1:1: syntax error: expected the model block first, found a train block"}},
	{"third input", "model M(image: f32[1,28,28], label: class[10], extra: f32[1,28,28]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:1:48: model M takes two inputs, an image and its labels; extra is a third"}},
	{"labels first", "model M(label: class[10], image: f32[1,28,28]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n",
		[]string{"m.cnn:1:16: input 1 of model M must be the image, f32[C,H,W]; label is class[...]", "m.cnn:1:34: input 2 of model M must be the labels, class[N]; image is f32[...]"}},
	{"no labels", "model M(image: f32[1,28,28]) {\n}\n", []string{"m.cnn:1:9: model M has no labels: declare them after the image, e.g. label: class[10]"}},
	{"too many classes", "model M(image: f32[1,28,28], label: class[4000000000]) {\n}\n", []string{"m.cnn:1:43: input label: class[4000000000] has more classes than the 2,147,483,647 labels can name (int32 labels)"}},
	{"lr zero", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = sgd(lr=0)\n}\n",
		[]string{"m.cnn:6:22: sgd: lr must be positive, got 0"}},
	{"lr negative", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = adam(lr=-0.001)\n}\n",
		[]string{"m.cnn:6:23: adam: lr must be positive, got -0.001"}},
	{"lr below float32", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = sgd(lr=1e-50)\n}\n",
		[]string{"m.cnn:6:22: sgd: lr 1e-50 is below float32's smallest normal number (1.18e-38)"}},
	{"momentum beyond float32", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = sgd(lr=0.1, momentum=1e39)\n}\n",
		[]string{"m.cnn:6:36: sgd: momentum 1e39 is beyond float32's range (3.4e+38)"}},
	{"negative weight decay", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = adamw(weight_decay=-1)\n}\n",
		[]string{"m.cnn:6:34: adamw: weight_decay must be at least 0, got -1"}},
	{"batch 2^62 in the train block", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 4611686018427387904\n}\n",
		[]string{"m.cnn:6:11: train block: batch must be at most 1,048,576, got 4,611,686,018,427,387,904", "cnnc compiles training steps of at most 1,048,576 samples"}},
	{"epochs", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  epochs = 10000000\n}\n",
		[]string{"m.cnn:6:12: train block: epochs must be at most 1,000,000, got 10,000,000"}},
	{"batch beyond a tensor's limit", "model M(image: f32[3,64,64], label: class[10]) {\n  c = conv2d(image, out=65536, kernel=1)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 8192\n}\n",
		[]string{"m.cnn:2:7: at batch 8,192, c would be [8192,65536,64,64]: more than 2^40 elements (4.40 TB as f32), which no GPU holds", "the batch is set at m.cnn:7:11", "the largest batch this model allows is 4,096"}},
	{"batch beyond the FLOPs limit", "model M(image: f32[3,64,64], label: class[10]) {\n  c = conv2d(image, out=512, kernel=32, padding=16)\n  d = conv2d(c, out=512, kernel=32, padding=16)\n  f = linear(flatten(d), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 1048576\n}\n",
		[]string{"m.cnn:3:7: at batch 1,048,576, one training step needs", "FLOPs, more than cnnc counts (2^60 = 1.15e+18); d needs the most", "the batch is set at m.cnn:8:11"}},
	{"batch beyond a conv grid", "model M(image: f32[1,2048,2048], label: class[10]) {\n  c = conv2d(image, out=1, kernel=1)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  batch = 1024\n}\n",
		[]string{"m.cnn:2:7: at batch 1,024, c's kernels could launch up to 4,294,967,296 blocks in one grid dimension, more than CUDA allows (2,147,483,647)", "the largest batch this model allows is 511"}},
	{"conv kernel beyond the kernels", header + "  c = conv2d(image, out=4, kernel=[3, 33])\n}\n",
		[]string{"m.cnn:2:39: conv2d: kernel must be at most 32, got 33", "cnnc's convolution kernels take windows up to 32x32"}},
	{"conv channels beyond a grid", header + "  c = conv2d(image, out=5000000, kernel=1)\n}\n",
		[]string{"m.cnn:2:25: conv2d: out must be at most 4,194,240, got 5,000,000"}},
	{"stride beyond any image", header + "  p = maxpool(image, kernel=2, stride=9999999999)\n}\n",
		[]string{"m.cnn:2:39: maxpool: stride must be at most 1,048,576, got 9,999,999,999"}},
	{"mnist classes", "model M(image: f32[1,28,28], label: class[5]) {\n  f = linear(flatten(image), out=5)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = mnist(\"d\")\n}\n",
		[]string{"m.cnn:6:11: mnist has 10 classes (the digits 0 to 9) but the model's labels are class[5]"}},
	{"mnist channels", "model M(image: f32[4,28,28], label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = mnist(\"d\")\n}\n",
		[]string{"m.cnn:6:11: mnist images are 1x28x28 but the model's input is 4x28x28"}},
	{"escapes in a comment", header + "  a = relu(imag) # \x1b[2J\x1b[31m\u202e\n}\n", []string{"m.cnn:2:12: unknown name imag\n      a = relu(imag) # \\x1b[2J\\x1b[31m\\u202e\n"}},
	{"precision", header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  precision = fp16\n}\n",
		[]string{"m.cnn:6:15: train block: precision must be fp32, tf32 or bf16, got the name fp16"}},
}

func TestPrecisionSetting(t *testing.T) {
	for _, p := range []string{"fp32", "tf32", "bf16"} {
		src := header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  precision = " + p + "\n}\n"
		res, err := CompileSource("m.cnn", []byte(src), Options{})
		require.NoError(t, err)
		assert.Equal(t, p, res.Train.Precision)
	}
	res, err := CompileSource("m.cnn", []byte(header+"  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{})
	require.NoError(t, err)
	assert.Empty(t, res.Train.Precision, "left out: fp32")
}

func TestErrors(t *testing.T) {
	for _, c := range errorCases {
		t.Run(c.name, func(t *testing.T) {
			_, err := CompileSource("m.cnn", []byte(c.src), Options{})
			require.Error(t, err)
			var ds dsl.Diagnostics
			require.ErrorAs(t, err, &ds, "every rejection must be positioned diagnostics, got %T: %v", err, err)
			out := ds.RenderAll(map[string][]byte{"m.cnn": []byte(c.src)})
			for _, w := range c.want {
				assert.Contains(t, out, w)
			}
			for _, d := range ds {
				assert.True(t, d.Pos.IsValid(), "diagnostic without a position: %v", d)
				assert.GreaterOrEqual(t, d.Pos.Col, 1, "columns are 1-based: %v", d)
				assert.NotContains(t, d.Message, "=must", "grammar: %v", d)
			}
			assert.NotContains(t, out, "\x1b", "control characters from the file are shown escaped")
		})
	}
}

func TestUnusedLayerIsAWarningAndRemoved(t *testing.T) {
	src := header + "  c = conv2d(image, out=4, kernel=3)\n  spare = relu(c)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{AfterPass: verifyAfter(t)})
	require.NoError(t, err)
	require.Len(t, res.Warnings, 1)
	assert.Equal(t, dsl.SeverityWarning, res.Warnings[0].Severity)
	assert.Contains(t, res.Warnings[0].Error(), "m.cnn:3:11: warning: spare is not used by the loss")
	for _, n := range res.Graph.Nodes {
		assert.NotEqual(t, "spare", n.Name)
	}
}

func TestUnusedParametricLayerLosesItsParameters(t *testing.T) {
	src := header + "  c = conv2d(image, out=4, kernel=3)\n  side = conv2d(c, out=4, kernel=3)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{AfterPass: verifyAfter(t)})
	require.NoError(t, err)
	assert.Nil(t, res.Graph.ParamByName("side.weight"))
	assert.NotNil(t, res.Graph.ParamByName("c.weight"))
}

func TestPassOptions(t *testing.T) {
	_, err := CompileSource("m.cnn", []byte(header+"}\n"), Options{Disable: []string{"autodiff"}})
	assert.EqualError(t, err, `pass "autodiff" is required and cannot be disabled`)
	_, err = CompileSource("m.cnn", []byte(header+"}\n"), Options{StopAfter: "nope"})
	assert.ErrorContains(t, err, `unknown pass "nope"`)
}

func TestOptimizers(t *testing.T) {
	for _, c := range []struct {
		opt  string
		want ir.Optimizer
	}{
		{"sgd(lr=0.1)", ir.Optimizer{Kind: ir.SGD, LR: 0.1}},
		{"sgd(lr=0.1, momentum=0.9, nesterov=true, weight_decay=5e-4)", ir.Optimizer{Kind: ir.SGD, LR: 0.1, Momentum: 0.9, Nesterov: true, WeightDecay: 5e-4}},
		{"adam()", ir.Optimizer{Kind: ir.Adam, LR: 0.001, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}},
		{"adamw(lr=3e-4, betas=[0.8, 0.99], eps=1e-6)", ir.Optimizer{Kind: ir.AdamW, LR: 3e-4, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.01}},
	} {
		src := header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ntrain {\n  optimizer = " + c.opt + "\n}\n"
		res, err := CompileSource("m.cnn", []byte(src), Options{AfterPass: verifyAfter(t)})
		require.NoError(t, err, c.opt)
		assert.Equal(t, c.want, res.Train.Optimizer, c.opt)
		assert.Len(t, res.Graph.State, len(c.want.StateNames())*2, c.opt)
	}
}

func TestEveryExampleCompilesAndVerifies(t *testing.T) {
	for _, f := range []string{"../examples/simplecnn.cnn", "../examples/mnist.cnn", "testdata/residual.cnn"} {
		res := compileFile(t, f, Options{})
		assert.NotEmpty(t, res.Graph.Nodes, f)
	}
}

// A batch from the command line is checked like the train block's, and the
// error names where it came from.
func TestBatchFromOptionsIsChecked(t *testing.T) {
	src := "model M(image: f32[1,2048,2048], label: class[10]) {\n  c = conv2d(image, out=1, kernel=1)\n  f = linear(flatten(c), out=10)\n  loss = cross_entropy(f, label)\n}\n"
	_, err := CompileSource("m.cnn", []byte(src), Options{Batch: 1024, BatchSource: "--batch"})
	var ds dsl.Diagnostics
	require.ErrorAs(t, err, &ds)
	out := ds.RenderAll(nil)
	assert.Contains(t, out, "m.cnn:2:7: at batch 1,024, c's kernels could launch up to 4,294,967,296 blocks")
	assert.Contains(t, out, "the batch comes from --batch")
	res, err := CompileSource("m.cnn", []byte(src), Options{Batch: 511})
	require.NoError(t, err)
	assert.Equal(t, int64(511), res.BatchLimit)

	_, err = CompileSource("m.cnn", []byte(header+"  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{Batch: 1 << 62, BatchSource: "--batch"})
	require.ErrorAs(t, err, &ds)
	assert.Contains(t, ds.Error(), "m.cnn:1:1: batch 4,611,686,018,427,387,904 is more than cnnc compiles for (1,048,576)")

	// FLOPs and sizes never wrap: the summary of a model at its limit is positive
	res, err = CompileSource("m.cnn", []byte("model M(image: f32[3,64,64], label: class[10]) {\n  c = conv2d(image, out=512, kernel=32, padding=16)\n  d = conv2d(c, out=512, kernel=32, padding=16)\n  f = linear(flatten(d), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{})
	require.NoError(t, err)
	_, err = CompileSource("m.cnn", []byte("model M(image: f32[3,64,64], label: class[10]) {\n  c = conv2d(image, out=512, kernel=32, padding=16)\n  d = conv2d(c, out=512, kernel=32, padding=16)\n  f = linear(flatten(d), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{Batch: res.BatchLimit})
	require.NoError(t, err)
	assert.Greater(t, res.Summary.TrainFLOPs, int64(0))
	_, err = CompileSource("m.cnn", []byte("model M(image: f32[3,64,64], label: class[10]) {\n  c = conv2d(image, out=512, kernel=32, padding=16)\n  d = conv2d(c, out=512, kernel=32, padding=16)\n  f = linear(flatten(d), out=10)\n  loss = cross_entropy(f, label)\n}\n"), Options{Batch: res.BatchLimit + 1})
	assert.ErrorContains(t, err, "FLOPs, more than cnnc counts")
}

// What a generated trainer cannot read is refused at the input's line.
func TestCheckTrainable(t *testing.T) {
	for _, c := range []struct{ image, want string }{
		{"f32[1,28,28]", ""},
		{"f32[3,224,224]", ""},
		{"f32[2,8,8]", "m.cnn:1:20: input image has 2 channels; the trainers read images with 1 (grayscale) or 3 (RGB)"},
		{"f32[4,8,8]", "m.cnn:1:20: input image has 4 channels"},
		{"f32[1,20000,8]", "m.cnn:1:22: input image: a height of 20,000 pixels; the trainers read images of at most 16,384 a side"},
		{"f32[3,8,16385]", "m.cnn:1:24: input image: a width of 16,385 pixels"},
	} {
		src := "model M(image: " + c.image + ", label: class[10]) {\n  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\n"
		res, err := CompileSource("m.cnn", []byte(src), Options{Batch: 1})
		require.NoError(t, err, c.image)
		ds := CheckTrainable(res)
		if c.want == "" {
			assert.Empty(t, ds, c.image)
			continue
		}
		require.Len(t, ds, 1, c.image)
		assert.Contains(t, ds.Error(), c.want)
	}
}

// A max-pool whose window is more than a conv tile holds stays a pool of
// its own (codegen cannot pool it inside the conv block); smaller ones fuse.
func TestLargePoolWindowsAreNotFused(t *testing.T) {
	for _, c := range []struct {
		kernel string
		fused  bool
	}{{"2", true}, {"8", true}, {"[8, 9]", false}, {"9", false}} {
		src := "model M(image: f32[1,28,28], label: class[10]) {\n  c = conv2d(image, out=4, kernel=3)\n  p = maxpool(c, kernel=" + c.kernel + ")\n  f = linear(flatten(p), out=10)\n  loss = cross_entropy(f, label)\n}\n"
		res, err := CompileSource("m.cnn", []byte(src), Options{AfterPass: verifyAfter(t)})
		require.NoError(t, err, c.kernel)
		pools := 0
		for _, n := range res.Graph.Nodes {
			if n.Op == ir.OpMaxPool2D {
				pools++
			}
			if n.Op == ir.OpConvBlock {
				assert.Equal(t, c.fused, n.Attrs.Pool != nil, c.kernel)
			}
		}
		assert.Equal(t, !c.fused, pools == 1, c.kernel)
	}
}

// conv2d -> tanh -> avgpool2d fuses into one conv2d_tanh_avgpool block
// while the weight row has at most ops.MaxConvTanhPoolTaps taps (32·32 =
// 1024), saving its tanh output only when its input needs a gradient; a
// longer row, a tanh or conv output with another reader, or an augmented
// image keeps the unfused nodes (a conv2d_block, tanh, avgpool2d).
func TestConvTanhAvgPoolFusion(t *testing.T) {
	for _, c := range []struct {
		name, body, data string
		fused, saved     []string // the conv2d_tanh_avgpool layers, and those that save t
	}{
		{"lenet5-like", "  c1 = conv2d(image, out=4, kernel=3)\n  a = avgpool(tanh(c1), kernel=2)\n  c2 = conv2d(a, out=5, kernel=3)\n  b = avgpool(tanh(c2), kernel=2)\n  f = linear(flatten(b), out=10)\n",
			"", []string{"c1", "c2"}, []string{"c2"}},
		{"1024 taps", "  a = relu(conv2d(image, out=32, kernel=3, padding=1))\n  c2 = conv2d(a, out=2, kernel=[4, 8])\n  b = avgpool(tanh(c2), kernel=2)\n  f = linear(flatten(b), out=10)\n",
			"", []string{"c2"}, []string{"c2"}},
		{"1056 taps", "  a = relu(conv2d(image, out=33, kernel=3, padding=1))\n  c2 = conv2d(a, out=2, kernel=[4, 8])\n  b = avgpool(tanh(c2), kernel=2)\n  f = linear(flatten(b), out=10)\n",
			"", nil, nil},
		{"tanh read twice", "  c = conv2d(image, out=4, kernel=3)\n  h = tanh(c)\n  a = avgpool(h, kernel=2)\n  f = linear(flatten(add(a, maxpool(h, kernel=2))), out=10)\n",
			"", nil, nil},
		{"augmented image", "  c1 = conv2d(image, out=4, kernel=3)\n  a = avgpool(tanh(c1), kernel=2)\n  f = linear(flatten(a), out=10)\n",
			"data {\n  train = mnist(\"d\")\n  augment = [random_crop(size=[12, 12], padding=1)]\n}\n", nil, nil},
	} {
		src := "model M(image: f32[1,12,12], label: class[10]) {\n" + c.body + "  loss = cross_entropy(f, label)\n}\n" + c.data
		res, err := CompileSource("m.cnn", []byte(src), Options{AfterPass: verifyAfter(t)})
		require.NoError(t, err, c.name)
		var fused, saved []string
		for _, n := range res.Graph.Nodes {
			if n.Op == ops.ConvTanhPoolOp {
				fused = append(fused, n.Name)
				if n.Attrs.SaveAct {
					saved = append(saved, n.Name)
				}
			}
		}
		assert.Equal(t, c.fused, fused, c.name)
		assert.Equal(t, c.saved, saved, c.name)
	}
}
