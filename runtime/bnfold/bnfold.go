// Package bnfold computes the parameters of a conv with the batch norm
// after it folded in (evaluation: the running statistics), from a
// checkpoint's tensors.
//
// In:  the conv's weight [O,...] and bias (or none), the batch norm's
// weight and bias (or none: affine=false), running mean and variance [O]
// and eps.
// Out: the folded weight and bias, float32.
//
// Why a package of its own: the inference builds' loader (runtime/trainer)
// and the compiler's tests compute the same numbers, and the trainer
// binaries link only runtime packages.
package bnfold

import (
	"fmt"
	"math"
)

// Tensors are a fold's inputs; Bias, Gamma and Beta may be nil.
type Tensors struct {
	Weight, Bias, Gamma, Beta, Mean, Var []float32
	Eps                                  float64
}

// Fold returns w' and b': per output channel o, s = gamma[o]/sqrt(var[o]+eps),
// w'[o,...] = w[o,...]·s and b'[o] = (b[o]-mean[o])·s + beta[o], each
// computed in float64 from the float32 inputs and rounded once, so that each
// element is within half a float32 ulp of the exact fold of the stored
// values, plus the float64 arithmetic's few 2^-53 of the terms.
func Fold(t Tensors) (w, b []float32, err error) {
	o := len(t.Mean)
	switch {
	case o == 0 || len(t.Var) != o || len(t.Weight)%o != 0:
		return nil, nil, fmt.Errorf("bnfold: %d running means, %d variances and %d weights do not make one scale per output channel", o, len(t.Var), len(t.Weight))
	case t.Bias != nil && len(t.Bias) != o, t.Gamma != nil && len(t.Gamma) != o, t.Beta != nil && len(t.Beta) != o:
		return nil, nil, fmt.Errorf("bnfold: bias, weight and bias of the batch norm must have %d elements", o)
	}
	per := len(t.Weight) / o
	w, b = make([]float32, len(t.Weight)), make([]float32, o)
	for c := 0; c < o; c++ {
		if t.Var[c] < 0 || !(float64(t.Var[c])+t.Eps > 0) {
			return nil, nil, fmt.Errorf("bnfold: running variance %g of channel %d is negative", t.Var[c], c)
		}
		s := 1 / math.Sqrt(float64(t.Var[c])+t.Eps)
		if t.Gamma != nil {
			s *= float64(t.Gamma[c])
		}
		for i := c * per; i < (c+1)*per; i++ {
			w[i] = float32(float64(t.Weight[i]) * s)
		}
		bias := -float64(t.Mean[c]) * s
		if t.Bias != nil {
			bias = (float64(t.Bias[c]) - float64(t.Mean[c])) * s
		}
		if t.Beta != nil {
			bias += float64(t.Beta[c])
		}
		b[c] = float32(bias)
	}
	return w, b, nil
}
