package codegen

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"

	"github.com/cnnc/cnnc/compiler/ir"
)

// softmax_cross_entropy(logits, label) -> loss, dlogits, correct: one
// single-block kernel, deterministic (fixed-order reductions, no atomics).
// The work is B·classes elements, tiny next to the layers around it.

const lossThreads = 256 // 8 warps; the template's reduction assumes it

func init() {
	register(ir.OpSoftmaxCrossEntropy, softmaxCrossEntropyRule)
}

func softmaxCrossEntropyRule(e *emitter, n *ir.Node) error {
	classes := n.Ins[0].Type.Dims[0]
	name := fmt.Sprintf("softmax_cross_entropy_b%d_c%d", e.batch, classes)
	eps := n.Attrs.Smoothing
	if eps != 0 {
		name += "_ls" + nameNumber(eps)
	}
	if e.accumulate {
		name += "_acc" // a micro-batch of a loop: adds its share of the batch's loss
	}
	data := map[string]any{"Name": name, "Batch": e.batch, "Classes": classes, "Idx": indexType(e.batch * classes), "Accumulate": e.accumulate}
	if eps != 0 {
		// the smoothed target's weights, rounded once to float32 here
		data["Smoothing"] = eps
		data["OnTarget"] = cFloat(1 - eps)
		data["OffTarget"] = cFloat(eps / float64(classes))
	}
	if e.batch > 1<<31-1 {
		return fmt.Errorf("codegen: %s: batch %d is too large", n.Text(), e.batch)
	}
	if err := e.kernel("softmax_cross_entropy", name, data); err != nil {
		return err
	}
	args := []Arg{buf(n.Ins[0]), buf(n.Ins[1])}
	for _, v := range n.Outs {
		args = append(args, buf(v))
	}
	// the step's scalars (the rows that are real: a padded last batch
	// contributes nothing); and the micro-batch's first row (set by
	// GenerateFromPlan inside loops)
	args = append(args, scalarsArg, Arg{Kind: kernelarg.Int, Int: 0})
	e.launch(&Launch{Node: n, Kernel: name, Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{lossThreads, 1, 1}, SharedBytes: 16 * 4,
		Args: args, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
	return nil
}
