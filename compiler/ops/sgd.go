package ops

import (
	"errors"
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// sgd: torch.optim.SGD without dampening — g += wd·p; buf = m·buf + g (buf
// = g on the first step); g = g + m·buf with Nesterov, else buf; p -= lr·g.
// Its update op is sgd_update.

var _ = Register(ir.OpSGDUpdate, updateDef("sgd_update", "one parameter's SGD step, in place"))

var _ = RegisterOptimizer(ir.SGD, &Optimizer{
	OptimizerInfo: ir.OptimizerInfo{
		Name: "sgd",
		States: func(o *ir.Optimizer) []string {
			if o.Momentum != 0 {
				return []string{"momentum_buffer"}
			}
			return nil
		},
		UpdateOp: ir.OpSGDUpdate,
		FLOPs:    func(*ir.Optimizer) int64 { return 4 },
		Text: func(o *ir.Optimizer) string {
			return fmt.Sprintf("sgd(lr=%g,momentum=%g,nesterov=%t,weight_decay=%g)", o.LR, o.Momentum, o.Nesterov, o.WeightDecay)
		},
	},
	Order: 10,
	Args: []ArgSpec{
		{Name: "lr", Kind: ArgFloat, Positive: true, Default: "0.01", Doc: "learning rate"},
		{Name: "momentum", Kind: ArgFloat, Min: 0, Default: "0", Doc: "momentum factor"},
		{Name: "nesterov", Kind: ArgBool, Default: "false", Note: "needs momentum > 0", Doc: "Nesterov momentum"},
		{Name: "weight_decay", Kind: ArgFloat, Min: 0, Default: "0", Doc: "L2 penalty, added to the gradient"},
	},
	Make: func(a Args) (ir.Optimizer, error) {
		o := ir.Optimizer{Kind: ir.SGD, LR: a.Float("lr", 0.01), WeightDecay: a.Float("weight_decay", 0),
			Momentum: a.Float("momentum", 0), Nesterov: a.Bool("nesterov", false)}
		if o.Nesterov && o.Momentum == 0 {
			return o, errors.New("nesterov=true needs a momentum above 0")
		}
		return o, nil
	},
	Ref: func(o *ir.Optimizer, step int64, p, grad []float64, state [][]float64) {
		for i := range p {
			g := grad[i] + o.WeightDecay*p[i]
			if o.Momentum != 0 {
				buf := state[0]
				if step == 0 {
					buf[i] = g
				} else {
					buf[i] = o.Momentum*buf[i] + g
				}
				if o.Nesterov {
					g += o.Momentum * buf[i]
				} else {
					g = buf[i]
				}
			}
			p[i] -= o.LR * g
		}
	},
	Template: "sgd",
	KernelName: func(o *ir.Optimizer, num func(float64) string) []string {
		parts := []string{"sgd"}
		if o.Momentum != 0 {
			parts = append(parts, "mom"+num(o.Momentum))
			if o.Nesterov {
				parts = append(parts, "nesterov")
			}
		}
		return parts
	},
	KernelDoc: func(o *ir.Optimizer) string {
		return fmt.Sprintf("sgd(momentum=%g, nesterov=%t, weight_decay=%g)", o.Momentum, o.Nesterov, o.WeightDecay)
	},
	Doc:     "stochastic gradient descent with momentum",
	PyTorch: "torch.optim.SGD",
})
