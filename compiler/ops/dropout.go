package ops

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// dropout: inverted dropout, nn.Dropout — in training an element is kept
// (scaled by 1/(1-p)) when the first word of Philox4x32-10 keyed by the
// run's seed and counted by (element, step, stream) is at least p·2^32
// (DropoutKeep); in evaluation it is the identity. The gradient multiplies
// by the same mask, regenerated, so no mask is ever stored and a
// recomputed forward draws the same one.

var _ = Register(ir.OpDropout, &Def{
	OpInfo: ir.OpInfo{
		Name: "dropout", Attrs: []ir.AttrSpec{ir.AttrP, ir.AttrStream}, Infer: inferSameAsInput, FLOPs: flopsPerOutput(1),
		Random: true, EvalIdentity: true, InPlace: inPlace0,
	},
	Doc: "inverted dropout",
	DSL: &DSL{
		Name: "dropout", Order: 70, Tensors: 1,
		Args:     []ArgSpec{{Name: "p", Kind: ArgFloat, Min: 0, Max: 1, Default: "0.5", Doc: "probability of zeroing an element"}},
		Attrs:    func(a Args) (ir.Attrs, error) { return ir.Attrs{P: a.Float("p", 0.5)}, nil },
		Shape:    "same shape; kept elements scaled by 1/(1-p); the identity when evaluating",
		PyTorch:  "nn.Dropout",
		Examples: []string{"dropout(x, p=0.4)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		// the same counter-based mask as the forward pass, regenerated
		return []*ir.Value{b.Emit(ir.OpDropoutGrad, n, n.Attrs, n.Ins[0], dy)}
	},
	Ref:    refDropout,
	Kernel: Kernel{Custom: "dropout", FirstSample: FirstElement},
	// evaluation mode: dropout is the identity
	ONNX: &ONNX{Op: "Identity", Inputs: 1},
})

var _ = Register(ir.OpDropoutGrad, &Def{
	OpInfo: ir.OpInfo{
		Name: "dropout_grad", Attrs: []ir.AttrSpec{ir.AttrP, ir.AttrStream}, Infer: inferSameAsInput, FLOPs: flopsPerOutput(1),
		InPlace: inPlace0,
	},
	Doc:    "the gradient of dropout: dy times the forward pass's mask, regenerated",
	NoGrad: "a gradient op",
	Ref:    refDropout,
	Kernel: Kernel{Custom: "dropout", FirstSample: FirstElement},
})

// refDropout serves forward and gradient alike: both multiply by the same
// regenerated mask, scaled by 1/(1-p). Off when not training.
func refDropout(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	y := append([]float64(nil), ins[0]...)
	if !env.Training {
		return [][]float64{y}
	}
	p := n.Attrs.P
	scale := 1 / (1 - p)
	// masks are keyed by the element's index in the whole batch, so a
	// micro-batch draws the same mask as the full batch did
	first := int64(env.FirstSample) * n.Ins[0].Type.SampleElems()
	for i := range y {
		if DropoutKeep(env.Seed, n.Attrs.Stream, env.Step, first+int64(i), p) {
			y[i] *= scale
		} else {
			y[i] = 0
		}
	}
	return [][]float64{y}
}
