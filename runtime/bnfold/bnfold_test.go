package bnfold

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exact is the fold of the stored float32 values to 200 bits (big.Float),
// the value Fold's float64 arithmetic approximates before rounding once.
func exact(x, gamma, variance, eps, sub, beta float64) float64 {
	prec := uint(200)
	f := func(v float64) *big.Float { return new(big.Float).SetPrec(prec).SetFloat64(v) }
	den := new(big.Float).SetPrec(prec).Add(f(variance), f(eps))
	den.Sqrt(den)
	s := new(big.Float).SetPrec(prec).Quo(f(gamma), den)
	v := new(big.Float).SetPrec(prec).Sub(f(x), f(sub))
	v.Mul(v, s)
	v.Add(v, f(beta))
	r, _ := v.Float64()
	return r
}

// Each folded element is the exact fold of the stored values rounded to
// float32: within half a float32 ulp of it, plus the float64 evaluation's
// own error (a few 2^-53 relative to the terms: a weight's is below the
// slack of 1e-12 ulps; a bias's, where (b-mean)·s and beta may cancel, is
// bounded by 8·2^-53 of the terms' magnitudes), for weights and biases,
// with and without affine and conv bias.
func TestFoldRoundsOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const o, per = 7, 12
	r := func(lo, hi float64) float32 { return float32(lo + (hi-lo)*rng.Float64()) }
	for _, affine := range []bool{true, false} {
		for _, bias := range []bool{true, false} {
			in := Tensors{Weight: make([]float32, o*per), Mean: make([]float32, o), Var: make([]float32, o), Eps: 1e-5}
			for i := range in.Weight {
				in.Weight[i] = r(-1, 1)
			}
			for c := 0; c < o; c++ {
				in.Mean[c], in.Var[c] = r(-2, 2), r(0, 3)
			}
			in.Var[0] = 0 // eps alone
			if affine {
				in.Gamma, in.Beta = make([]float32, o), make([]float32, o)
				for c := 0; c < o; c++ {
					in.Gamma[c], in.Beta[c] = r(-2, 2), r(-1, 1)
				}
			}
			if bias {
				in.Bias = make([]float32, o)
				for c := range in.Bias {
					in.Bias[c] = r(-1, 1)
				}
			}
			w, b, err := Fold(in)
			require.NoError(t, err)
			g := func(c int) float64 {
				if affine {
					return float64(in.Gamma[c])
				}
				return 1
			}
			be := func(c int) float64 {
				if affine {
					return float64(in.Beta[c])
				}
				return 0
			}
			halfULP := func(v float64) float64 { return math.Abs(v) * 0x1p-24 * (1 + 1e-12) }
			for c := 0; c < o; c++ {
				for i := c * per; i < (c+1)*per; i++ {
					want := exact(float64(in.Weight[i]), g(c), float64(in.Var[c]), in.Eps, 0, 0)
					assert.LessOrEqual(t, math.Abs(float64(w[i])-want), halfULP(want), "weight %d", i)
				}
				cb := 0.0
				if bias {
					cb = float64(in.Bias[c])
				}
				want := exact(cb, g(c), float64(in.Var[c]), in.Eps, float64(in.Mean[c]), be(c))
				// float64: a handful of roundings of the terms (sqrt, quotient, product, two sums)
				terms := math.Abs(cb-float64(in.Mean[c]))*math.Abs(g(c))/math.Sqrt(float64(in.Var[c])+in.Eps) + math.Abs(be(c))
				assert.LessOrEqual(t, math.Abs(float64(b[c])-want), halfULP(want)+8*0x1p-53*terms, "bias %d", c)
			}
		}
	}
}

func TestFoldRefusesBadShapes(t *testing.T) {
	_, _, err := Fold(Tensors{Weight: make([]float32, 5), Mean: make([]float32, 2), Var: make([]float32, 2)})
	assert.ErrorContains(t, err, "one scale per output channel")
	_, _, err = Fold(Tensors{Weight: make([]float32, 4), Mean: make([]float32, 2), Var: []float32{1, -1}, Eps: 1e-5})
	assert.ErrorContains(t, err, "negative")
}
