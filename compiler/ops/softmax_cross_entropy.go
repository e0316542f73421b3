package ops

import (
	"github.com/cnnc/cnnc/compiler/ir"
)

// softmax_cross_entropy(logits, label) -> loss, dlogits, correct: the fuse
// pass's loss kernel, which also writes the logits' gradient (its gradient
// rule hands that output on) and the number of correct predictions. One
// single-block kernel (codegen/loss.go); a padded last batch's rows count
// for nothing.

var _ = Register(ir.OpSoftmaxCrossEntropy, &Def{
	OpInfo: ir.OpInfo{Name: "softmax_cross_entropy", Attrs: []ir.AttrSpec{attrSmoothing}, Infer: inferSoftmaxCE, FLOPs: flopsCrossEntropy, Loss: true},
	Doc:    "the loss, the logits' gradient and the correct count, in one kernel",
	Grad: func(_ GradBuilder, n *ir.Node, _ *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{n.Outs[1], nil}
	},
	Ref: func(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
		loss := refCrossEntropy(env, n, ins)[0]
		grad := refCrossEntropyGrad(env, n, ins)[0]
		classes := int(n.Ins[0].Type.Dims[0])
		labels := make([]int32, env.Batch)
		for i := range labels {
			labels[i] = int32(ins[1][i])
		}
		correct := CountCorrect(ins[0], labels, classes)
		return [][]float64{loss, grad, {float64(correct)}}
	},
	Kernel: Kernel{Custom: "softmax_cross_entropy", FirstSample: FirstRow},
})

func inferSoftmaxCE(n *ir.Node) ([]ir.Type, error) {
	if err := checkLogitsLabel(n); err != nil {
		return nil, err
	}
	return []ir.Type{ir.F32Fixed(), in(n, 0), ir.F32Fixed()}, nil
}
