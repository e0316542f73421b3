package cpu

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Gradient clipping: clip_grad_norm's norm as cnnc_cpu.h's ClipNormPartial (a task per
// clipChunk elements of the gradients laid end to end, sums of squares in double) and
// ClipNormCoef (the partials in task order, the coefficient), so the result does not depend on
// the thread count.

// clipChunk is the gradient elements of one partial sum.
const clipChunk = 16384

func init() {
	register(ops.ClipGradNormOp, clipGradNorm)
	registerScratch(ops.ClipGradNormOp, func(n *ir.Node, _ int64) (int64, error) {
		return codegen.ScratchAligned(clipPartials(n).Bytes(1)), nil
	})
}

// clipSizes lists the gradients' element counts and their total.
func clipSizes(n *ir.Node) ([]int64, int64) {
	var sizes []int64
	var total int64
	for _, v := range n.Ins {
		sizes = append(sizes, v.Type.SampleElems())
		total += v.Type.SampleElems()
	}
	return sizes, total
}

// clipPartials holds a double per task (two f32 words each).
func clipPartials(n *ir.Node) ir.Type {
	_, total := clipSizes(n)
	return ir.F32Fixed(2 * max(cdiv(total, clipChunk), 1))
}

func clipGradNorm(e codegen.Emitter, n *ir.Node) error {
	if e.Accumulate() {
		return fmt.Errorf("%s: clip_grad_norm reads whole gradients and cannot run in a micro-batch loop", n.Text())
	}
	sizes, total := clipSizes(n)
	tasks := max(cdiv(total, clipChunk), 1)
	partials := e.Scratch(n, "norm_partials", clipPartials(n))
	var args []codegen.Arg
	for _, v := range n.Ins {
		args = append(args, buf(v))
	}
	args = append(args, buf(partials))
	name := emit(e, kernelSpec{family: "clip_norm_partial", shape: fmt.Sprintf("n%d_g%d", total, len(sizes)),
		doc:     fmt.Sprintf("sums of squares of %d gradient elements (%d gradients), in double, one per %d elements.", total, len(sizes), clipChunk),
		structs: []structSpec{{"g", []def{{"NG", int64(len(sizes))}, {"SIZES", sizes}, {"TOTAL", total}, {"CHUNK", int64(clipChunk)}}}},
		impl:    "ClipNormPartial<%s>", nparams: len(args)})
	if err := launch(e, n, name, tasks, args, 2*total, 4*total+8*tasks); err != nil {
		return err
	}
	coef := emit(e, kernelSpec{family: "clip_norm_coef", shape: fmt.Sprintf("p%d", tasks),
		doc:     fmt.Sprintf("adds %d partial sums in order; the clipping coefficient min(1, %g/(norm + 1e-6)).", tasks, n.Attrs.MaxNorm),
		structs: []structSpec{{"g", []def{{"PARTIALS", tasks}, {"MAX_NORM", n.Attrs.MaxNorm}}}},
		impl:    "ClipNormCoef<%s>", nparams: 2})
	return launch(e, n, coef, 1, []codegen.Arg{buf(partials), buf(n.Out())}, tasks+4, 8*tasks+4)
}
