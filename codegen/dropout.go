package codegen

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// dropout(x) and dropout_grad(dy): the training variant, y = x·mask/(1-p)
// with the mask from Philox4x32-10 keyed by the run's seed and counted by
// (element, step, stream), identical to reference.DropoutKeep; the gradient
// multiplies by the same regenerated mask. Seed and step are read from the
// step's scalar block. Evaluation (dropout off) is the identity and runs no kernel;
// choosing it is the trainer's business.

func init() {
	register(ir.OpDropout, dropoutRule("dropout", "forward"))
	register(ir.OpDropoutGrad, dropoutRule("dropout_grad", "gradient"))
}

// dropoutThreshold is the smallest 32-bit word kept: word >= p·2^32 holds
// for an integer word exactly when word >= ceil(p·2^32).
func dropoutThreshold(p float64) uint64 {
	if p <= 0 {
		return 0
	}
	return uint64(math.Ceil(p * 4294967296.0))
}

func dropoutRule(family, what string) rule {
	return func(e *emitter, n *ir.Node) error {
		p := n.Attrs.P
		if p < 0 || p >= 1 {
			return fmt.Errorf("codegen: %s: dropout probability %g outside [0,1)", n.Text(), p)
		}
		if n.Attrs.Stream < 0 || n.Attrs.Stream > math.MaxUint32 {
			return fmt.Errorf("codegen: %s: stream %d does not fit the counter's 32 bits", n.Text(), n.Attrs.Stream)
		}
		out := n.Out()
		elems := out.Type.Elems(e.batch)
		name := fmt.Sprintf("%s_%s_b%d_p%s_stream%d", family, shapeName(out.Type.Dims), e.batch, nameNumber(p), n.Attrs.Stream)
		data := map[string]any{
			"Name": name, "Elems": elems, "Stream": n.Attrs.Stream,
			"Threshold": dropoutThreshold(p), "Scale": cFloat(1 / (1 - p)),
			"Doc": fmt.Sprintf("dropout %s, p=%g, over %d elements (training).", what, p, elems),
		}
		if err := e.kernel("dropout", name, data); err != nil {
			return err
		}
		e.launch(&Launch{Node: n, Kernel: name, Grid: gridFor(elems, elementwiseBlock), Block: [3]uint32{elementwiseBlock, 1, 1},
			// the last argument: the slice's first element in the whole batch
			// (set by GenerateFromPlan inside micro-batch loops)
			Args: []Arg{buf(n.Ins[0]), buf(out), scalarsArg, {Kind: kernelarg.Int, Int: 0}}, FLOPs: n.FLOPs(e.batch), MinBytes: minBytes(n, e.batch)})
		return nil
	}
}
