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

// ensureEvalFolds computes evaluation's folded parameters (Spec.EvalFolds)
// from the parameters and buffers they name, unless they hold the fold of
// the current ones already: once after a checkpoint is loaded or training
// steps ran, not per evaluated batch.
func (s *Session) ensureEvalFolds() error {
	if s.evalFolded || len(s.Spec.EvalFolds) == 0 {
		return nil
	}
	byName := map[string]Tensor{}
	for _, t := range s.Spec.persistent() {
		byName[t.Name] = t
	}
	read := func(name string) ([]float32, error) {
		if name == "" {
			return nil, nil
		}
		t, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("trainer: spec %s: a folded parameter reads %s, which the model does not have", s.Spec.Model, name)
		}
		return s.ReadTensor(t)
	}
	for _, t := range s.Spec.EvalFolds {
		fd := t.Fold
		in := bnfold.Tensors{Eps: fd.Eps}
		var err error
		names := []string{fd.Gamma, fd.Beta, fd.Mean, fd.Var, fd.ConvBias}
		dsts := []*[]float32{&in.Gamma, &in.Beta, &in.Mean, &in.Var, &in.Bias}
		if !fd.Bias {
			names[4], dsts[4] = fd.Weight, &in.Weight
		}
		for i, n := range names {
			if *dsts[i], err = read(n); err != nil {
				return err
			}
		}
		w, b, err := bnfold.Fold(in)
		if err != nil {
			return fmt.Errorf("evaluation: %s: %w", t.Name, err)
		}
		vals := w
		if fd.Bias {
			vals = b
		}
		if int64(len(vals)) != t.Elems() {
			return fmt.Errorf("trainer: spec %s: %s folds to %d values, its place holds %d", s.Spec.Model, t.Name, len(vals), t.Elems())
		}
		if err := s.Dev.CopyIn(s.addr(t.Arena, t.Offset), f32bytes(vals)); err != nil {
			return err
		}
	}
	s.evalFolded = true
	return nil
}
