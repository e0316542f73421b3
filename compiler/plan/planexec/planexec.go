// Package planexec runs a memory plan's training step on the reference
// kernels, so that tests can hold a Plan to the float64 oracle.
//
// In:  a *plan.Plan, the parameters and optimizer state of a
// reference.Executor, batches.
// Out: the loss, the correct count, and the parameters and state after
// each step.
//
// Two stores. Float64 keeps every buffer as its own float64 slice and runs
// the steps exactly as planned (order, recomputation, micro-batch loops
// with accumulation): it shows that a recomputed activation equals the
// original bit for bit and that micro-batched gradients add up to the full
// batch's. Arena keeps every buffer at its planned offset in one byte
// slice of exactly Plan.ArenaBytes — f32 as float32, argmax packed 32/bits
// to a word (codegen/argmax.go's layout), images as bytes, labels as int32
// — and fills each buffer with NaN bytes when it becomes live, so if two
// buffers live at once overlapped, or the arena were too small, or a step
// read what no step had written yet, the results would be wrong (or the
// run would panic) instead of matching the reference within fp32
// rounding.
package planexec

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
)

// Kind selects the store.
type Kind int

const (
	Float64 Kind = iota // one float64 slice per buffer
	Arena               // one byte arena of Plan.ArenaBytes, fp32 storage
)

// Runner executes a plan step after step, keeping parameters and optimizer
// state in its store between steps.
type Runner struct {
	Plan *plan.Plan
	Kind Kind
	Seed uint64
	// Step counts completed steps (the optimizer and dropout read it).
	Step int64
	// Mismatches lists recomputed outputs that differed from the forward
	// pass's (Float64 store only; empty when recomputation is exact).
	Mismatches []string
	// Recomputed counts recomputed outputs compared bit for bit.
	Recomputed int

	vals      map[string]*ir.Value
	arena     []byte
	f64       [][]float64
	recompute map[int]bool // node IDs recomputed somewhere in the plan
	originals map[origKey][]float64
}

type origKey struct{ node, out, first int }

// New makes a runner whose parameters and optimizer state are copied, by
// name, from e (whose graph may be the unplanned one).
func New(p *plan.Plan, kind Kind, e *reference.Executor) (*Runner, error) {
	r := &Runner{Plan: p, Kind: kind, Seed: e.Seed, Step: e.Step, vals: map[string]*ir.Value{}, recompute: map[int]bool{}}
	g := p.Graph
	for _, v := range g.Inputs {
		r.vals[v.Name] = v
	}
	for _, pr := range g.Params {
		r.vals[pr.Value.Name] = pr.Value
		for _, s := range pr.State {
			r.vals[s.Name] = s
		}
	}
	for _, pr := range g.Buffers {
		r.vals[pr.Value.Name] = pr.Value
	}
	for _, n := range g.Nodes {
		for _, v := range n.Outs {
			r.vals[v.Name] = v
		}
	}
	for _, s := range p.Steps {
		if s.Recompute {
			r.recompute[s.NodeID] = true
		}
	}
	switch kind {
	case Arena:
		r.arena = make([]byte, p.ArenaBytes)
		poison(r.arena)
	default:
		r.f64 = make([][]float64, len(p.Buffers))
		for i, b := range p.Buffers {
			r.f64[i] = make([]float64, r.capacity(b))
			fillNaN(r.f64[i])
		}
	}
	for _, pr := range p.Params {
		src := e.ParamByName(pr.Name)
		if src == nil {
			return nil, fmt.Errorf("planexec: the executor has no parameter %s", pr.Name)
		}
		r.store(pr.Buffer, r.vals[pr.Name].Type, 0, src, false)
		ep := e.G.ParamByName(pr.Name)
		for i, sb := range pr.State {
			r.store(sb, ep.State[i].Type, 0, e.State[ep.State[i]], false)
		}
	}
	for _, pr := range p.ModelBuffers {
		src := e.ParamByName(pr.Name)
		if src == nil {
			return nil, fmt.Errorf("planexec: the executor has no buffer %s", pr.Name)
		}
		r.store(pr.Buffer, r.vals[pr.Name].Type, 0, src, false)
	}
	return r, nil
}

// capacity is a buffer's element count (its first value's type at the
// buffer's samples; values sharing a buffer have one size).
func (r *Runner) capacity(b *plan.Buffer) int {
	t := r.vals[b.Holds[0].Value].Type
	if t.Batched {
		return int(t.Elems(b.Samples))
	}
	return int(t.SampleElems())
}

// Result is what one step computed.
type Result struct {
	Loss    float64
	Correct int
}

// Run executes one training step on b.
func (r *Runner) Run(b reference.Batch) (Result, error) {
	p := r.Plan
	if int64(b.N) != p.Batch {
		return Result{}, fmt.Errorf("planexec: the plan is for batches of %d, got %d", p.Batch, b.N)
	}
	r.originals = map[origKey][]float64{}
	if err := r.loadInputs(b); err != nil {
		return Result{}, err
	}
	poisoned := map[int]bool{}
	for i := 0; i < len(p.Steps); {
		s := p.Steps[i]
		if s.Loop < 0 {
			if err := r.step(i, 0, int(p.Batch), poisoned, true); err != nil {
				return Result{}, err
			}
			i++
			continue
		}
		l := p.Loops[s.Loop]
		for _, z := range l.Zero {
			r.zero(z)
			poisoned[z] = true
		}
		for it := int64(0); it < l.Count; it++ {
			first := it * l.MicroBatch
			size := min(l.MicroBatch, p.Batch-first)
			for j := l.FirstStep; j <= l.LastStep; j++ {
				if err := r.step(j, int(first), int(size), poisoned, it == 0); err != nil {
					return Result{}, err
				}
			}
		}
		i = l.LastStep + 1
	}
	r.Step++
	return r.result(b)
}

func (r *Runner) loadInputs(b reference.Batch) error {
	for _, v := range r.Plan.Graph.Inputs {
		buf := r.bufferOf(v.Name)
		if buf < 0 {
			continue // an input no kernel reads
		}
		var data []float64
		switch {
		case v.Role == ir.RoleLabel:
			data = make([]float64, b.N)
			for i, c := range b.Labels {
				data[i] = float64(c)
			}
		case v.Type.DType == ir.U8:
			data = make([]float64, len(b.Pixels))
			for i, px := range b.Pixels {
				data[i] = float64(px)
			}
		case b.Images != nil:
			data = b.Images
		default:
			data = pixelsCHW(b.Pixels, b.N, v.Type)
		}
		r.store(buf, v.Type, 0, data, false)
	}
	return nil
}

// pixelsCHW scales uint8 HWC pixels to [0,1] CHW, like ToTensor.
func pixelsCHW(px []uint8, n int, t ir.Type) []float64 {
	c, h, w := int(t.Dims[0]), int(t.Dims[1]), int(t.Dims[2])
	out := make([]float64, len(px))
	for b := 0; b < n; b++ {
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				for ch := 0; ch < c; ch++ {
					out[((b*c+ch)*h+y)*w+x] = float64(px[((b*h+y)*w+x)*c+ch]) / 255
				}
			}
		}
	}
	return out
}

// bufferOf finds the buffer holding a graph input, parameter or state
// value from the start of the step.
func (r *Runner) bufferOf(name string) int {
	for _, b := range r.Plan.Buffers {
		if b.Holds[0].Value == name {
			return b.ID
		}
	}
	return -1
}

// step runs step i on samples [first, first+size); firstIter says whether
// this is the first iteration of its loop (or no loop).
func (r *Runner) step(i, first, size int, poisoned map[int]bool, firstIter bool) error {
	p := r.Plan
	s := p.Steps[i]
	n := s.Node
	// buffers that become live here start as poison: every iteration for
	// a loop's own buffers, once for the others
	for _, b := range p.Buffers {
		if b.FirstStep != i || b.Persistent || isInput(p, b) {
			continue
		}
		if b.Loop >= 0 || (firstIter && !poisoned[b.ID]) {
			r.poisonBuffer(b.ID)
			poisoned[b.ID] = true
		}
	}
	ins := make([][]float64, len(n.Ins))
	for j, o := range s.Ins {
		ins[j] = r.load(o, n.Ins[j].Type, first, size)
	}
	outs, err := reference.RunNodeSlice(n, ins, size, reference.NodeOptions{Step: r.Step, Seed: r.Seed, Training: true, Update: true},
		reference.Slice{First: first, Of: int(p.Batch)})
	if err != nil {
		return err
	}
	// update kernels change their parameter and state inputs in place
	updated := map[*ir.Param]bool{}
	for _, pr := range n.UpdatedParams() {
		updated[pr] = true
	}
	for j, v := range n.Ins {
		if (v.Role == ir.RoleParam || v.Role == ir.RoleOptState) && updated[v.Param] {
			r.store(s.Ins[j].Buffer, v.Type, 0, ins[j], false)
		}
	}
	for _, j := range n.MutatedInputs() { // batch norm's running statistics, written in place
		r.store(s.Ins[j].Buffer, n.Ins[j].Type, 0, ins[j], false)
	}
	if len(outs) != len(s.Outs) {
		return fmt.Errorf("planexec: step %d (%s) gave %d outputs, the plan has %d", i, s.Kernel, len(outs), len(s.Outs))
	}
	for j, o := range s.Outs {
		v := n.Outs[j]
		if s.Recompute {
			r.Recomputed++
			if orig, ok := r.originals[origKey{n.ID, j, first}]; ok && !sameBits(orig, outs[j]) {
				r.Mismatches = append(r.Mismatches, fmt.Sprintf("%s (samples %d..%d)", v.Name, first, first+size))
			}
		} else if r.recompute[n.ID] && r.Kind == Float64 {
			r.originals[origKey{n.ID, j, first}] = append([]float64(nil), outs[j]...)
		}
		off := 0
		if o.Slice {
			off = first * int(v.Type.SampleElems())
		}
		r.store(o.Buffer, v.Type, off, outs[j], s.Accumulate && !v.Type.Batched)
	}
	return nil
}

func isInput(p *plan.Plan, b *plan.Buffer) bool {
	for _, v := range p.Graph.Inputs {
		if b.Holds[0].Value == v.Name {
			return true
		}
	}
	return false
}

func sameBits(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

// load reads an operand: the step's samples of a batched value (its slice
// of a whole-batch buffer when o.Slice), or all of an unbatched one.
func (r *Runner) load(o plan.Operand, t ir.Type, first, size int) []float64 {
	off, n := 0, int(t.SampleElems())
	if t.Batched {
		n *= size
		if o.Slice {
			off = first * int(t.SampleElems())
		}
	}
	b := r.Plan.Buffers[o.Buffer]
	if off+n > r.capacity(b) {
		panic(fmt.Sprintf("planexec: %s reads elements %d..%d of buffer %s, which holds %d", o.Value, off, off+n, b.Name, r.capacity(b)))
	}
	if r.Kind == Float64 {
		return append([]float64(nil), r.f64[o.Buffer][off:off+n]...)
	}
	out := make([]float64, n)
	base := b.Offset
	switch t.DType {
	case ir.F32:
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(r.arena[base+4*int64(off+i):])))
		}
	case ir.Class:
		for i := range out {
			out[i] = float64(int32(binary.LittleEndian.Uint32(r.arena[base+4*int64(off+i):])))
		}
	case ir.U8:
		for i := range out {
			out[i] = float64(r.arena[base+int64(off+i)])
		}
	case ir.I64:
		for i := range out {
			out[i] = float64(int64(binary.LittleEndian.Uint64(r.arena[base+8*int64(off+i):])))
		}
	case ir.Argmax:
		per := 32 / t.Bits
		mask := uint32(1)<<t.Bits - 1
		for i := range out {
			e := int64(off + i)
			w := binary.LittleEndian.Uint32(r.arena[base+4*(e/per):])
			out[i] = float64(w >> ((e % per) * t.Bits) & mask)
		}
	default:
		panic(fmt.Sprintf("planexec: no storage for %s", t))
	}
	return out
}

// store writes data at element off of a buffer (adding to what is there
// when accumulate).
func (r *Runner) store(buf int, t ir.Type, off int, data []float64, accumulate bool) {
	b := r.Plan.Buffers[buf]
	if off+len(data) > r.capacity(b) {
		panic(fmt.Sprintf("planexec: writing elements %d..%d of buffer %s, which holds %d", off, off+len(data), b.Name, r.capacity(b)))
	}
	if r.Kind == Float64 {
		dst := r.f64[buf][off : off+len(data)]
		for i, x := range data {
			if accumulate {
				dst[i] += x
			} else {
				dst[i] = x
			}
		}
		return
	}
	base := b.Offset
	switch t.DType {
	case ir.F32:
		for i, x := range data {
			at := base + 4*int64(off+i)
			if accumulate {
				x += float64(math.Float32frombits(binary.LittleEndian.Uint32(r.arena[at:])))
			}
			binary.LittleEndian.PutUint32(r.arena[at:], math.Float32bits(float32(x)))
		}
	case ir.Class:
		for i, x := range data {
			binary.LittleEndian.PutUint32(r.arena[base+4*int64(off+i):], uint32(int32(x)))
		}
	case ir.U8:
		for i, x := range data {
			r.arena[base+int64(off+i)] = uint8(x)
		}
	case ir.I64:
		for i, x := range data {
			binary.LittleEndian.PutUint64(r.arena[base+8*int64(off+i):], uint64(int64(x)))
		}
	case ir.Argmax:
		per := 32 / t.Bits
		mask := uint32(1)<<t.Bits - 1
		for i, x := range data {
			e := int64(off + i)
			at := base + 4*(e/per)
			shift := (e % per) * t.Bits
			w := binary.LittleEndian.Uint32(r.arena[at:])
			w = w&^(mask<<shift) | (uint32(x)&mask)<<shift
			binary.LittleEndian.PutUint32(r.arena[at:], w)
		}
	default:
		panic(fmt.Sprintf("planexec: no storage for %s", t))
	}
}

func (r *Runner) poisonBuffer(id int) {
	b := r.Plan.Buffers[id]
	if r.Kind == Float64 {
		fillNaN(r.f64[id])
		return
	}
	poison(r.arena[b.Offset : b.Offset+b.Bytes])
}

func (r *Runner) zero(id int) {
	b := r.Plan.Buffers[id]
	if r.Kind == Float64 {
		clear(r.f64[id])
		return
	}
	clear(r.arena[b.Offset : b.Offset+b.Bytes])
}

// poison fills bytes with 0xFF: a NaN as float32, label -1, argmax all ones.
func poison(b []byte) {
	for i := range b {
		b[i] = 0xFF
	}
}

func fillNaN(x []float64) {
	for i := range x {
		x[i] = math.NaN()
	}
}

func (r *Runner) result(b reference.Batch) (Result, error) {
	g := r.Plan.Graph
	last := r.Plan.Steps[len(r.Plan.Steps)-1].Index
	find := func(v *ir.Value) (plan.Operand, bool) {
		for _, s := range r.Plan.Steps {
			for _, o := range s.Outs {
				if o.Value == v.Name {
					return o, r.Plan.Buffers[o.Buffer].LastStep == last
				}
			}
		}
		return plan.Operand{}, false
	}
	lo, ok := find(g.Loss)
	if !ok {
		return Result{}, fmt.Errorf("planexec: the loss is not kept to the end of the step")
	}
	res := Result{Loss: r.load(lo, g.Loss.Type, 0, 1)[0]}
	lossNode := g.Loss.Def
	if len(lossNode.Outs) >= 3 { // softmax_cross_entropy's, linear_cross_entropy's correct count
		co, ok := find(lossNode.Outs[2])
		if !ok {
			return Result{}, fmt.Errorf("planexec: the correct count is not kept to the end of the step")
		}
		res.Correct = int(math.Round(r.load(co, lossNode.Outs[2].Type, 0, 1)[0]))
		return res, nil
	}
	lg, ok := find(g.Logits)
	if !ok {
		return Result{}, fmt.Errorf("planexec: the logits are not kept to the end of the step")
	}
	logits := r.load(lg, g.Logits.Type, 0, b.N)
	classes := int(g.Logits.Type.Dims[0])
	for i, l := range b.Labels {
		best := 0
		for c := 1; c < classes; c++ {
			if logits[i*classes+c] > logits[i*classes+best] {
				best = c
			}
		}
		if best == int(l) {
			res.Correct++
		}
	}
	return res, nil
}

// Params returns the parameters by name.
func (r *Runner) Params() map[string][]float64 {
	out := map[string][]float64{}
	for _, pr := range append(append([]plan.Param{}, r.Plan.Params...), r.Plan.ModelBuffers...) {
		t := r.vals[pr.Name].Type
		out[pr.Name] = r.load(plan.Operand{Value: pr.Name, Buffer: pr.Buffer}, t, 0, 1)
	}
	return out
}

// State returns the optimizer state by value name.
func (r *Runner) State() map[string][]float64 {
	out := map[string][]float64{}
	for _, pr := range r.Plan.Params {
		for _, sb := range pr.State {
			name := r.Plan.Buffers[sb].Holds[0].Value
			out[name] = r.load(plan.Operand{Value: name, Buffer: sb}, r.vals[name].Type, 0, 1)
		}
	}
	return out
}
