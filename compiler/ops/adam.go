package ops

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// adam and adamw: torch.optim.Adam (L2 weight decay added to the
// gradient) and AdamW (decoupled decay p *= 1 - lr·wd), without amsgrad:
// m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²; p -= lr/(1-β1^t) · m /
// (sqrt(v)/sqrt(1-β2^t) + eps), t = step + 1. Both update with adam_update.

var _ = Register(ir.OpAdamUpdate, updateDef("adam_update", "one parameter's Adam or AdamW step, in place"))

var adamArgs = []ArgSpec{
	{Name: "lr", Kind: ArgFloat, Positive: true, Default: "0.001", Doc: "learning rate"},
	{Name: "betas", Kind: ArgFloatPair, Min: 0, Max: 1, Default: "[0.9, 0.999]", Doc: "moment decay rates"},
	{Name: "eps", Kind: ArgFloat, Min: 0, Default: "1e-8", Doc: "added to the denominator"},
}

func adamInfo(name string) ir.OptimizerInfo {
	return ir.OptimizerInfo{
		Name:     name,
		States:   func(*ir.Optimizer) []string { return []string{"exp_avg", "exp_avg_sq"} },
		UpdateOp: ir.OpAdamUpdate,
		FLOPs:    func(*ir.Optimizer) int64 { return 12 },
		Text: func(o *ir.Optimizer) string {
			return fmt.Sprintf("%s(lr=%g,betas=[%g,%g],eps=%g,weight_decay=%g)", name, o.LR, o.Beta1, o.Beta2, o.Eps, o.WeightDecay)
		},
	}
}

func makeAdam(kind ir.OptimizerKind, wd float64) func(a Args) (ir.Optimizer, error) {
	return func(a Args) (ir.Optimizer, error) {
		o := ir.Optimizer{Kind: kind, LR: a.Float("lr", 0.001), WeightDecay: a.Float("weight_decay", wd),
			Beta1: 0.9, Beta2: 0.999, Eps: a.Float("eps", 1e-8)}
		if b := a["betas"]; b != nil {
			o.Beta1, o.Beta2 = Number(b.List[0]), Number(b.List[1])
		}
		return o, nil
	}
}

// adamRef is one Adam (decoupled: AdamW) step of p.
func adamRef(decoupled bool) func(o *ir.Optimizer, step int64, p, grad []float64, state [][]float64) {
	return func(o *ir.Optimizer, step int64, p, grad []float64, state [][]float64) {
		m, v := state[0], state[1]
		t := float64(step + 1)
		bc1 := 1 - math.Pow(o.Beta1, t)
		bc2 := 1 - math.Pow(o.Beta2, t)
		for i := range p {
			g := grad[i]
			if decoupled {
				p[i] *= 1 - o.LR*o.WeightDecay
			} else {
				g += o.WeightDecay * p[i]
			}
			m[i] = o.Beta1*m[i] + (1-o.Beta1)*g
			v[i] = o.Beta2*v[i] + (1-o.Beta2)*g*g
			denom := math.Sqrt(v[i])/math.Sqrt(bc2) + o.Eps
			p[i] -= o.LR / bc1 * m[i] / denom
		}
	}
}

func adamKernelName(name string) func(o *ir.Optimizer, num func(float64) string) []string {
	return func(o *ir.Optimizer, num func(float64) string) []string {
		return []string{name, "b" + num(o.Beta1) + "_" + num(o.Beta2), "eps" + num(o.Eps)}
	}
}

func adamKernelDoc(name string) func(o *ir.Optimizer) string {
	return func(o *ir.Optimizer) string {
		return fmt.Sprintf("%s(betas=[%g,%g], eps=%g, weight_decay=%g)", name, o.Beta1, o.Beta2, o.Eps, o.WeightDecay)
	}
}

var _ = RegisterOptimizer(ir.Adam, &Optimizer{
	OptimizerInfo: adamInfo("adam"),
	Order:         20,
	Args: append(adamArgs[:len(adamArgs):len(adamArgs)],
		ArgSpec{Name: "weight_decay", Kind: ArgFloat, Min: 0, Default: "0", Doc: "L2 penalty, added to the gradient"}),
	Make:       makeAdam(ir.Adam, 0),
	Ref:        adamRef(false),
	Template:   "adam",
	KernelName: adamKernelName("adam"),
	KernelDoc:  adamKernelDoc("adam"),
	Doc:        "Adam",
	PyTorch:    "torch.optim.Adam",
})

var _ = RegisterOptimizer(ir.AdamW, &Optimizer{
	OptimizerInfo: adamInfo("adamw"),
	Order:         30,
	Args: append(adamArgs[:len(adamArgs):len(adamArgs)],
		ArgSpec{Name: "weight_decay", Kind: ArgFloat, Min: 0, Default: "0.01", Doc: "decoupled weight decay: `p *= 1 - lr*wd`"}),
	Make:       makeAdam(ir.AdamW, 0.01),
	Ref:        adamRef(true),
	Template:   "adamw",
	KernelName: adamKernelName("adamw"),
	KernelDoc:  adamKernelDoc("adamw"),
	Doc:        "Adam with decoupled weight decay",
	PyTorch:    "torch.optim.AdamW",
})
