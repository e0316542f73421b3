package reference

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/torchtest"
)

func compile(t *testing.T, src string) *ir.Graph {
	t.Helper()
	return compileWith(t, src, "fuse")
}

// compileWith compiles src with the given optional passes disabled,
// verifying the IR after every pass.
func compileWith(t *testing.T, src string, disable ...string) *ir.Graph {
	t.Helper()
	res, err := compiler.CompileSource("t.cnn", []byte(src), compiler.Options{
		Disable:   disable,
		AfterPass: func(pass string, g *ir.Graph) error { return g.Verify() },
	})
	require.NoError(t, err)
	return res.Graph
}

func randomBatch(g *ir.Graph, n int, rng *rand.Rand) Batch {
	img := g.Inputs[0].Type
	b := Batch{N: n, Images: make([]float64, n*int(img.SampleElems())), Labels: make([]int32, n)}
	for i := range b.Images {
		b.Images[i] = rng.Float64()
	}
	classes := g.Logits.Type.Dims[0]
	for i := range b.Labels {
		b.Labels[i] = int32(rng.Int64N(classes))
	}
	return b
}

// checkGradients compares every parameter's analytic gradient with central
// finite differences of the loss (all elements of small parameters, a
// random sample of large ones).
func checkGradients(t *testing.T, g *ir.Graph, batch int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	e := New(g, seed)
	b := randomBatch(g, batch, rng)
	res, err := e.Run(b, Gradients)
	require.NoError(t, err)
	loss := func() float64 {
		r, err := e.Run(b, Gradients)
		require.NoError(t, err)
		return r.Loss
	}
	const h = 1e-6
	worst := 0.0
	for _, p := range g.Params {
		grad := res.Grad(g, p)
		require.NotNil(t, grad, "no gradient for %s", p.Name)
		vals := e.Params[p]
		idx := rng.Perm(len(vals))
		if len(idx) > 24 {
			idx = idx[:24]
		}
		for _, i := range idx {
			orig := vals[i]
			vals[i] = orig + h
			lp := loss()
			vals[i] = orig - h
			lm := loss()
			vals[i] = orig
			fd := (lp - lm) / (2 * h)
			diff := math.Abs(fd - grad[i])
			tol := 1e-7 + 1e-5*math.Abs(fd)
			worst = math.Max(worst, diff/(1e-7+math.Abs(fd)))
			assert.LessOrEqual(t, diff, tol, "%s[%d]: analytic %g, finite difference %g", p.Name, i, grad[i], fd)
		}
	}
	t.Logf("worst relative gradient error %.2e", worst)
}

const img = "model T(image: f32[2,9,7], label: class[4]) {\n"
const tail = "  loss = cross_entropy(logits, label)\n}\n"

// One finite-difference test per op (and per variant of its attributes).
// Every case ends in linear + cross_entropy, so their rules are covered too.
func TestFiniteDifferenceGradientsPerOp(t *testing.T) {
	cases := map[string]string{
		"conv2d":             "  c = conv2d(image, out=3, kernel=3)\n  logits = linear(flatten(c), out=4)\n",
		"conv2d stride pad":  "  c = conv2d(image, out=3, kernel=3, stride=2, padding=1)\n  logits = linear(flatten(c), out=4)\n",
		"conv2d rect nobias": "  c = conv2d(image, out=3, kernel=[3,2], stride=[1,2], padding=[0,1], bias=false)\n  logits = linear(flatten(c), out=4)\n",
		"conv2d grad input":  "  c1 = conv2d(image, out=3, kernel=3, padding=1)\n  c2 = conv2d(c1, out=2, kernel=2, stride=2)\n  logits = linear(flatten(c2), out=4)\n",
		"relu":               "  c = conv2d(image, out=3, kernel=3)\n  r = relu(c)\n  logits = linear(flatten(r), out=4)\n",
		"maxpool2d":          "  c = conv2d(image, out=3, kernel=2)\n  p = maxpool(c, kernel=2)\n  logits = linear(flatten(p), out=4)\n",
		"maxpool2d overlap":  "  c = conv2d(image, out=3, kernel=2, padding=1)\n  p = maxpool2d(c, kernel=3, stride=2, padding=1)\n  logits = linear(flatten(p), out=4)\n",
		"avgpool2d":          "  c = conv2d(image, out=3, kernel=2)\n  p = avgpool(c, kernel=2)\n  logits = linear(flatten(p), out=4)\n",
		"avgpool2d pad":      "  c = conv2d(image, out=3, kernel=2)\n  p = avgpool2d(c, kernel=3, stride=[2,1], padding=1)\n  logits = linear(flatten(p), out=4)\n",
		"flatten":            "  f = flatten(image)\n  logits = linear(f, out=4)\n",
		"linear":             "  h = linear(flatten(image), out=5)\n  logits = linear(h, out=4, bias=false)\n",
		"dropout":            "  h = linear(flatten(image), out=6)\n  d = dropout(h, p=0.4)\n  logits = linear(d, out=4)\n",
		"add":                "  c = conv2d(image, out=2, kernel=3, padding=1)\n  s = add(c, relu(conv2d(c, out=2, kernel=1)))\n  logits = linear(flatten(s), out=4)\n",
		"cross_entropy":      "  logits = linear(flatten(image), out=4)\n",
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			g := compile(t, img+body+tail)
			checkGradients(t, g, 3, 11)
		})
	}
}

// label_smoothing: gradients by finite differences, and the loss against
// its definition, -Σ_c q_c·log softmax_c with q = (1-ε)·onehot + ε/C,
// computed here directly (log softmax as x - logsumexp, in float64: the
// two sums differ by rounding only, ~1e-16 relative).
func TestCrossEntropyLabelSmoothing(t *testing.T) {
	for _, eps := range []string{"0.1", "0.5", "0.95"} {
		t.Run(eps, func(t *testing.T) {
			src := img + "  logits = linear(flatten(image), out=4)\n  loss = cross_entropy(logits, label, label_smoothing=" + eps + ")\n}\n"
			g := compile(t, src)
			require.Contains(t, g.Text(), "label_smoothing="+eps)
			checkGradients(t, g, 3, 11)
		})
	}
	const classes, batch = 5, 3
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float64, batch*classes)
	for i := range logits {
		logits[i] = 3 * rng.NormFloat64()
	}
	labels := []float64{4, 0, 2}
	for _, eps := range []float64{0, 0.1, 0.7} {
		n := &ir.Node{Op: ir.OpCrossEntropy, Attrs: ir.Attrs{Smoothing: eps},
			Ins:  []*ir.Value{{Type: ir.F32Batched(classes)}, {Type: ir.Type{DType: ir.Class, Batched: true, Classes: classes}}},
			Outs: []*ir.Value{{Type: ir.F32Fixed()}}}
		got, err := RunNode(n, [][]float64{logits, labels}, batch, NodeOptions{})
		require.NoError(t, err)
		want := 0.0
		for b := 0; b < batch; b++ {
			row := logits[b*classes : (b+1)*classes]
			lse := logSumExp(row)
			for c, x := range row {
				q := eps / classes
				if c == int(labels[b]) {
					q += 1 - eps
				}
				want -= q * (x - lse)
			}
		}
		assert.InDelta(t, want/batch, got[0][0], 1e-14*math.Abs(want), "ε = %g", eps)
	}
}

// The reference's label-smoothed loss and logits gradient are PyTorch's:
// torch.nn.functional.cross_entropy(label_smoothing=ε) in float64
// (scripts/torch_cross_entropy.py) on odd shapes, logits of scale 4. Both
// are float64 sums of at most 11 terms of size ≤ ~30: they agree to
// ~1e-14, so 1e-12 (relative to the largest value) leaves room and still
// catches any wrong weight (the smallest one, ε/C = 0.01/11, moves the
// loss by ~1e-3).
func TestCrossEntropyLabelSmoothingIsPyTorchs(t *testing.T) {
	const classes, batch = 11, 7
	rng := rand.New(rand.NewPCG(9, 10))
	logits := make([]float64, batch*classes)
	for i := range logits {
		logits[i] = 4 * rng.NormFloat64()
	}
	labels := make([]float64, batch)
	ints := make([]int, batch)
	for i := range labels {
		ints[i] = rng.IntN(classes)
		labels[i] = float64(ints[i])
	}
	eps := []float64{0, 0.01, 0.1, 0.5, 0.9}
	var got struct {
		Torch   string
		Results []struct {
			Eps  float64
			Loss float64
			Grad []float64
		}
	}
	torchtest.Run(t, "../../scripts/torch_cross_entropy.py", map[string]any{"classes": classes, "logits": logits, "labels": ints, "label_smoothing": eps}, &got)
	require.Len(t, got.Results, len(eps))
	for i, r := range got.Results {
		attrs := ir.Attrs{Smoothing: eps[i]}
		ins := []*ir.Value{{Type: ir.F32Batched(classes)}, {Type: ir.Type{DType: ir.Class, Batched: true, Classes: classes}}}
		loss, err := RunNode(&ir.Node{Op: ir.OpCrossEntropy, Attrs: attrs, Ins: ins, Outs: []*ir.Value{{Type: ir.F32Fixed()}}}, [][]float64{logits, labels}, batch, NodeOptions{})
		require.NoError(t, err)
		grad, err := RunNode(&ir.Node{Op: ir.OpCrossEntropyGrad, Attrs: attrs, Ins: ins, Outs: []*ir.Value{{Type: ir.F32Batched(classes)}}}, [][]float64{logits, labels}, batch, NodeOptions{})
		require.NoError(t, err)
		assert.InDelta(t, r.Loss, loss[0][0], 1e-12*math.Abs(r.Loss), "ε = %g: loss", eps[i])
		scale := 0.0
		for _, g := range r.Grad {
			scale = math.Max(scale, math.Abs(g))
		}
		for j, g := range r.Grad {
			assert.InDelta(t, g, grad[0][j], 1e-12*scale, "ε = %g: dlogits[%d]", eps[i], j)
		}
	}
	t.Logf("the reference's label-smoothed cross-entropy equals torch %s's for ε in %v", got.Torch, eps)
}

func TestFiniteDifferenceWholeModels(t *testing.T) {
	// a small SimpleCNN (same structure, 3x14x14 inputs) and the residual DAG
	small := `model Small(image: f32[3,14,14], label: class[10]) {
    conv1 = conv2d(image, out=4, kernel=3)
    relu1 = relu(conv1)
    pool1 = maxpool(relu1, kernel=2)
    conv2 = conv2d(pool1, out=5, kernel=3)
    relu2 = relu(conv2)
    pool2 = maxpool(relu2, kernel=2)
    fc1   = linear(flatten(pool2), out=12)
    fc2   = linear(fc1, out=10)
    loss  = cross_entropy(fc2, label)
}
`
	checkGradients(t, compile(t, small), 4, 3)
	residual := `model R(image: f32[3,11,9], label: class[5]) {
    stem = conv2d(image, out=4, kernel=3, padding=1)
    act  = relu(stem)
    body = conv2d(act, out=4, kernel=3, padding=1, bias=false)
    sum  = add(act, relu(body))
    down = conv2d(sum, out=6, kernel=[3,2], stride=2, padding=[1,0])
    pool = avgpool(down, kernel=2, stride=[2,1])
    drop = dropout(flatten(pool), p=0.25)
    out  = linear(drop, out=5)
    loss = cross_entropy(out, label)
}
`
	checkGradients(t, compile(t, residual), 3, 5)
}

func TestInitMatchesPyTorchDefaults(t *testing.T) {
	g := compile(t, "model T(image: f32[16,10,10], label: class[10]) {\n  c = conv2d(image, out=64, kernel=3)\n  logits = linear(flatten(c), out=10)\n"+tail)
	p := g.ParamByName("c.weight")
	require.Equal(t, int64(144), p.Init.FanIn)
	bound := 1 / math.Sqrt(144) // kaiming_uniform(a=sqrt(5)) == U(±1/sqrt(fan_in))
	assert.InDelta(t, bound, InitBound(p.Init), 1e-15)
	w := InitParam(p, 42)
	mean, sq := 0.0, 0.0
	for _, v := range w {
		require.LessOrEqual(t, math.Abs(v), bound)
		assert.Equal(t, v, float64(float32(v)), "initial values are exact float32s")
		mean += v
		sq += v * v
	}
	n := float64(len(w))
	assert.InDelta(t, 0, mean/n, 0.05*bound)
	assert.InDelta(t, bound*bound/3, sq/n, 0.05*bound*bound/3) // variance of U(-b,b)
	assert.Equal(t, w, InitParam(p, 42), "deterministic from the seed")
	assert.NotEqual(t, w, InitParam(p, 43))
	assert.NotEqual(t, w[:10], InitParam(g.ParamByName("logits.weight"), 42)[:10], "each parameter has its own stream")
	bias := g.ParamByName("c.bias")
	assert.InDelta(t, 1/math.Sqrt(144), InitBound(bias.Init), 1e-15)
}

func optimizerModel(opt string) string {
	return "model T(image: f32[1,3,3], label: class[3]) {\n  logits = linear(flatten(image), out=3)\n" + tail + "train {\n  optimizer = " + opt + "\n}\n"
}

// Two steps of SGD with momentum, nesterov and weight decay, against
// torch.optim.SGD's update written out by hand.
func TestSGDMatchesTorchFormula(t *testing.T) {
	for _, nesterov := range []bool{false, true} {
		g := compile(t, optimizerModel(fmt.Sprintf("sgd(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=%t)", nesterov)))
		rng := rand.New(rand.NewPCG(1, 2))
		e := New(g, 3)
		b := randomBatch(g, 4, rng)
		p := g.ParamByName("logits.weight")
		var buf []float64
		for step := 0; step < 2; step++ {
			before := append([]float64(nil), e.Params[p]...)
			gr, err := e.Run(b, Gradients)
			require.NoError(t, err)
			grad := gr.Grad(g, p)
			want := make([]float64, len(before))
			if buf == nil {
				buf = make([]float64, len(before))
			}
			for i := range before {
				d := grad[i] + 0.01*before[i]
				if step == 0 {
					buf[i] = d
				} else {
					buf[i] = 0.9*buf[i] + d
				}
				if nesterov {
					d += 0.9 * buf[i]
				} else {
					d = buf[i]
				}
				want[i] = before[i] - 0.1*d
			}
			_, err = e.Run(b, Train)
			require.NoError(t, err)
			assert.InDeltaSlice(t, want, e.Params[p], 1e-15)
		}
	}
}

// Adam's first step moves every weight by lr·g/(|g|+eps) (bias correction
// makes m̂ = g and v̂ = g²); AdamW first shrinks it by 1-lr·wd.
func TestAdamFirstStep(t *testing.T) {
	for _, kind := range []string{"adam", "adamw"} {
		g := compile(t, optimizerModel(kind+"(lr=0.01, weight_decay=0.1)"))
		e := New(g, 4)
		b := randomBatch(g, 5, rand.New(rand.NewPCG(3, 4)))
		p := g.ParamByName("logits.weight")
		before := append([]float64(nil), e.Params[p]...)
		gr, err := e.Run(b, Gradients)
		require.NoError(t, err)
		grad := gr.Grad(g, p)
		_, err = e.Run(b, Train)
		require.NoError(t, err)
		for i := range before {
			var want float64
			if kind == "adam" {
				gi := grad[i] + 0.1*before[i]
				want = before[i] - 0.01*gi/(math.Abs(gi)+1e-8)
			} else {
				want = before[i]*(1-0.01*0.1) - 0.01*grad[i]/(math.Abs(grad[i])+1e-8)
			}
			assert.InDelta(t, want, e.Params[p][i], 1e-12, "%s %d", kind, i)
		}
		assert.Equal(t, int64(1), e.Step)
	}
}

func TestEvalModeTurnsDropoutOff(t *testing.T) {
	g := compile(t, img+"  d = dropout(flatten(image), p=0.5)\n  logits = linear(d, out=4)\n"+tail)
	e := New(g, 1)
	b := randomBatch(g, 2, rand.New(rand.NewPCG(1, 1)))
	r, err := e.Run(b, Eval)
	require.NoError(t, err)
	assert.Equal(t, b.Images, r.Values[g.Nodes[1].Out()], "eval dropout is the identity")
	r2, err := e.Run(b, Gradients)
	require.NoError(t, err)
	assert.NotEqual(t, b.Images, r2.Values[g.Nodes[1].Out()])
}

func TestBadBatchesAreErrors(t *testing.T) {
	g := compile(t, img+"  logits = linear(flatten(image), out=4)\n"+tail)
	e := New(g, 1)
	_, err := e.Run(Batch{N: 0}, Eval)
	assert.Error(t, err)
	_, err = e.Run(Batch{N: 1, Images: make([]float64, 3), Labels: []int32{0}}, Eval)
	assert.ErrorContains(t, err, "needs 126 values")
	_, err = e.Run(Batch{N: 1, Images: make([]float64, 126), Labels: []int32{4}}, Eval)
	assert.ErrorContains(t, err, "label 4 of sample 0 is outside [0,4)")
}

// logSumExp is log Σ exp(row), computed stably (the tests' own, apart from
// the kernels').
func logSumExp(row []float64) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, v)
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(v - m)
	}
	return m + math.Log(s)
}
