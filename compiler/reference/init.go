package reference

import (
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/runtime/initparam"
)

// InitParam returns p's initial values: a constant for zeros and ones
// (batch norm's parameters and buffers), else deterministic from seed and
// the parameter's name, with PyTorch's default distributions (see
// runtime/initparam, which trainers use too): conv and linear weights
// kaiming_uniform_(a=sqrt(5)), biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
// Values are float32s, so fp32 trainers start from the same point.
func InitParam(p *ir.Param, seed uint64) []float64 {
	n := int(p.Value.Type.SampleElems())
	switch p.Init.Kind {
	case ir.InitZeros, ir.InitOnes:
		out := make([]float64, n)
		if p.Init.Kind == ir.InitOnes {
			for i := range out {
				out[i] = 1
			}
		}
		return out
	}
	vals := initparam.Uniform(p.Name, seed, InitBound(p.Init), n)
	out := make([]float64, len(vals))
	for i, v := range vals {
		out[i] = float64(v)
	}
	return out
}

// InitBound is the half-width of p's uniform initial distribution (0 for
// constant initialisations).
func InitBound(init ir.Init) float64 {
	switch init.Kind {
	case ir.InitKaimingUniform:
		return initparam.KaimingBound(init.FanIn)
	case ir.InitUniformFanIn:
		return initparam.BiasBound(init.FanIn)
	}
	return 0
}
