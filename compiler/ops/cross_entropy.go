package ops

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// cross_entropy: the model's loss, F.cross_entropy with label_smoothing ε
// — the target is q = (1-ε)·onehot(label) + ε/classes, a row's loss
// -Σ q·log softmax = logsumexp(logits) - (1-ε)·logits[label] -
// ε·mean(logits), averaged over the batch; its gradient is (softmax - q) /
// batch. The fuse pass turns it into softmax_cross_entropy, one kernel
// that also writes the logits' gradient and the correct count.

// attrSmoothing is printed only when it is not 0, so that the text of a
// model without label smoothing is what it always was.
var attrSmoothing = ir.AttrSpec{Name: "label_smoothing", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Smoothing) },
	Default: func(a *ir.Attrs) bool { return a.Smoothing == 0 }}

var _ = Register(ir.OpCrossEntropy, &Def{
	OpInfo: ir.OpInfo{Name: "cross_entropy", Attrs: []ir.AttrSpec{attrSmoothing}, Infer: inferCrossEntropy, FLOPs: flopsCrossEntropy, Loss: true},
	Doc:    "softmax cross-entropy of logits against class labels, mean over the batch",
	DSL: &DSL{
		Name: "cross_entropy", Order: 1000, Tensors: 2, TensorNames: []string{"logits", "label"},
		Args: []ArgSpec{{Name: "label_smoothing", Kind: ArgFloat, Min: 0, Max: 1, Default: "0",
			Doc: "ε: the target is (1-ε)·onehot(label) + ε/classes, PyTorch's label_smoothing"}},
		Attrs:    func(a Args) (ir.Attrs, error) { return ir.Attrs{Smoothing: a.Float("label_smoothing", 0)}, nil },
		Shape:    "`[N]` logits and `class[N]` labels -> scalar: mean over the batch of `logsumexp(logits) - logits[label]` (with smoothing ε: `- ε·(mean(logits) - logits[label])`)",
		PyTorch:  "F.cross_entropy",
		Examples: []string{"cross_entropy(x, label)", "cross_entropy(x, label, label_smoothing=0.2)"},
	},
	Grad: func(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
		return []*ir.Value{b.Emit(ir.OpCrossEntropyGrad, n, ir.Attrs{Smoothing: n.Attrs.Smoothing}, n.Ins[0], n.Ins[0], n.Ins[1]), nil}
	},
	Ref:    refCrossEntropy,
	Kernel: Kernel{ReplacedBy: "softmax_cross_entropy"},
	NoONNX: "the loss is not exported: its logits are the exported model's output",
})

var _ = Register(ir.OpCrossEntropyGrad, &Def{
	OpInfo: ir.OpInfo{Name: "cross_entropy_grad", Attrs: []ir.AttrSpec{attrSmoothing}, Infer: inferCrossEntropyGrad, FLOPs: flopsCrossEntropy},
	Doc:    "the gradient of the loss with respect to the logits",
	NoGrad: "a gradient op",
	Ref:    refCrossEntropyGrad,
	Kernel: Kernel{ReplacedBy: "softmax_cross_entropy"},
})

func inferCrossEntropy(n *ir.Node) ([]ir.Type, error) {
	if err := checkLogitsLabel(n); err != nil {
		return nil, err
	}
	return []ir.Type{ir.F32Fixed()}, nil
}

func checkLogitsLabel(n *ir.Node) error {
	logits, label := in(n, 0), in(n, 1)
	if label.DType != ir.Class || !label.Batched || len(label.Dims) != 0 {
		return fmt.Errorf("cross_entropy's second argument must be class labels (class[N]), but %s is %s", n.Ins[1].Name, label)
	}
	if err := needRank(n, 0, logits, 1, "[B,classes] logits"); err != nil {
		return err
	}
	if logits.Dims[0] != label.Classes {
		return fmt.Errorf("cross_entropy: %s has %d outputs but %s has %d classes", n.Ins[0].Name, logits.Dims[0], n.Ins[1].Name, label.Classes)
	}
	return nil
}

func inferCrossEntropyGrad(n *ir.Node) ([]ir.Type, error) {
	if err := checkLogitsLabel(n); err != nil {
		return nil, err
	}
	return []ir.Type{in(n, 0)}, nil
}

func flopsCrossEntropy(n *ir.Node) int64 {
	// max, exp, sum, log per logit
	return ir.MulSat(4, n.Ins[0].Type.SampleElems())
}

// logSumExp returns the row's log-sum-exp, computed stably.
func logSumExp(row []float64) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, v)
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(v - m)
	}
	return m + math.Log(s)
}

// refCrossEntropy: a row's loss is lse - (1-ε)·x_label - ε·mean(x) (ε = 0:
// the plain lse - x_label).
func refCrossEntropy(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	logits, labels := ins[0], ins[1]
	c := int(n.Ins[0].Type.Dims[0])
	eps := n.Attrs.Smoothing
	loss := 0.0
	for b := 0; b < env.Batch; b++ {
		row := logits[b*c : (b+1)*c]
		l := logSumExp(row) - (1-eps)*row[int(labels[b])]
		if eps != 0 {
			sum := 0.0
			for _, v := range row {
				sum += v
			}
			l -= eps * sum / float64(c)
		}
		loss += l
	}
	return [][]float64{{loss / env.LossBatch()}}
}

// refCrossEntropyGrad is the loss's gradient: (softmax - q) / batch.
func refCrossEntropyGrad(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	logits, labels := ins[0], ins[1]
	c := int(n.Ins[0].Type.Dims[0])
	eps := n.Attrs.Smoothing
	d := make([]float64, len(logits))
	inv := 1 / env.LossBatch()
	for b := 0; b < env.Batch; b++ {
		row := logits[b*c : (b+1)*c]
		lse := logSumExp(row)
		for j := range row {
			d[b*c+j] = (math.Exp(row[j]-lse) - eps/float64(c)) * inv
		}
		d[b*c+int(labels[b])] -= (1 - eps) * inv
	}
	return [][]float64{d}
}

// CountCorrect counts the rows of logits whose first maximum is the label.
func CountCorrect(logits []float64, labels []int32, classes int) int {
	correct := 0
	for i, l := range labels {
		row := logits[i*classes : (i+1)*classes]
		best := 0
		for c := range row {
			if row[c] > row[best] {
				best = c
			}
		}
		if best == int(l) {
			correct++
		}
	}
	return correct
}
