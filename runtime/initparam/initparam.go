// Package initparam initialises parameters exactly as cnnc's float64
// reference and every generated trainer do, so that a trainer and the
// reference start from the same point: PyTorch's default distributions,
// deterministic from a seed and the parameter's name.
package initparam

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// KaimingBound is the half-width of kaiming_uniform_(a=sqrt(5)) — PyTorch's
// default for conv and linear weights: gain·sqrt(3/fan_in) with
// gain = sqrt(2/(1+a²)), which is 1/sqrt(fan_in).
func KaimingBound(fanIn int64) float64 {
	gain := math.Sqrt(2.0 / (1 + 5))
	return gain * math.Sqrt(3/float64(fanIn))
}

// BiasBound is the half-width of PyTorch's default bias init:
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
func BiasBound(fanIn int64) float64 { return 1 / math.Sqrt(float64(fanIn)) }

// Uniform returns n values of U(-bound, bound) rounded to float32, from a
// PCG stream keyed by seed and the parameter name (so adding a layer does
// not change the others' initial values).
func Uniform(name string, seed uint64, bound float64, n int) []float32 {
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32((2*rng.Float64() - 1) * bound)
	}
	return out
}
