package reference

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
)

// compileInfer compiles src for inference (compiler.Options.Infer), the
// verifier after every pass.
func compileInfer(t *testing.T, src string, disable ...string) *ir.Graph {
	t.Helper()
	res, err := compiler.CompileSource("t.cnn", []byte(src), compiler.Options{
		Infer: true, Disable: disable,
		AfterPass: func(pass string, g *ir.Graph) error { return g.Verify() },
	})
	require.NoError(t, err)
	require.True(t, res.Graph.Infer)
	return res.Graph
}

// fold64 is the bnfold arithmetic (ir.Fold) in float64, unrounded: with it
// a folded forward differs from the unfolded one by float64 rounding only.
func fold64(f *ir.Fold, get func(string) []float64) []float64 {
	mean, variance := get(f.Mean), get(f.Var)
	scale := func(o int) float64 {
		s := 1 / math.Sqrt(variance[o]+f.Eps)
		if f.Gamma != "" {
			s *= get(f.Gamma)[o]
		}
		return s
	}
	if !f.Bias {
		w := append([]float64(nil), get(f.Weight)...)
		per := len(w) / len(mean)
		for i := range w {
			w[i] *= scale(i / per)
		}
		return w
	}
	b := make([]float64, len(mean))
	for o := range b {
		if f.ConvBias != "" {
			b[o] = get(f.ConvBias)[o]
		}
		b[o] = (b[o] - mean[o]) * scale(o)
		if f.Beta != "" {
			b[o] += get(f.Beta)[o]
		}
	}
	return b
}

// The inference graph — batch norms folded into their convs, fused into
// blocks without argmax — computes the training graph's evaluation
// (running statistics, dropout off): logits equal to float64 rounding
// (1e-10 of the largest logit: the folded conv sums w·s·x where the
// unfolded one scales Σw·x afterwards, a reordering whose error is a few
// hundred float64 ulps of the terms), with the running statistics, batch
// norm weights and biases far from their initial values. Likewise with
// bnfold disabled (batch norm in evaluation in the inference graph) and for
// a depthwise (grouped) conv, which folds per output channel too.
func TestInferenceGraphEqualsEvaluation(t *testing.T) {
	bn, err := os.ReadFile("../testdata/bnfold.cnn")
	require.NoError(t, err)
	models := map[string]string{
		"bnfold.cnn": string(bn),
		"depthwise": `model D(image: f32[3,9,10], label: class[3]) {
    c1 = conv2d(image, out=6, kernel=3, padding=1)
    b1 = batchnorm2d(c1)
    dw = conv2d(relu(b1), out=6, kernel=3, groups=6, bias=false)
    b2 = batchnorm2d(dw, affine=false)
    p  = maxpool(relu(b2), kernel=2)
    o  = linear(flatten(p), out=3)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1) }
`,
	}
	for name, src := range models {
		t.Run(name, func(t *testing.T) {
			train := compileWith(t, src)
			et := New(train, 3)
			rng := rand.New(rand.NewPCG(8, 9))
			for step := 0; step < 2; step++ {
				_, err := et.Run(pixelBatch(train, 4, rng), Train)
				require.NoError(t, err)
			}
			for p, v := range et.Params {
				switch {
				case hasSuffix(p.Name, ".running_mean"), hasSuffix(p.Name, ".bias") && isBN(train, p):
					for i := range v {
						v[i] = rng.Float64() - 0.5
					}
				case hasSuffix(p.Name, ".running_var"), hasSuffix(p.Name, ".weight") && isBN(train, p):
					for i := range v {
						v[i] = 0.2 + 2*rng.Float64()
					}
				}
			}
			b := pixelBatch(train, 5, rng)
			want, err := et.Run(b, Eval)
			require.NoError(t, err)
			logits := want.Values[train.Logits]
			scale := 0.0
			for _, v := range logits {
				scale = math.Max(scale, math.Abs(v))
			}
			for _, disable := range [][]string{nil, {"bnfold"}} {
				g := compileInfer(t, src, disable...)
				folds := 0
				for _, p := range g.Params {
					if p.Fold != nil {
						folds++
					}
				}
				if disable == nil {
					assert.Equal(t, 4, folds, "two batch norms folded, weight and bias each")
				} else {
					assert.Zero(t, folds)
				}
				ei := New(g, 3)
				require.NoError(t, ei.LoadFrom(et.ParamByName, fold64))
				got, err := ei.Run(Batch{N: b.N, Pixels: b.Pixels}, Eval)
				require.NoError(t, err)
				gl := got.Values[g.Logits]
				require.Len(t, gl, len(logits))
				for i := range logits {
					assert.InDelta(t, logits[i], gl[i], 1e-10*scale, "logit %d (disabled: %v)", i, disable)
				}
			}
		})
	}
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }

// isBN: p belongs to a batch norm layer of g.
func isBN(g *ir.Graph, p *ir.Param) bool {
	for _, n := range g.Nodes {
		if n.Name == p.Layer && n.Op.String() == "batchnorm2d" {
			return true
		}
	}
	return false
}
