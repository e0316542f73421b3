package reference

import (
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/cnnc/cnnc/compiler/ir"
)

// InitParam returns p's initial values, deterministic from seed and the
// parameter's name, with PyTorch's default distributions:
// conv and linear weights kaiming_uniform_(a=sqrt(5)), which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)); biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
// Values are rounded to float32 so fp32 trainers start from the same point.
func InitParam(p *ir.Param, seed uint64) []float64 {
	h := fnv.New64a()
	h.Write([]byte(p.Name))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	n := p.Value.Type.SampleElems()
	out := make([]float64, n)
	bound := InitBound(p.Init)
	for i := range out {
		out[i] = float64(float32((2*rng.Float64() - 1) * bound))
	}
	return out
}

// InitBound is the half-width of p's uniform initial distribution.
func InitBound(init ir.Init) float64 {
	switch init.Kind {
	case ir.InitKaimingUniform:
		// gain = sqrt(2/(1+a^2)) with a = sqrt(5); bound = gain*sqrt(3/fan_in)
		gain := math.Sqrt(2.0 / (1 + 5))
		return gain * math.Sqrt(3/float64(init.FanIn))
	default:
		return 1 / math.Sqrt(float64(init.FanIn))
	}
}
