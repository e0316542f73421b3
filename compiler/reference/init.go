package reference

import (
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/runtime/initparam"
)

// InitParam returns p's initial values, deterministic from seed and the
// parameter's name, with PyTorch's default distributions (see
// runtime/initparam, which trainers use too): conv and linear weights
// kaiming_uniform_(a=sqrt(5)), biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
// Values are float32s, so fp32 trainers start from the same point.
func InitParam(p *ir.Param, seed uint64) []float64 {
	vals := initparam.Uniform(p.Name, seed, InitBound(p.Init), int(p.Value.Type.SampleElems()))
	out := make([]float64, len(vals))
	for i, v := range vals {
		out[i] = float64(v)
	}
	return out
}

// InitBound is the half-width of p's uniform initial distribution.
func InitBound(init ir.Init) float64 {
	if init.Kind == ir.InitKaimingUniform {
		return initparam.KaimingBound(init.FanIn)
	}
	return initparam.BiasBound(init.FanIn)
}
