package onnx_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
)

// Rounding-error analysis of a float32 evaluation of the exported graph.
//
// The graph's input is float32 (ToTensor's values), so the float64
// reference computes the exact result of the same arithmetic on the same
// numbers; every difference is float32 rounding inside the runtime.
// Standard forward error analysis (Higham, Accuracy and Stability of
// Numerical Algorithms, ch. 3), first order in the unit roundoff u = 2^-24:
//
//   - a dot product of k terms plus a bias, y = Σ w·x + b, computed in any
//     order (and with FMA or not): |ŷ - y| <= γ(k+1)·(Σ|w||x| + |b|)
//     + Σ|w|·δx, where δx is the error the input already carries;
//   - relu, max-pooling, flatten and identity are 1-Lipschitz in each
//     element and round nothing: δy = δx (the window's largest for a max);
//   - an average of k² elements: γ(k²+1)·Σ|x|/k² + Σδx/k²;
//   - a + b: δa + δb + u·|a+b|.
//
// γ(k) is the growth of one reduction's rounding error with its length k:
// ku/(1-ku) in the worst case over all orders and roundings (Higham, Lemma
// 3.1); λ·sqrt(k)·u (to first order) in Higham and Mary's probabilistic
// analysis ("A new approach to probabilistic rounding error analysis",
// SIAM J. Sci. Comput. 41(5), 2019: rounding errors modelled as
// independent and mean zero), which holds with probability at least
// 1 - 2k·exp(-λ²(1-u)²/2) per reduction — for λ = 8 and SimpleCNN's fc1
// (k = 28800), 1 - 7e-10. Both hold whatever order of summation a runtime
// chooses (blocked GEMM, vectorised, multi-threaded, with FMA or not).
//
// errorBound evaluates these bounds element by element with the
// reference's own values and magnitudes (the same kernels run on |x|,
// |w|, and on the error bounds), and returns the bound of each logit.

const unitRoundoff = 0x1p-24

// probabilisticLambda is λ of the probabilistic bound.
const probabilisticLambda = 8

// gamma is the smaller of the two bounds' growth functions (the worst case
// is the tighter one for k < λ²).
func gamma(k int64) float64 {
	ku := float64(k) * unitRoundoff
	return min(ku/(1-ku), probabilisticLambda*math.Sqrt(float64(k))*unitRoundoff)
}

// errorBound returns, per logit of e's graph on the n images x, a bound on
// the error of a float32 evaluation, and the longest reduction in the
// graph.
func errorBound(t *testing.T, ev *evaluation) ([]float64, int64) {
	t.Helper()
	w := newWalk(t, ev)
	var longest int64
	for _, nd := range w.nodes() {
		var d []float64
		in := w.errOf(nd.Ins[0])
		switch nd.Op {
		case ir.OpConv2D, ir.OpLinear:
			k := reduction(nd)
			longest = max(longest, k)
			if len(nd.Ins) > 2 {
				k++ // the bias
			}
			d = axpy(gamma(k), w.run(nd, abs, abs), w.run(nd, id(in), abs, zero))
		case ir.OpAvgPool2D:
			k := nd.Attrs.Kernel[0] * nd.Attrs.Kernel[1]
			d = axpy(gamma(k+1), w.run(nd, abs), w.run(nd, id(in)))
		case ir.OpAdd:
			d = axpy(unitRoundoff, abs(w.val(nd.Out())), axpy(1, in, w.errOf(nd.Ins[1])))
		case ops.GlobalAvgPool:
			k := nd.Ins[0].Type.Dims[1] * nd.Ins[0].Type.Dims[2]
			longest = max(longest, k)
			d = axpy(gamma(k+1), w.run(nd, abs), w.run(nd, id(in)))
		case ops.Concat:
			d = w.run(nd, w.errsOf(nd)...) // a copy: each element keeps its error
		case ops.BatchNormStats:
			// evaluation: the running statistics, exact inputs; the
			// normalisation's bound covers computing invstd from them
			for _, o := range nd.Outs {
				w.errs[o] = zero(w.val(o))
			}
			continue
		case ops.BatchNorm2D, ops.BatchNorm1D:
			d = w.bnBound(nd, in)
		default:
			if f, ok := activations[nd.Op]; ok {
				d = axpy(f.lipschitz(nd), in, f.rounding(w, nd))
				break
			}
			d = w.run(nd, id(in)) // relu, max-pooling, flatten, identity: 1-Lipschitz
		}
		w.errs[nd.Out()] = d
	}
	return w.errs[ev.g.Logits], longest
}

// Expected error. The bounds above hold for every order of summation and
// every sign of every rounding error; real errors are far smaller, because
// neither the partial sums nor the propagated errors line up. The
// statistical model of rounding (Higham, §2.8; Higham and Mary 2019) takes
// each rounding's relative error as independent, mean zero, uniform in
// [-u,u] (variance u²/3), and the runtime's summation order as arbitrary,
// i.e. random: summing k terms t (sum y) in a random order, the partial
// sums s_j have Σ_j E[s_j²] = y²·Σ(j/k)² + k(k+1)/6·var(t)
// ≈ k/6·(Σt² + 2y²), so one dot product's rounding error has variance
// u²/3·(k/6·(Σt² + 2y²) + Σt²) (the last term: rounding of the products,
// none with FMA). Errors arriving from different inputs are independent:
// Σ w²·var(δx). Max-pooling keeps one input's error (at most the window's
// largest variance), relu at most its input's, add sums both plus its own
// rounding.
//
// errorSigma returns, per logit, the standard deviation of the error under
// that model.
func errorSigma(t *testing.T, ev *evaluation) []float64 {
	t.Helper()
	const r2 = unitRoundoff * unitRoundoff / 3 // variance of one rounding, relative
	w := newWalk(t, ev)
	for _, nd := range w.nodes() {
		var v []float64
		in := w.errOf(nd.Ins[0])
		y := w.val(nd.Out())
		switch nd.Op {
		case ir.OpConv2D, ir.OpLinear:
			k := float64(reduction(nd))
			if len(nd.Ins) > 2 {
				k++
			}
			terms := w.run(nd, square, square, square) // Σt²
			v = w.run(nd, id(in), square, zero)        // Σ w²·var(δx)
			for i := range v {
				v[i] += r2 * (k/6*(terms[i]+2*y[i]*y[i]) + terms[i])
			}
		case ir.OpAvgPool2D:
			k := float64(nd.Attrs.Kernel[0] * nd.Attrs.Kernel[1])
			meanSq := w.run(nd, square) // Σx²/k
			v = w.run(nd, id(in))       // Σ var(δx)/k
			for i := range v {
				// the sum of k terms as above, divided by k, and the division
				v[i] = v[i]/k + r2*(meanSq[i]/6+k*y[i]*y[i]/3+y[i]*y[i])
			}
		case ir.OpAdd:
			v = axpy(1, in, w.errOf(nd.Ins[1]))
			for i := range v {
				v[i] += r2 * y[i] * y[i]
			}
		case ops.GlobalAvgPool:
			k := float64(nd.Ins[0].Type.Dims[1] * nd.Ins[0].Type.Dims[2])
			meanSq := w.run(nd, square) // Σx²/k
			v = w.run(nd, id(in))       // Σ var(δx)/k
			for i := range v {
				v[i] = v[i]/k + r2*(meanSq[i]/6+k*y[i]*y[i]/3+y[i]*y[i])
			}
		case ops.Concat:
			v = w.run(nd, w.errsOf(nd)...)
		case ops.BatchNormStats:
			for _, o := range nd.Outs {
				w.errs[o] = zero(w.val(o))
			}
			continue
		case ops.BatchNorm2D, ops.BatchNorm1D:
			// the propagated variance times (invstd·w)², and the bound's own
			// part as a uniform variable (bound²/3)
			own := w.bnBound(nd, zero(in))
			scale := w.bnScale(nd)
			v = make([]float64, len(in))
			for i := range v {
				v[i] = scale[i]*scale[i]*in[i] + own[i]*own[i]/3
			}
		default:
			if f, ok := activations[nd.Op]; ok {
				// |f'| ≤ L propagates the variance times L²; the evaluation's
				// own error, a uniform variable of the bound's width, adds
				// its variance (bound²/3)
				own := f.rounding(w, nd)
				l := f.lipschitz(nd)
				v = axpy(l*l, in, zero(in))
				for i := range v {
					v[i] += own[i] * own[i] / 3
				}
				break
			}
			v = w.run(nd, id(in)) // relu, max-pooling, flatten, identity
		}
		w.errs[nd.Out()] = v
	}
	sigma := w.errs[ev.g.Logits]
	for i, v := range sigma {
		sigma[i] = math.Sqrt(v)
	}
	return sigma
}

// activations: an elementwise activation y = f(x) turns an input error δx
// into at most L·δx, L = sup|f'| (leaky_relu: max(1, |slope|); sigmoid
// 1/4; tanh 1; gelu: Φ(x)+xφ(x) peaks at 1.1289 at x = √2; silu:
// s(1+x(1-s)) peaks at 1.0998 at x ≈ 2.40; hardswish: x/3+1/2 reaches 1.5
// at x = 3), and adds its own evaluation error. That error is the
// runtime's implementation of the function (exp, tanh and erf approximations
// in ONNX Runtime's MLAS; GELU, SiLU and HardSwish are several exported
// operators, each rounding once): no analysis of ours can bound it, so it
// is an assumption, stated here: every operator of the function is within
// ulpsPerOperator units of roundoff of its exact value, relative to the
// magnitudes it combines (|x| + |y|, which covers gelu's 1+erf(x/√2)
// cancelling for negative x).
var activations = map[ir.Op]activationError{
	ops.LeakyReLU: {func(nd *ir.Node) float64 { return max(1, math.Abs(nd.Attrs.Alpha)) }, 1},
	ops.Sigmoid:   {constL(0.25), 1},
	ops.Tanh:      {constL(1), 1},
	ops.GELU:      {constL(1.1289), 5},
	ops.SiLU:      {constL(1.0998), 2},
	ops.HardSwish: {constL(1.5), 2},
}

// activationError is an activation's error propagation: L, and how many
// exported operators round.
type activationError struct {
	lipschitz func(nd *ir.Node) float64
	operators float64
}

func constL(l float64) func(*ir.Node) float64 { return func(*ir.Node) float64 { return l } }

// ulpsPerOperator is the assumed accuracy of one operator (see activations).
const ulpsPerOperator = 4

// rounding is the activation's own evaluation error bound per element.
func (f activationError) rounding(w *walk, nd *ir.Node) []float64 {
	x, y := w.val(nd.Ins[0]), w.val(nd.Out())
	out := make([]float64, len(y))
	for i := range y {
		out[i] = f.operators * ulpsPerOperator * unitRoundoff * (math.Abs(x[i]) + math.Abs(y[i]))
	}
	return out
}

// bnScale is |invstd·weight| of each element's channel (batch norm in
// evaluation: an affine map per channel).
func (w *walk) bnScale(nd *ir.Node) []float64 {
	x := nd.Ins[0].Type
	c, s := int(x.Dims[0]), int(x.SampleElems()/x.Dims[0])
	invstd := w.val(nd.Ins[2])
	out := make([]float64, len(w.val(nd.Ins[0])))
	for i := range out {
		ch := (i / s) % c
		out[i] = math.Abs(invstd[ch])
		if len(nd.Ins) == 5 {
			out[i] *= math.Abs(w.val(nd.Ins[3])[ch])
		}
	}
	return out
}

// bnBound bounds batch norm's evaluation error: y = (x - mean)·invstd·w + b
// is 1/sqrt(var + eps) (two roundings and a square root, each within an ulp:
// invstd relatively within 3u), then at most four more roundings however
// the runtime arranges it (say, x·scale + (b - mean·scale)), each relative
// to the magnitudes it combines — so within 8u·(|x| + |mean|)·|invstd·w|
// + 8u·|b| — plus the input's error times |invstd·w|.
func (w *walk) bnBound(nd *ir.Node, in []float64) []float64 {
	x, mean := w.val(nd.Ins[0]), w.val(nd.Ins[1])
	xt := nd.Ins[0].Type
	c, s := int(xt.Dims[0]), int(xt.SampleElems()/xt.Dims[0])
	scale := w.bnScale(nd)
	out := make([]float64, len(x))
	for i := range out {
		ch := (i / s) % c
		out[i] = scale[i]*in[i] + 8*unitRoundoff*(math.Abs(x[i])+math.Abs(mean[ch]))*scale[i]
		if len(nd.Ins) == 5 {
			out[i] += 8 * unitRoundoff * math.Abs(w.val(nd.Ins[4])[ch])
		}
	}
	return out
}

// errsOf is each input's error quantity, as run's input transforms.
func (w *walk) errsOf(nd *ir.Node) []func([]float64) []float64 {
	var fs []func([]float64) []float64
	for _, v := range nd.Ins {
		fs = append(fs, id(w.errOf(v)))
	}
	return fs
}

// walk evaluates per-element quantities (error bounds, variances) over the
// forward nodes of a graph, next to the reference's values.
type walk struct {
	t    *testing.T
	g    *ir.Graph
	n    int
	vals map[*ir.Value][]float64
	errs map[*ir.Value][]float64
}

func newWalk(t *testing.T, ev *evaluation) *walk {
	return &walk{t: t, g: ev.g, n: ev.n, vals: ev.values, errs: map[*ir.Value][]float64{}}
}

// nodes are the forward nodes up to the logits (not the loss).
func (w *walk) nodes() []*ir.Node {
	var out []*ir.Node
	for _, nd := range w.g.Nodes {
		if nd.Phase == ir.Forward && nd.Op != ir.OpCrossEntropy {
			switch nd.Op {
			case ir.OpConv2D, ir.OpLinear, ir.OpAvgPool2D, ir.OpAdd, ir.OpReLU, ir.OpMaxPool2D, ir.OpFlatten, ir.OpDropout,
				ops.GlobalAvgPool, ops.Concat, ops.BatchNormStats, ops.BatchNorm2D, ops.BatchNorm1D:
			default:
				if _, ok := activations[nd.Op]; !ok {
					w.t.Fatalf("error analysis: no rule for %s", nd.Op)
				}
			}
			out = append(out, nd)
		}
	}
	return out
}

func (w *walk) val(v *ir.Value) []float64 { return w.vals[v] }

// errOf is a value's error quantity; inputs and parameters are exact.
func (w *walk) errOf(v *ir.Value) []float64 {
	if d, ok := w.errs[v]; ok {
		return d
	}
	return make([]float64, len(w.vals[v]))
}

// run runs nd's reference kernel (evaluation mode) on its inputs' values,
// each transformed by the corresponding function.
func (w *walk) run(nd *ir.Node, fs ...func([]float64) []float64) []float64 {
	ins := make([][]float64, len(nd.Ins))
	for i, v := range nd.Ins {
		ins[i] = fs[min(i, len(fs)-1)](w.vals[v])
	}
	out, err := reference.RunNode(nd, ins, w.n, reference.NodeOptions{})
	require.NoError(w.t, err)
	return out[0]
}

// reduction is the number of products per output of a conv or linear.
func reduction(nd *ir.Node) int64 {
	wt := nd.Ins[1].Type
	return wt.SampleElems() / wt.Dims[0]
}

func abs(x []float64) []float64 { return mapf(x, math.Abs) }

func square(x []float64) []float64 { return mapf(x, func(v float64) float64 { return v * v }) }

func zero(x []float64) []float64 { return make([]float64, len(x)) }

// id ignores the input's values and gives d instead.
func id(d []float64) func([]float64) []float64 { return func([]float64) []float64 { return d } }

func mapf(x []float64, f func(float64) float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = f(v)
	}
	return out
}

// axpy is a·x + y.
func axpy(a float64, x, y []float64) []float64 {
	out := make([]float64, len(x))
	for i := range x {
		out[i] = a*x[i] + y[i]
	}
	return out
}
