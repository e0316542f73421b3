package codegen_test

import (
	"fmt"
	"testing"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
)

// Softmax cross-entropy, the standalone updates and dropout, one program
// per batch size.
func TestLossUpdateDropoutKernels(t *testing.T) {
	for bi, batch := range []int64{1, 3, 37} {
		checkNodes(t, batch, 21+uint64(bi), lossUpdateDropoutCases(t, ir.NewGraph("T"), bi))
	}
}

// lossUpdateDropoutCases: variants of each family; variant picks streams
// and steps.
func lossUpdateDropoutCases(t *testing.T, g *ir.Graph, variant int) []nodeCase {
	bi := variant
	var cases []nodeCase
	{
		// softmax cross-entropy: one class, fewer classes than a warp's
		// lanes, more than one warp's worth, 37 rows > the block's 8 warps
		for _, classes := range []int64{1, 3, 10, 33, 130} {
			logits := g.NewValue(fmt.Sprintf("logits%d", classes), ir.F32Batched(classes), ir.RoleActivation, dsl.Pos{})
			label := g.NewValue(fmt.Sprintf("label%d", classes), ir.Type{DType: ir.Class, Batched: true, Classes: classes}, ir.RoleLabel, dsl.Pos{})
			cases = append(cases, nodeCase{n: kernelcases.Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{}, []*ir.Value{logits, label}, "loss", "dlogits", "correct")})
			// label smoothing (PyTorch's label_smoothing): another kernel
			// per ε, the target's weights compiled in. Not for one class:
			// there the loss is x - x = 0 by cancellation, and the check's
			// scale (the loss itself) is 0.
			if classes == 1 {
				continue
			}
			for _, eps := range []float64{0.1, 0.35} {
				cases = append(cases, nodeCase{n: kernelcases.Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{Smoothing: eps}, []*ir.Value{logits, label}, "loss", "dlogits", "correct")})
			}
		}
		// standalone updates of a parameter with an accumulated gradient
		for k, opt := range testOptimizers {
			for si, dims := range [][]int64{{1}, {17, 130}} {
				p := g.AddParam(fmt.Sprintf("u%d_%d", k, si), "weight", ir.Init{}, dsl.Pos{})
				p.Value.Type = ir.F32Fixed(dims...)
				grad := g.NewValue(p.Name+".grad", p.Value.Type, ir.RoleGrad, dsl.Pos{})
				op := ir.OpSGDUpdate
				if opt.Kind != ir.SGD {
					op = ir.OpAdamUpdate
				}
				n := g.NewNode(op, p.Layer, ir.Update, dsl.Pos{}, append([]*ir.Value{p.Value, grad}, kernelcases.NewState(g, p, opt)...), nil, 0)
				n.Attrs.Opt = opt
				_, err := op.Info().Infer(n)
				if err != nil {
					t.Fatal(err)
				}
				cases = append(cases, nodeCase{n: n, o: reference.NodeOptions{Step: int64(k % 2 * 5), Update: true}})
			}
		}
		// dropout and its gradient: masks bit-identical to the reference's
		for di, dims := range [][]int64{{3, 5, 7}, {130}} {
			for _, p := range []float64{0.1, 0.5} {
				x := g.NewValue(fmt.Sprintf("x%d", di), ir.F32Batched(dims...), ir.RoleActivation, dsl.Pos{})
				a := ir.Attrs{P: p, Stream: int64(di*3 + bi)}
				o := reference.NodeOptions{Training: true, Seed: 0x9e3779b97f4a7c15, Step: int64(di + 3*bi)}
				cases = append(cases,
					nodeCase{n: kernelcases.Typed(t, g, ir.OpDropout, "drop", a, []*ir.Value{x}, "y"), o: o},
					nodeCase{n: kernelcases.Typed(t, g, ir.OpDropoutGrad, "drop", a, []*ir.Value{x}, "dx"), o: o})
			}
		}
	}
	return cases
}
