package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// linear_cross_entropy: the classifier tail — the last linear layer (no
// ReLU) and the softmax cross-entropy that reads it, fused with the whole
// of their backward into one single-block kernel:
//
//	linear_cross_entropy(x, w, b?, label, [w, b?, state...]) -> loss, logits, correct, dX?, [dW, dB?]
//
// It computes the logits (written too: evaluation, the reference's correct
// count and the planner's checks read them), the loss and the correct
// count exactly as softmax_cross_entropy does (valid rows, label
// smoothing, accumulation inside a micro-batch loop), then from the logits'
// gradient (kept in shared memory, never in device memory) the input
// gradient dX = dlogits·W (InputGrad: x needs a gradient; MaskOut: times
// x > 0, the mask of the ReLU that produced x) and the weight
// and bias gradients, which with Attrs.Opt go straight into the
// optimizer update of W and b (the parameters listed again after the label,
// as linear_block_grad_weight lists them, so that the planner's
// splitUpdate can turn the node into one writing dW, dB? instead).
//
// One block does everything, so W is read (into shared memory) before it
// is updated and every reduction runs in a fixed order: deterministic.
// That bounds the shapes (MaxLinearCrossEntropyShared), and the fuse pass
// makes it only where one block is faster (MaxLinearCrossEntropyMACs):
// the tail is for a small classifier (SimpleCNN's fc2: 10x128), where the
// four launches it replaces are each latency, not work.
// Kernels: codegen/linear_ce.go (templates/linear_ce.cu.tmpl) and the CPU
// target's linear.go (cnnc_cpu.h's LinearCE); the reference composes the
// unfused ops' references.

// MaxLinearCrossEntropyShared is the most floats a tail's block keeps in
// shared memory, within the 48 KiB of static shared memory every CUDA GPU
// gives a block without opting in: W (out rows of in+1 floats, the +1
// against bank conflicts), the logits and then their gradient (B·out), 16
// floats of reductions, and as many rows of x (in+1 floats each) as the
// rest holds, at least one (LinearCrossEntropyXRows).
const MaxLinearCrossEntropyShared = 48 << 10 / 4

// MaxLinearCrossEntropyMACs bounds the multiply-adds of the tail's three
// products (3·B·out·in) for which the fuse pass gives one block the whole
// tail: 2^18, a thousand per thread. Past it the separate many-block
// kernels win: on the performance model (PREDICTIONS, H200, tf32)
// SimpleCNN's fc2 at batch 32 (123k) takes 8.3 µs in one block against
// 14 µs for the four launches it replaces, at batch 256 (983k) 56.5 µs,
// a step 34 µs slower than unfused.
const MaxLinearCrossEntropyMACs = 1 << 18

// LinearCrossEntropyXRows is how many rows of x a tail's block stages in
// shared memory at a time (0: the shapes do not fit one block).
func LinearCrossEntropyXRows(batch, in, out int64) int64 {
	if batch <= 0 || in <= 0 || out <= 0 || in >= MaxLinearCrossEntropyShared || out >= MaxLinearCrossEntropyShared ||
		batch >= MaxLinearCrossEntropyShared {
		return 0
	}
	rest := MaxLinearCrossEntropyShared - out*(in+1) - batch*out - 16
	if rest < in+1 {
		return 0
	}
	return min(batch, rest/(in+1))
}

// LinearCrossEntropyFits says whether the fuse pass makes a tail of a
// [batch,in] -> out linear layer: one block holds it
// (LinearCrossEntropyXRows) and pays (MaxLinearCrossEntropyMACs).
func LinearCrossEntropyFits(batch, in, out int64) bool {
	return LinearCrossEntropyXRows(batch, in, out) > 0 && 3*batch*out*in <= MaxLinearCrossEntropyMACs
}

var attrInputGrad = ir.AttrSpec{Name: "input_grad", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.InputGrad) }}

var linearCrossEntropyAttrs = []ir.AttrSpec{ir.AttrOut, ir.AttrBias, attrSmoothing, attrInputGrad, ir.AttrMaskOut, ir.AttrOpt}

// LinearCrossEntropyOp is the fused classifier tail.
var LinearCrossEntropyOp = New(&Def{
	OpInfo: ir.OpInfo{Name: "linear_cross_entropy", Attrs: linearCrossEntropyAttrs, Infer: inferLinearCrossEntropy,
		FLOPs: flopsLinearCrossEntropy, Layout: linearCrossEntropyLayout, Loss: true},
	Doc:    "the last linear layer, the softmax cross-entropy, the input gradient and the weight gradient with the optimizer update, fused (one block)",
	Grad:   linearCrossEntropyGrad,
	Ref:    refLinearCrossEntropy,
	Kernel: Kernel{Custom: "linear_cross_entropy", FirstSample: FirstRow},
})

// linearCrossEntropyLayout decodes x, w, b?, label, then with a fused
// update the parameters (w, b?) and their state; Params and State as a
// weight gradient's, Y standing for the label.
func linearCrossEntropyLayout(n *ir.Node) (ir.BlockParts, error) {
	d := layoutDecoder{n: n}
	var p ir.BlockParts
	a := n.Attrs
	p.X, p.W = d.next(), d.next()
	if a.Bias {
		p.B = d.next()
	}
	p.Y = d.next() // the label
	if a.Opt != nil {
		np := 1 + boolInt(a.Bias)
		for k := 0; k < np; k++ {
			p.Params = append(p.Params, d.next())
		}
		for k := 0; k < np*len(a.Opt.StateNames()); k++ {
			p.State = append(p.State, d.next())
		}
	}
	return p, d.done()
}

// LinearCrossEntropyLabel is the tail's label input.
func LinearCrossEntropyLabel(n *ir.Node) *ir.Value {
	return n.Ins[2+boolInt(n.Attrs.Bias)]
}

func inferLinearCrossEntropy(n *ir.Node) ([]ir.Type, error) {
	p, err := n.Parts()
	if err != nil {
		return nil, err
	}
	if p.X == nil || p.W == nil || p.Y == nil {
		return nil, fmt.Errorf("%s reads x, w, b? and the label", n.Op)
	}
	probe := &ir.Node{Op: ir.OpLinear, Attrs: ir.Attrs{Out: n.Attrs.Out}, Ins: []*ir.Value{p.X, p.W}}
	if p.B != nil {
		probe.Ins = append(probe.Ins, p.B)
	}
	lt, err := inferLinear(probe)
	if err != nil {
		return nil, err
	}
	logits := stub("logits", lt[0])
	if err := checkLogitsLabel(&ir.Node{Op: ir.OpCrossEntropy, Ins: []*ir.Value{logits, p.Y}}); err != nil {
		return nil, err
	}
	outs := []ir.Type{ir.F32Fixed(), lt[0], ir.F32Fixed()}
	if n.Attrs.InputGrad {
		outs = append(outs, p.X.Type)
	}
	wt := p.W.Type
	grads, err := gradWeightOuts(n, p, wt)
	if err != nil {
		return nil, err
	}
	return append(outs, grads...), nil
}

func flopsLinearCrossEntropy(n *ir.Node) int64 {
	p, _ := n.Parts()
	w := p.W.Type
	// the logits, the loss (flopsCrossEntropy's 4 per logit), dW, dX
	f := ir.MulSat(2, w.Dims[0], w.Dims[1])
	f = ir.AddSat(f, ir.MulSat(4, w.Dims[0]))
	f = ir.AddSat(f, ir.MulSat(2, w.Dims[0], w.Dims[1]))
	if n.Attrs.InputGrad {
		f = ir.AddSat(f, ir.MulSat(2, w.Dims[0], w.Dims[1]))
	}
	return f
}

// linearCrossEntropyGrad: the tail's outputs already hold every gradient.
// x's is dX (output 3); W's and b's are none with a fused update (the
// kernel applied it), else the dW, dB outputs (clipping's buffers). As a
// block's input gradient does (blockGrad), dX takes the mask of the ReLU
// that produced x when nothing else reads x (Attrs.MaskOut, decided here,
// where the backward's readers are known: dX = 0 where x <= 0), and that
// ReLU's backward then takes its gradient as already masked.
func linearCrossEntropyGrad(b GradBuilder, n *ir.Node, _ *ir.Value, _ []bool) []*ir.Value {
	grads := make([]*ir.Value, len(n.Ins))
	k := 3
	if n.Attrs.InputGrad {
		if src := maskSource(b, n.Ins[0]); src != nil {
			n.Attrs.MaskOut = true
			b.Mark(maskedKey, src)
		}
		grads[0] = n.Outs[3]
		k = 4
	}
	if n.Attrs.Opt == nil {
		for i := 1; k < len(n.Outs); i, k = i+1, k+1 {
			grads[i] = n.Outs[k]
		}
	}
	return grads
}

// refLinearCrossEntropy composes the unfused references: linear, the
// cross-entropy's loss, gradient and correct count, the linear's input,
// weight and bias gradients, and the optimizer (fusedUpdate).
func refLinearCrossEntropy(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	p, vals := partsValues(n, ins)
	lin := &ir.Node{Op: ir.OpLinear, Attrs: ir.Attrs{Out: n.Attrs.Out}, Ins: []*ir.Value{p.X, p.W}}
	lins := [][]float64{vals[p.X], vals[p.W]}
	if p.B != nil {
		lin.Ins = append(lin.Ins, p.B)
		lins = append(lins, vals[p.B])
	}
	logits := refLinear(env, lin, lins)[0]
	ce := &ir.Node{Op: ir.OpSoftmaxCrossEntropy, Attrs: ir.Attrs{Smoothing: n.Attrs.Smoothing}, Ins: []*ir.Value{stub("logits", ir.F32Batched(n.Attrs.Out)), p.Y}}
	ceIns := [][]float64{logits, vals[p.Y]}
	loss := refCrossEntropy(env, ce, ceIns)[0]
	dl := refCrossEntropyGrad(env, ce, ceIns)[0]
	labels := make([]int32, env.Batch)
	for i := range labels {
		labels[i] = int32(vals[p.Y][i])
	}
	correct := float64(CountCorrect(logits, labels, int(n.Attrs.Out)))
	outs := [][]float64{loss, logits, {correct}}
	if n.Attrs.InputGrad {
		gi := &ir.Node{Op: ir.OpLinearGradInput, Ins: []*ir.Value{ce.Ins[0], p.W}}
		dx := refLinearGradInput(env, gi, [][]float64{dl, vals[p.W]})[0]
		if n.Attrs.MaskOut {
			dx = applyMaskOut(dx, ir.BlockParts{XMask: p.X}, vals)
		}
		outs = append(outs, dx)
	}
	gw := &ir.Node{Op: ir.OpLinearGradWeight, Ins: []*ir.Value{ce.Ins[0], p.X}, Outs: []*ir.Value{stub("dw", p.W.Type)}}
	grads := [][]float64{refLinearGradWeight(env, gw, [][]float64{dl, vals[p.X]})[0]}
	if n.Attrs.Bias {
		gb := &ir.Node{Op: ir.OpLinearGradBias, Outs: []*ir.Value{stub("db", ir.F32Fixed(n.Attrs.Out))}}
		grads = append(grads, refLinearGradBias(env, gb, [][]float64{dl})[0])
	}
	return append(outs, fusedUpdate(env, n, p, vals, grads)...)
}
