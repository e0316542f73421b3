package ops

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// What the elementwise activations share (each has its own file): an
// activation y = f(x) runs one elementwise kernel, may write over its input
// (the planner decides), and its gradient dx = dy·f'(s) is one more, s
// being the saved tensor the derivative reads — the input or the output,
// whichever PyTorch's backward reads.

// activation builds the Def of an activation and of its gradient op,
// registers both and returns the forward op. save says which tensor the
// gradient reads: saveInput or saveOutput.
func activation(fwd, grad *Def, save int) ir.Op {
	grad.OpInfo.Infer = inferElementwiseGrad
	grad.OpInfo.InPlace = inPlaceAll
	grad.NoGrad = "a gradient op"
	gradOp := New(grad)
	fwd.OpInfo.Infer = inferSameAsInput
	fwd.OpInfo.InPlace = inPlace0
	fwd.Grad = func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		s := n.Ins[0]
		if save == saveOutput {
			s = n.Out()
		}
		return []*ir.Value{b.Emit(gradOp, n, n.Attrs, n.Ins[0], dy, s)}
	}
	return New(fwd)
}

const (
	saveInput = iota
	saveOutput
)
