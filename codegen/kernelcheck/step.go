package kernelcheck

import (
	"encoding/binary"
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"time"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/runtime/device"
)

// TensorError is one tensor's worst error in a whole-step check.
type TensorError struct {
	Name  string
	Role  ir.Role
	Worst float64 // |device - reference| / max|reference|
	Where string  // the worst element: "name[i]: device vs reference"
}

// StepReport is one training step of a generated program on a device,
// compared with the float64 reference executing the same graph from the
// same parameters.
type StepReport struct {
	Step                int64 // 0-based
	Loss, RefLoss       float64
	Correct, RefCorrect int
	// Worst is the largest error over the loss and every parameter and
	// optimizer-state tensor after the step; WorstTensor says where.
	Worst       float64
	WorstTensor string
	// Tensors lists every checked tensor in schedule order: each node's
	// outputs (activations and gradients: where a divergence starts),
	// then the loss, the parameters and the optimizer state.
	Tensors []TensorError
	// ArgmaxMismatches counts packed max-pool argmax elements that differ
	// (near-ties decided differently in fp32 and float64).
	ArgmaxMismatches int
	Launches         int
	Device           time.Duration // the launches, on dev
	Reference        time.Duration // the float64 reference step
}

func (r StepReport) String() string {
	return fmt.Sprintf("step %d: loss %.7g (reference %.7g), correct %d (reference %d); worst rel err %.2e (%s); %d launches in %v (reference %v), argmax mismatches %d",
		r.Step, r.Loss, r.RefLoss, r.Correct, r.RefCorrect, r.Worst, r.WorstTensor, r.Launches, r.Device.Round(time.Millisecond), r.Reference.Round(time.Millisecond), r.ArgmaxMismatches)
}

// Step runs one training step per batch: every launch of prog (generated
// from the fused graph g) on dev, and reference.Executor's Train step on
// the same batch. Both start from the same parameters (reference.New(g,
// seed), uploaded rounded to fp32) and zeroed optimizer state; the device
// gets the images as uint8 HWC pixels and the labels as int32, the
// learning rate, step and seed in the step's scalar block (seed also keys
// dropout). Each IR value has its own device buffer (views share their
// source's, via Program.Buffer), so every activation and gradient can be
// compared after the step; buffers other than parameters, state and
// inputs are poisoned with NaN before each step.
//
// A report per step comes back; an error means the step could not run or
// a kernel left an element unwritten (NaN), not that it was inaccurate:
// compare Worst with a tolerance.
func Step(dev device.Device, prog *codegen.Program, g *ir.Graph, seed uint64, batches []reference.Batch) ([]StepReport, error) {
	if g.Opt == nil {
		return nil, fmt.Errorf("kernelcheck: graph %s has no optimizer", g.Name)
	}
	batch := prog.Batch
	ref := reference.New(g, seed)
	s := &stepRun{dev: dev, prog: prog, batch: batch, ptrs: map[*ir.Value]device.Ptr{}}
	defer s.free()

	// buffers: inputs, parameters, state, node outputs, scratch, and
	// anything else a launch names
	persistent := map[*ir.Value]bool{}
	for _, v := range g.Inputs {
		persistent[v] = true
		if err := s.alloc(v); err != nil {
			return nil, err
		}
	}
	for _, p := range g.Params {
		persistent[p.Value] = true
		if err := s.upload(p.Value, ref.Params[p]); err != nil {
			return nil, err
		}
	}
	for _, v := range g.State {
		persistent[v] = true
		if err := s.upload(v, ref.State[v]); err != nil {
			return nil, err
		}
	}
	for _, p := range g.Buffers {
		persistent[p.Value] = true
		if err := s.upload(p.Value, ref.Params[p]); err != nil {
			return nil, err
		}
	}
	var written []*ir.Value // what the step computes
	for _, n := range g.Nodes {
		for _, v := range n.Outs {
			if prog.Buffer(v) == v {
				written = append(written, v)
			}
		}
	}
	written = append(written, prog.Scratch...)
	for _, l := range prog.Launches {
		for _, a := range l.Args {
			if a.Kind == kernelarg.Buffer {
				written = append(written, prog.Buffer(a.Value))
			}
		}
	}
	var poisoned []*ir.Value
	for _, v := range written {
		if _, ok := s.ptrs[v]; ok || persistent[v] {
			continue
		}
		if err := s.alloc(v); err != nil {
			return nil, err
		}
		poisoned = append(poisoned, v)
	}
	var correct *ir.Value
	for _, n := range g.Nodes {
		if n.Op == ir.OpSoftmaxCrossEntropy || n.Op == ops.LinearCrossEntropyOp {
			correct = n.Outs[2]
		}
	}

	block, err := ScalarBlock(dev, Scalars{}, batch)
	if err != nil {
		return nil, err
	}
	defer dev.Free(block)

	var reports []StepReport
	for _, b := range batches {
		rep := StepReport{Step: ref.Step, Launches: len(prog.Launches)}
		if int64(b.N) != batch {
			return reports, fmt.Errorf("kernelcheck: a batch of %d for a program generated for %d", b.N, batch)
		}
		for _, v := range g.Inputs {
			if err := s.uploadInput(v, b); err != nil {
				return reports, err
			}
		}
		for _, v := range poisoned {
			if err := dev.CopyIn(s.ptrs[v], poison(v.Type, batch)); err != nil {
				return reports, err
			}
		}
		scalars := Scalars{LR: float32(g.Opt.LR), Step: ref.Step, Seed: seed}
		if err := dev.CopyIn(block, scalars.Block(batch).Bytes()); err != nil {
			return reports, err
		}
		start := time.Now()
		for _, l := range prog.Launches {
			params := make([]uint64, len(l.Args))
			for i, a := range l.Args {
				if a.Kind == kernelarg.Buffer {
					params[i] = uint64(s.ptrs[prog.Buffer(a.Value)])
				} else {
					params[i] = scalarArg(a, block)
				}
			}
			if err := dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params); err != nil {
				return reports, fmt.Errorf("step %d, %s: %w", rep.Step, l.Node.Text(), err)
			}
		}
		if err := dev.Sync(); err != nil {
			return reports, err
		}
		rep.Device = time.Since(start)
		start = time.Now()
		res, err := ref.Run(b, reference.Train)
		if err != nil {
			return reports, err
		}
		rep.Reference = time.Since(start)
		rep.RefLoss, rep.RefCorrect = res.Loss, res.Correct

		// every node output, in schedule order (diagnostics)
		seen := map[*ir.Value]bool{}
		for _, n := range g.Nodes {
			for _, v := range n.Outs {
				if seen[v] || res.Values[v] == nil {
					continue
				}
				seen[v] = true
				if _, err := s.check(&rep, v, v.Name, res.Values[v], false); err != nil {
					return reports, err
				}
			}
		}
		// what the step must get right: the loss, the parameters, the state
		got, err := s.check(&rep, g.Loss, g.Loss.Name, []float64{res.Loss}, true)
		if err != nil {
			return reports, err
		}
		rep.Loss = got[0]
		if correct != nil {
			got, err := s.read(correct)
			if err != nil {
				return reports, err
			}
			rep.Correct = int(got[0])
			if rep.Correct != rep.RefCorrect {
				rep.Worst, rep.WorstTensor = math.Inf(1), fmt.Sprintf("%s: %d correct, reference %d", correct.Name, rep.Correct, rep.RefCorrect)
			}
		}
		for _, p := range g.Params {
			if _, err := s.check(&rep, p.Value, p.Name, ref.Params[p], true); err != nil {
				return reports, err
			}
		}
		for _, v := range g.State {
			if _, err := s.check(&rep, v, v.Name, ref.State[v], true); err != nil {
				return reports, err
			}
		}
		for _, p := range g.Buffers {
			if _, err := s.check(&rep, p.Value, p.Name, ref.Params[p], true); err != nil {
				return reports, err
			}
		}
		reports = append(reports, rep)
	}
	return reports, nil
}

// stepRun holds the device buffers of a Step.
type stepRun struct {
	dev   device.Device
	prog  *codegen.Program
	batch int64
	ptrs  map[*ir.Value]device.Ptr
}

func (s *stepRun) free() {
	for _, p := range s.ptrs {
		s.dev.Free(p)
	}
}

func (s *stepRun) alloc(v *ir.Value) error {
	p, err := s.dev.Alloc(max(v.Type.Bytes(s.batch), 4))
	if err != nil {
		return fmt.Errorf("kernelcheck: %s (%d bytes): %w", v.Name, v.Type.Bytes(s.batch), err)
	}
	s.ptrs[v] = p
	return nil
}

func (s *stepRun) upload(v *ir.Value, vals []float64) error {
	if _, ok := s.ptrs[v]; !ok {
		if err := s.alloc(v); err != nil {
			return err
		}
	}
	return s.dev.CopyIn(s.ptrs[v], Encode(v.Type, vals, s.batch))
}

// uploadInput copies the batch's images (uint8 HWC pixels for a u8 input,
// else [0,1] CHW floats) or labels (int32) to v's buffer.
func (s *stepRun) uploadInput(v *ir.Value, b reference.Batch) error {
	switch {
	case v.Role == ir.RoleLabel:
		out := make([]byte, 4*len(b.Labels))
		for i, c := range b.Labels {
			binary.LittleEndian.PutUint32(out[4*i:], uint32(c))
		}
		return s.dev.CopyIn(s.ptrs[v], out)
	case v.Type.DType == ir.U8:
		if len(b.Pixels) != int(v.Type.Elems(s.batch)) {
			return fmt.Errorf("kernelcheck: %s takes %d pixels, the batch has %d", v.Name, v.Type.Elems(s.batch), len(b.Pixels))
		}
		return s.dev.CopyIn(s.ptrs[v], b.Pixels)
	}
	if len(b.Images) != int(v.Type.Elems(s.batch)) {
		return fmt.Errorf("kernelcheck: %s takes %d floats, the batch has %d", v.Name, v.Type.Elems(s.batch), len(b.Images))
	}
	return s.dev.CopyIn(s.ptrs[v], Encode(v.Type, b.Images, s.batch))
}

func (s *stepRun) read(v *ir.Value) ([]float64, error) {
	buf := s.prog.Buffer(v)
	p, ok := s.ptrs[buf]
	if !ok {
		return nil, fmt.Errorf("kernelcheck: no buffer for %s", v.Name)
	}
	b := make([]byte, v.Type.Bytes(s.batch))
	if err := s.dev.CopyOut(b, p); err != nil {
		return nil, err
	}
	return Decode(v.Type, b, s.batch), nil
}

// check compares v on the device with want and records it in the report;
// final marks what the step's Worst covers.
func (s *stepRun) check(rep *StepReport, v *ir.Value, name string, want []float64, final bool) ([]float64, error) {
	got, err := s.read(v)
	if err != nil {
		return nil, err
	}
	r := Report{Kernel: "step " + fmt.Sprint(rep.Step)}
	if err := compare(&r, name, v.Type, got, want); err != nil {
		return nil, err
	}
	rep.ArgmaxMismatches += r.ArgmaxMismatches
	rep.Tensors = append(rep.Tensors, TensorError{Name: name, Role: v.Role, Worst: r.Worst, Where: r.WorstTensor})
	if final && r.Worst > rep.Worst {
		rep.Worst, rep.WorstTensor = r.Worst, r.WorstTensor
	}
	return got, nil
}
