package ops

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// clip_grad_norm(grads...) -> coef: the train block's clip_grad_norm, as
// torch.nn.utils.clip_grad_norm_(params, max_norm): the global L2 norm of
// every parameter's gradient, total = sqrt(sum of squares), and the
// coefficient min(1, max_norm/(total + 1e-6)) that every update multiplies
// its gradient by (a NaN norm gives a NaN coefficient, as torch.clamp). It
// needs every gradient before any update, so with clipping no update is
// fused into a weight-gradient kernel (blockGrad): the gradients go to
// buffers, this node reads them all in the update phase (UpdateInput), and
// each update reads its one-element output from device memory, so the
// step's launches never change (CUDA graphs replay it as they are).

// ClipEps is what torch adds to the norm before dividing max_norm by it.
const ClipEps = 1e-6

var attrMaxNorm = ir.AttrSpec{Name: "max_norm", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.MaxNorm) }}

// ClipGradNormOp is the op's identity.
var ClipGradNormOp = New(&Def{
	OpInfo: ir.OpInfo{Name: "clip_grad_norm", Attrs: []ir.AttrSpec{attrMaxNorm}, Infer: inferClipGradNorm,
		FLOPs: flopsClipGradNorm, UpdateInput: true},
	Doc:    "the gradient clipping coefficient min(1, max_norm/(‖all gradients‖₂ + 1e-6))",
	NoGrad: "it scales gradients for the optimizer",
	Ref:    refClipGradNorm,
	Kernel: Kernel{Custom: "clip_grad_norm"},
})

func inferClipGradNorm(n *ir.Node) ([]ir.Type, error) {
	if len(n.Ins) == 0 {
		return nil, fmt.Errorf("clip_grad_norm reads no gradient")
	}
	if !(n.Attrs.MaxNorm > 0) || math.IsInf(n.Attrs.MaxNorm, 1) {
		return nil, fmt.Errorf("clip_grad_norm: max_norm %g is not a positive number", n.Attrs.MaxNorm)
	}
	for _, v := range n.Ins {
		if v.Role != ir.RoleGrad || v.Type.DType != ir.F32 || v.Type.Batched {
			return nil, fmt.Errorf("clip_grad_norm reads %s, which is not a parameter's gradient", v.Name)
		}
	}
	return []ir.Type{ClipCoefType}, nil
}

// ClipCoefType is the coefficient's type: one float.
var ClipCoefType = ir.F32Fixed(1)

// flopsClipGradNorm: a multiply and an add per gradient element, then the
// square root, the division and the clamp.
func flopsClipGradNorm(n *ir.Node) int64 {
	var f int64
	for _, v := range n.Ins {
		f = ir.AddSat(f, ir.MulSat(2, v.Type.SampleElems()))
	}
	return ir.AddSat(f, 4)
}

// ClipCoefficient is the coefficient from the sum of the gradients'
// squares, in float64: min(1, maxNorm/(sqrt(sumSq) + 1e-6)), NaN staying
// NaN (torch.clamp's max).
func ClipCoefficient(maxNorm, sumSq float64) float64 {
	c := maxNorm / (math.Sqrt(sumSq) + ClipEps)
	if c > 1 {
		return 1
	}
	return c
}

func refClipGradNorm(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	var sum float64
	for _, g := range ins {
		for _, x := range g {
			sum += x * x
		}
	}
	return [][]float64{{ClipCoefficient(n.Attrs.MaxNorm, sum)}}
}

// ClipGradients appends g's clip_grad_norm node over the gradients (in
// the parameters' order) when the graph clips (ir.Graph.ClipGradNorm),
// positioned at the train block's setting, and returns the coefficient
// every update then reads; nil without clipping.
func ClipGradients(g *ir.Graph, grads []*ir.Value, pos dsl.Pos) *ir.Value {
	if g.ClipGradNorm <= 0 || len(grads) == 0 {
		return nil
	}
	n := g.NewNode(ClipGradNormOp, "clip_grad_norm", ir.Update, pos, grads, []string{"clip_coef"}, ir.RoleActivation)
	n.Attrs.MaxNorm = g.ClipGradNorm
	n.Out().Type = ClipCoefType
	g.Append(n)
	return n.Out()
}

// UpdateClip is an update node's clipping coefficient input (the value
// after its state), or nil when its gradient is not clipped.
func UpdateClip(n *ir.Node) *ir.Value {
	if n.Attrs.Opt == nil {
		return nil
	}
	if i := 2 + len(n.Attrs.Opt.StateNames()); len(n.Ins) == i+1 {
		return n.Ins[i]
	}
	return nil
}
