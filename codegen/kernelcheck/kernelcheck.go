// Package kernelcheck runs generated kernels on a device.Device and
// compares them with the float64 reference.
//
// In:  IR nodes (one at a time, with random inputs) or a whole fused
// training step, and a device (the CPU emulator in tests, the GPU in the
// GPU bundle).
// Out: a Report per kernel launch: the worst error relative to the
// reference tensor's scale, and any element left unwritten.
//
// Every output buffer is poisoned with NaN before the launch, so a kernel
// that skips an element fails.
package kernelcheck

import (
	"encoding/binary"
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/runtime/device"
)

// Tolerance is the largest accepted error of an fp32 kernel, relative to
// the largest magnitude of the reference tensor.
const Tolerance = 1e-4

// Report is the outcome of checking one launch's outputs.
type Report struct {
	Kernel string
	Node   string
	// Worst is the largest |kernel - reference| / max|reference| over every
	// checked tensor; WorstTensor names where.
	Worst       float64
	WorstTensor string
	// ArgmaxMismatches counts argmax elements that differ (ties broken
	// differently by fp32 rounding).
	ArgmaxMismatches int
	Elements         int
}

func (r Report) String() string {
	return fmt.Sprintf("%-60s worst rel err %.2e (%s) over %d elements, argmax mismatches %d", r.Kernel, r.Worst, r.WorstTensor, r.Elements, r.ArgmaxMismatches)
}

// Encode converts reference values (float64 per element) to the bytes the
// kernels use for type t at the given batch.
func Encode(t ir.Type, vals []float64, batch int64) []byte {
	switch t.DType {
	case ir.U8:
		out := make([]byte, len(vals))
		for i, v := range vals {
			out[i] = byte(v)
		}
		return out
	case ir.Class:
		out := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(out[4*i:], uint32(int32(v)))
		}
		return out
	case ir.Argmax:
		words := codegen.PackArgmax(vals, t.Bits)
		out := make([]byte, t.Bytes(batch))
		for i, w := range words {
			binary.LittleEndian.PutUint32(out[4*i:], w)
		}
		return out
	case ir.I64:
		out := make([]byte, 8*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint64(out[8*i:], uint64(int64(v)))
		}
		return out
	}
	out := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
	}
	return out
}

// Decode reverses Encode.
func Decode(t ir.Type, b []byte, batch int64) []float64 {
	n := int(t.Elems(batch))
	switch t.DType {
	case ir.U8:
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(b[i])
		}
		return out
	case ir.Class:
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return out
	case ir.Argmax:
		words := make([]uint32, len(b)/4)
		for i := range words {
			words[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
		return codegen.UnpackArgmax(words, t.Bits, n)
	case ir.I64:
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
		}
		return out
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return out
}

// poison is NaN for floats; all ones for other types.
func poison(t ir.Type, batch int64) []byte {
	b := make([]byte, t.Bytes(batch))
	if t.DType == ir.F32 {
		for i := 0; i+4 <= len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], 0x7fc00000)
		}
		return b
	}
	for i := range b {
		b[i] = 0xff
	}
	return b
}

// compare folds kernel output got against want into r.
func compare(r *Report, name string, t ir.Type, got, want []float64) error {
	r.Elements += len(want)
	if t.DType == ir.Argmax {
		for i := range want {
			if got[i] != want[i] {
				r.ArgmaxMismatches++
			}
		}
		return nil
	}
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	if scale == 0 {
		scale = 1
	}
	for i := range want {
		if math.IsNaN(got[i]) || math.IsInf(got[i], 0) {
			return fmt.Errorf("%s: %s[%d] = %v: element not written (or overflowed); reference %g", r.Kernel, name, i, got[i], want[i])
		}
		if e := math.Abs(got[i]-want[i]) / scale; e > r.Worst {
			r.Worst, r.WorstTensor = e, fmt.Sprintf("%s[%d]: %g vs %g", name, i, got[i], want[i])
		}
	}
	return nil
}

// RandomInputs makes inputs for node n: f32 values in [-1, 1), u8 pixels,
// class labels, argmax window indices; parameters and state small.
func RandomInputs(n *ir.Node, batch int64, rng *rand.Rand) [][]float64 {
	ins := make([][]float64, len(n.Ins))
	for i, v := range n.Ins {
		if j := slices.Index(n.Ins[:i], v); j >= 0 {
			ins[i] = ins[j] // a value listed twice (a tail's parameters, read and updated) is one buffer
			continue
		}
		t := v.Type
		vals := make([]float64, t.Elems(batch))
		for j := range vals {
			switch t.DType {
			case ir.U8:
				vals[j] = float64(rng.IntN(256))
			case ir.Class:
				vals[j] = float64(rng.Int64N(t.Classes))
			case ir.Argmax:
				vals[j] = float64(rng.Int64N(windowElems(n)))
			case ir.I64:
				vals[j] = float64(rng.IntN(1000))
			default:
				vals[j] = float64(float32(2*rng.Float64() - 1))
				if v.Role == ir.RoleOptState || v.Role == ir.RoleBuffer {
					// Adam's second moment, batch norm's running variance: non-negative
					vals[j] = math.Abs(vals[j])
				}
			}
		}
		ins[i] = vals
	}
	return ins
}

func windowElems(n *ir.Node) int64 {
	if p := n.Attrs.Pool; p != nil {
		return p.Kernel[0] * p.Kernel[1]
	}
	return n.Attrs.Kernel[0] * n.Attrs.Kernel[1]
}

// Scalars are the run-time scalars of a launch, which kernels read from
// the step's scalar block (kernelarg.Scalars).
type Scalars struct {
	LR   float32
	Step int64
	Seed uint64
	// Valid is the number of real samples (0: the whole batch).
	Valid int64
}

// Block is s as the step's scalar block holds it, for a batch.
func (s Scalars) Block(batch int64) device.StepScalars {
	valid := s.Valid
	if valid == 0 {
		valid = batch
	}
	return device.StepScalars{Step: s.Step, Seed: s.Seed, Valid: valid, LR: s.LR}
}

// ScalarBlock allocates a scalar block on dev holding s for batch (free it
// with dev.Free).
func ScalarBlock(dev device.Device, s Scalars, batch int64) (device.Ptr, error) {
	p, err := dev.Alloc(device.StepScalarsBytes)
	if err != nil {
		return 0, err
	}
	if err := dev.CopyIn(p, s.Block(batch).Bytes()); err != nil {
		dev.Free(p)
		return 0, err
	}
	return p, nil
}

// scalarArg is the value of a launch argument that is not a buffer;
// block is the scalar block's address.
func scalarArg(a codegen.Arg, block device.Ptr) uint64 {
	switch a.Kind {
	case kernelarg.Int:
		return uint64(a.Int)
	case kernelarg.Float:
		return uint64(math.Float32bits(a.Float))
	}
	return uint64(block) // kernelarg.Scalars
}

// Node checks node n's generated kernels on dev (whose module must hold
// prog's source) against reference.RunNode, with the given inputs.
func Node(dev device.Device, prog *codegen.Program, n *ir.Node, ins [][]float64, s Scalars, o reference.NodeOptions) (Report, error) {
	return NodeSlice(dev, prog, n, ins, s, o, reference.Slice{})
}

// NodeSlice is Node for a node run on samples [sl.First, sl.First+batch) of a batch of sl.Of, as
// in a micro-batch loop: the reference runs on that slice, and the kernels that augment the
// image (which draw by a sample's position in the batch) get sl.First as their first-sample
// argument, the last one, as codegen's placeLaunch sets it.
func NodeSlice(dev device.Device, prog *codegen.Program, n *ir.Node, ins [][]float64, s Scalars, o reference.NodeOptions, sl reference.Slice) (Report, error) {
	batch := prog.Batch
	r := Report{Node: n.Name}
	if n.Attrs.Aug != nil {
		for _, l := range prog.Launches {
			if last := len(l.Args) - 1; l.Node == n && last >= 0 && l.Args[last].Kind == kernelarg.Int {
				defer func(v int64) { l.Args[last].Int = v }(l.Args[last].Int)
				l.Args[last].Int = int64(sl.First)
			}
		}
	}
	// the reference, on copies (updates work in place)
	refIns := make([][]float64, len(ins))
	for i := range ins {
		if j := slices.Index(n.Ins[:i], n.Ins[i]); j >= 0 {
			refIns[i] = refIns[j] // one value listed twice: one copy, which the update changes
			continue
		}
		refIns[i] = append([]float64(nil), ins[i]...)
	}
	want, err := reference.RunNodeSlice(n, refIns, int(batch), o, sl)
	if err != nil {
		return r, err
	}
	updated := map[*ir.Value]bool{}
	if o.Update {
		for _, p := range n.UpdatedParams() {
			updated[p.Value] = true
			for _, s := range p.State {
				updated[s] = true
			}
		}
	}
	if o.Update && o.Training {
		for _, i := range n.MutatedInputs() { // batch norm's running statistics
			updated[n.Ins[i]] = true
		}
	}
	got, err := Launch(dev, prog, n, ins, s)
	if err != nil {
		return r, err
	}
	for _, l := range prog.Launches {
		if l.Node == n {
			r.Kernel = l.Kernel
		}
	}
	for i, v := range n.Outs {
		if err := compare(&r, v.Name, v.Type, got.Outs[i], want[i]); err != nil {
			return r, err
		}
	}
	for i, v := range n.Ins {
		if updated[v] {
			if err := compare(&r, v.Name+" (updated)", v.Type, got.Ins[i], refIns[i]); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// RoundInputs rounds node n's f32 inputs to what a tensor-core kernel of
// precision prec multiplies: TF32 (round to nearest, ties away, as
// cvt.rna.tf32.f32) or BF16 (nearest even). A kernel given inputs already
// representable in its precision rounds them exactly, and the products of
// two TF32 (11-bit significands) or two BF16 (8-bit) values are exact in
// fp32, so the errors left against the float64 reference run on the same
// rounded inputs are those of fp32 accumulation: Tolerance still bounds
// them. (Masks and argmax inputs are unchanged by rounding where it
// matters: a positive float rounds to a positive one.)
func RoundInputs(n *ir.Node, ins [][]float64, prec codegen.Precision) [][]float64 {
	out := make([][]float64, len(ins))
	for i, v := range n.Ins {
		out[i] = ins[i]
		if v.Type.DType != ir.F32 || (prec != codegen.TF32 && prec != codegen.BF16) {
			continue
		}
		out[i] = make([]float64, len(ins[i]))
		for j, x := range ins[i] {
			out[i][j] = RoundTo(prec, x)
		}
	}
	return out
}

// RoundTo rounds x (as a float32) to prec's format and returns the value.
func RoundTo(prec codegen.Precision, x float64) float64 {
	b := math.Float32bits(float32(x))
	switch prec {
	case codegen.TF32:
		if b&0x7fffffff < 0x7f800000 {
			b += 0x1000
		}
		b &= 0xffffe000
	case codegen.BF16:
		if math.IsNaN(x) {
			return x
		}
		rem, hi := b&0xffff, b>>16
		if rem > 0x8000 || rem == 0x8000 && hi&1 == 1 {
			hi++
		}
		b = hi << 16
	}
	return float64(math.Float32frombits(b))
}

// Launched is what Launch read back: every input after the launches (those written in place
// changed) and every output, decoded.
type Launched struct{ Ins, Outs [][]float64 }

// Launch runs node n's launches on dev (whose module holds prog's source) with the given
// inputs, its outputs poisoned with NaN and the scalars s (a padded batch: s.Valid), and reads
// back its inputs and outputs (intermediate buffers of a multi-kernel node are allocated,
// poisoned, as launches name them). Node compares what it reads with the reference; it serves
// alone for checks Node's whole-batch reference does not fit.
func Launch(dev device.Device, prog *codegen.Program, n *ir.Node, ins [][]float64, s Scalars) (Launched, error) {
	return LaunchOver(dev, prog, n, ins, nil, s)
}

// LaunchOver is Launch with n's outputs holding outs before the launches (nil: NaN): what an
// accumulating kernel (a micro-batch loop's step) adds to.
func LaunchOver(dev device.Device, prog *codegen.Program, n *ir.Node, ins, outs [][]float64, s Scalars) (Launched, error) {
	batch := prog.Batch
	var r Launched
	ptrs := map[*ir.Value]device.Ptr{}
	defer func() {
		for _, p := range ptrs {
			dev.Free(p)
		}
	}()
	alloc := func(v *ir.Value, data []byte) error {
		p, err := dev.Alloc(int64(len(data)))
		if err != nil {
			return err
		}
		ptrs[v] = p
		return dev.CopyIn(p, data)
	}
	for i, v := range n.Ins {
		if _, ok := ptrs[v]; !ok {
			if err := alloc(v, Encode(v.Type, ins[i], batch)); err != nil {
				return r, err
			}
		}
	}
	for i, v := range n.Outs {
		data := poison(v.Type, batch)
		if outs != nil {
			data = Encode(v.Type, outs[i], batch)
		}
		if err := alloc(v, data); err != nil {
			return r, err
		}
	}
	block, err := ScalarBlock(dev, s, batch)
	if err != nil {
		return r, err
	}
	defer dev.Free(block)
	for _, l := range prog.Launches {
		if l.Node != n {
			continue
		}
		var params []uint64
		for _, a := range l.Args {
			if a.Kind != kernelarg.Buffer {
				params = append(params, scalarArg(a, block))
				continue
			}
			p, ok := ptrs[a.Value]
			if !ok {
				// an intermediate buffer of a multi-kernel node
				if err := alloc(a.Value, poison(a.Value.Type, batch)); err != nil {
					return r, err
				}
				p = ptrs[a.Value]
			}
			params = append(params, uint64(p))
		}
		if err := dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params); err != nil {
			return r, err
		}
	}
	if err := dev.Sync(); err != nil {
		return r, err
	}
	read := func(v *ir.Value) ([]float64, error) {
		b := make([]byte, v.Type.Bytes(batch))
		if err := dev.CopyOut(b, ptrs[v]); err != nil {
			return nil, err
		}
		return Decode(v.Type, b, batch), nil
	}
	for _, v := range n.Ins {
		got, err := read(v)
		if err != nil {
			return r, err
		}
		r.Ins = append(r.Ins, got)
	}
	for _, v := range n.Outs {
		got, err := read(v)
		if err != nil {
			return r, err
		}
		r.Outs = append(r.Outs, got)
	}
	return r, nil
}

// PartialBatch checks node n's kernels on a padded batch: valid real samples of prog's batch (the
// step's scalar block says so). The outputs must equal the reference's run on the valid samples
// alone within Tolerance of their largest magnitude, the padding's outputs must be zero, and the
// inputs the node writes in place (batch norm's running statistics) must have moved as the
// reference moved them (within Tolerance, absolute: integers exactly) — what PyTorch computes on the
// smaller batch. The first difference is the error.
func PartialBatch(dev device.Device, prog *codegen.Program, n *ir.Node, ins [][]float64, valid int64) error {
	got, err := Launch(dev, prog, n, ins, Scalars{Valid: valid})
	if err != nil {
		return err
	}
	refIns := make([][]float64, len(ins))
	for i, v := range n.Ins {
		refIns[i] = append([]float64(nil), ins[i]...)
		if v.Type.Batched {
			refIns[i] = refIns[i][:valid*v.Type.SampleElems()]
		}
	}
	want, err := reference.RunNode(n, refIns, int(valid), reference.NodeOptions{Training: true, Update: true})
	if err != nil {
		return err
	}
	for i, v := range n.Outs {
		scale := 1e-30
		for _, w := range want[i] {
			scale = math.Max(scale, math.Abs(w))
		}
		for j, w := range want[i] {
			if g := got.Outs[i][j]; !(math.Abs(g-w)/scale <= Tolerance) {
				return fmt.Errorf("%s[%d] = %g, want %g", v.Name, j, g, w)
			}
		}
		for j := len(want[i]); j < len(got.Outs[i]); j++ {
			if got.Outs[i][j] != 0 {
				return fmt.Errorf("%s[%d] = %g in the padding, want 0", v.Name, j, got.Outs[i][j])
			}
		}
	}
	for _, k := range n.MutatedInputs() {
		v := n.Ins[k]
		for j, w := range refIns[k] {
			g := got.Ins[k][j]
			if !(math.Abs(g-w) <= Tolerance) { // integers (the batch count) differ by 1 or more

				return fmt.Errorf("%s[%d] = %g after the launch, want %g", v.Name, j, g, w)
			}
		}
	}
	return nil
}
