package ops

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// What the elementwise activations share (each has its own file): an
// activation y = f(x) runs one elementwise kernel, may write over its input
// (the planner decides), and its gradient dx = dy·f'(s) is one more, s
// being the saved tensor the derivative reads — the input or the output,
// whichever PyTorch's backward reads. The fuse pass folds one into a
// batch norm or a linear layer before it (batchnorm.go, linear_block.go;
// Attrs.Act): the fused kernels reach
// the activation's f and f' through PointwiseOf — its reference kernels
// here, its kernel family's formulas on the targets — and never restate
// them.

// Pointwise is an activation other than ReLU as the fused kernels see it.
type Pointwise struct {
	Fwd, Grad *Def // the activation's op and its gradient op
	// SaveOutput: the gradient reads f(x), not x (sigmoid, tanh).
	SaveOutput bool
}

var pointwise = map[ir.Op]*Pointwise{}

// PointwiseOf is the activation op's Pointwise, or nil for an op that is
// not one.
func PointwiseOf(op ir.Op) *Pointwise { return pointwise[op] }

// F is the reference's y = f(x); n carries the activation's attributes
// (Alpha).
func (p *Pointwise) F(env *RefEnv, n *ir.Node, x []float64) []float64 {
	return p.Fwd.Ref(env, n, [][]float64{x})[0]
}

// DX is the reference's dx = dy·f'(x) from the activation's input x,
// through the saved tensor its gradient reads.
func (p *Pointwise) DX(env *RefEnv, n *ir.Node, dy, x []float64) []float64 {
	s := x
	if p.SaveOutput {
		s = p.F(env, n, x)
	}
	return p.Grad.Ref(env, n, [][]float64{dy, s})[0]
}

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
	op := New(fwd)
	pointwise[op] = &Pointwise{Fwd: fwd, Grad: grad, SaveOutput: save == saveOutput}
	return op
}

const (
	saveInput = iota
	saveOutput
)
