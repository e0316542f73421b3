package trainer

import (
	"fmt"

	"github.com/cnnc/cnnc/runtime/bnfold"
	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// foldTensor computes an inference build's folded tensor t (Tensor.Fold)
// from checkpoint f: the conv's weight or bias with the batch norm after
// it folded in, in float64 and rounded once (bnfold.Fold). Every tensor it
// reads is checked for its name, type, shape and finiteness.
func foldTensor(f *checkpoint.File, t Tensor) ([]byte, error) {
	fd := t.Fold
	channels := []int64{t.Shape[0]}
	get := func(name string, shape []int64) ([]float32, error) {
		if name == "" {
			return nil, nil
		}
		ct, err := f.Expect(name, checkpoint.F32, shape)
		if err != nil {
			return nil, err
		}
		vals := ct.Float32s()
		if i, bad := firstNonFinite(vals); bad {
			return nil, fmt.Errorf("tensor %q holds %v at element %d", name, vals[i], i)
		}
		return vals, nil
	}
	in := bnfold.Tensors{Eps: fd.Eps}
	var err error
	for _, r := range []struct {
		name  string
		shape []int64
		dst   *[]float32
	}{{fd.Gamma, channels, &in.Gamma}, {fd.Beta, channels, &in.Beta}, {fd.Mean, channels, &in.Mean}, {fd.Var, channels, &in.Var}} {
		if *r.dst, err = get(r.name, r.shape); err != nil {
			return nil, err
		}
	}
	if fd.Bias {
		if in.Bias, err = get(fd.ConvBias, channels); err != nil {
			return nil, err
		}
	} else if in.Weight, err = get(fd.Weight, t.Shape); err != nil {
		return nil, err
	}
	w, b, err := bnfold.Fold(in)
	if err != nil {
		return nil, err
	}
	if fd.Bias {
		return f32bytes(b), nil
	}
	return f32bytes(w), nil
}
