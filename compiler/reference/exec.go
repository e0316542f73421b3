// Package reference interprets the unfused training IR in float64: forward,
// loss, backward and optimizer update.
//
// In:  a compiled *ir.Graph, a seed, batches of images and labels.
// Out: the loss, the number of correct predictions, every intermediate
// value, and the parameters and optimizer state after each step.
//
// Why: it is the oracle. Every generated kernel, every memory plan
// (recomputation, micro-batching) and every trainer is checked against it,
// so it is written for obviousness, not speed — one plain loop nest per op
// (each op's Ref, in its file of compiler/ops), on float64 so that fp32
// results can be compared with a tight tolerance.
package reference

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Batch is one step's input: images either as float64 in NCHW order,
// already scaled to [0,1] like ToTensor, or as the loader's decoded uint8
// HWC pixels (then Images may be nil); and class labels.
type Batch struct {
	N      int
	Images []float64
	Pixels []uint8
	Labels []int32
}

// imagesFor returns the batch's images in the form input v takes: raw
// pixel values in HWC order for a u8 input (fused graphs), [0,1] CHW for f32.
func (b Batch) imagesFor(v *ir.Value) []float64 {
	if v.Type.DType == ir.U8 {
		px := make([]float64, len(b.Pixels))
		for i, p := range b.Pixels {
			px[i] = float64(p)
		}
		return px
	}
	if b.Images == nil && b.Pixels != nil {
		t := v.Type
		u8 := ir.ImageU8Type(t)
		px := make([]float64, len(b.Pixels))
		for i, p := range b.Pixels {
			px[i] = float64(p)
		}
		return ops.HWCToCHW(px, b.N, u8)
	}
	return b.Images
}

// Executor holds a model's parameters, buffers and optimizer state.
type Executor struct {
	G    *ir.Graph
	Seed uint64
	// Params holds the parameters and the buffers (batch norm's running
	// statistics), by Param.
	Params map[*ir.Param][]float64
	State  map[*ir.Value][]float64
	// Step counts completed training steps; Adam's bias correction and the
	// dropout RNG read it.
	Step int64
}

// New initialises the parameters from seed (see InitParam) and zeroes the
// optimizer state.
func New(g *ir.Graph, seed uint64) *Executor {
	e := &Executor{G: g, Seed: seed, Params: map[*ir.Param][]float64{}, State: map[*ir.Value][]float64{}}
	for _, p := range g.Params {
		e.Params[p] = InitParam(p, seed)
	}
	for _, p := range g.Buffers {
		e.Params[p] = InitParam(p, seed)
	}
	for _, s := range g.State {
		e.State[s] = make([]float64, s.Type.SampleElems())
	}
	return e
}

// Mode selects what a run computes.
type Mode int

const (
	// Eval runs the forward phase with dropout off.
	Eval Mode = iota
	// Gradients runs forward (dropout on) and backward, no update.
	Gradients
	// Train runs the whole step and advances Step.
	Train
)

// Result is what a run computed.
type Result struct {
	Loss    float64
	Correct int
	// Values holds every node output by value.
	Values map[*ir.Value][]float64
	// FusedGrads holds the gradients that weight-gradient blocks with a
	// fused update computed when the run did not update (Gradients mode).
	FusedGrads map[*ir.Param][]float64
}

// Grad returns the complete gradient of parameter p (the last gradient
// value computed for it; earlier ones are partial sums), or nil.
func (r *Result) Grad(g *ir.Graph, p *ir.Param) []float64 {
	if d, ok := r.FusedGrads[p]; ok {
		return d
	}
	var last *ir.Value
	for _, n := range g.Nodes {
		for _, v := range n.Outs {
			if v.Role == ir.RoleGrad && v.Param == p {
				last = v
			}
		}
	}
	if last == nil {
		return nil
	}
	return r.Values[last]
}

// Run executes the graph on b.
func (e *Executor) Run(b Batch, mode Mode) (*Result, error) {
	if err := e.checkBatch(b); err != nil {
		return nil, err
	}
	r := newResult()
	env := &ops.RefEnv{Batch: b.N, Training: mode != Eval, Update: mode == Train, Seed: e.Seed, Step: e.Step, FusedGrad: r.fusedGrad}
	for _, in := range e.G.Inputs {
		if in.Role == ir.RoleLabel {
			l := make([]float64, b.N)
			for i, c := range b.Labels {
				l[i] = float64(c)
			}
			r.Values[in] = l
		} else {
			r.Values[in] = b.imagesFor(in)
		}
	}
	for p, d := range e.Params {
		r.Values[p.Value] = d
	}
	for s, d := range e.State {
		r.Values[s] = d
	}
	for _, n := range e.G.Nodes {
		if mode == Eval && n.Phase != ir.Forward {
			break
		}
		if mode == Gradients && n.Phase == ir.Update {
			break
		}
		k, err := kernelOf(n)
		if err != nil {
			return nil, err
		}
		ins := make([][]float64, len(n.Ins))
		for i, v := range n.Ins {
			ins[i] = r.Values[v]
		}
		outs := k(env, n, ins)
		for i, v := range n.Outs {
			r.Values[v] = outs[i]
		}
	}
	if e.G.Infer { // an inference graph: its output is the logits alone
		return r, nil
	}
	r.Loss = r.Values[e.G.Loss][0]
	r.Correct = ops.CountCorrect(r.Values[e.G.Logits], b.Labels, int(e.G.Logits.Type.Dims[0]))
	if mode == Train {
		e.Step++
	}
	return r, nil
}

func (e *Executor) checkBatch(b Batch) error {
	if b.N < 1 {
		return fmt.Errorf("reference: empty batch")
	}
	img := e.G.Inputs[0].Type
	want := b.N * int(img.SampleElems())
	switch {
	case b.Pixels != nil && len(b.Pixels) != want:
		return fmt.Errorf("reference: batch of %d images needs %d pixels, got %d", b.N, want, len(b.Pixels))
	case b.Pixels == nil && img.DType == ir.U8:
		return fmt.Errorf("reference: the graph takes uint8 pixels, the batch has none")
	case b.Pixels == nil && len(b.Images) != want:
		return fmt.Errorf("reference: batch of %d images needs %d values, got %d", b.N, want, len(b.Images))
	}
	if e.G.Infer && b.Labels == nil {
		return nil // an inference graph reads no labels
	}
	if len(b.Labels) != b.N {
		return fmt.Errorf("reference: %d labels for %d images", len(b.Labels), b.N)
	}
	classes := e.G.Logits.Type.Dims[0]
	for i, c := range b.Labels {
		if c < 0 || int64(c) >= classes {
			return fmt.Errorf("reference: label %d of sample %d is outside [0,%d)", c, i, classes)
		}
	}
	return nil
}

func newResult() *Result {
	return &Result{Values: map[*ir.Value][]float64{}, FusedGrads: map[*ir.Param][]float64{}}
}

func (r *Result) fusedGrad(p *ir.Param, g []float64) { r.FusedGrads[p] = g }

// kernelOf is n's reference kernel, from the op registry.
func kernelOf(n *ir.Node) (ops.RefKernel, error) {
	if d := ops.Of(n.Op); d != nil && d.Ref != nil {
		return d.Ref, nil
	}
	return nil, fmt.Errorf("reference: no kernel for %s", n.Op)
}

// ParamByName returns the current values of a parameter or buffer.
func (e *Executor) ParamByName(name string) []float64 {
	if p := e.G.ParamByName(name); p != nil {
		return e.Params[p]
	}
	return nil
}

// LoadFrom sets e's parameters and buffers (an inference graph's) from a
// checkpoint's tensors by state_dict name (from: a training graph's
// executor, say): those the bnfold pass made (ir.Param.Fold) are computed
// by fold from the tensors they name (runtime/bnfold's arithmetic, or
// float64's to check the pass's algebra alone).
func (e *Executor) LoadFrom(tensor func(name string) []float64, fold func(f *ir.Fold, get func(string) []float64) []float64) error {
	for _, p := range append(append([]*ir.Param{}, e.G.Params...), e.G.Buffers...) {
		var v []float64
		if p.Fold != nil {
			v = fold(p.Fold, tensor)
		} else {
			v = tensor(p.Name)
		}
		if int64(len(v)) != p.Value.Type.SampleElems() {
			return fmt.Errorf("reference: %s: %d values, want %d", p.Name, len(v), p.Value.Type.SampleElems())
		}
		e.Params[p] = append([]float64(nil), v...)
	}
	return nil
}

// Clone deep-copies the parameters and state (for comparisons).
func (e *Executor) Clone() *Executor {
	c := &Executor{G: e.G, Seed: e.Seed, Step: e.Step, Params: map[*ir.Param][]float64{}, State: map[*ir.Value][]float64{}}
	for p, d := range e.Params {
		c.Params[p] = append([]float64(nil), d...)
	}
	for s, d := range e.State {
		c.State[s] = append([]float64(nil), d...)
	}
	return c
}

// NodeOptions are the run-time state one node's kernel may read.
type NodeOptions struct {
	Step     int64  // 0-based training step (Adam, dropout RNG)
	Seed     uint64 // dropout RNG
	Training bool   // dropout on
	Update   bool   // fused updates apply (else they return nothing)
	// BNTiles: the target's tiling of conv blocks' batch norm partials
	// (ops.RefEnv.BNTiles; codegen.Program.BNTiles)
	BNTiles map[*ir.Value]ops.BNTiling
}

// RunNode runs one node's reference kernel on the given inputs (one slice
// per input, float64 per element; argmax as window indices, labels as
// class numbers, u8 images as raw 0..255 values) and returns its outputs.
// Update kernels change their parameter and state inputs in place.
func RunNode(n *ir.Node, ins [][]float64, batch int, o NodeOptions) ([][]float64, error) {
	return RunNodeSlice(n, ins, batch, o, Slice{})
}
