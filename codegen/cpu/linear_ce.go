package cpu

import (
	"fmt"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// The classifier tail (compiler/ops/linear_cross_entropy.go) on the CPU: cnnc_cpu.h's LinearCE,
// one task, its arguments in the CUDA kernel's order.

func init() {
	register(ops.LinearCrossEntropyOp, linearCrossEntropy)
}

func linearCrossEntropy(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	a := n.Attrs
	if e.Eval() {
		// evaluation runs the training graph's forward nodes: the tail's forward alone
		a.InputGrad, a.MaskOut, a.Opt = false, false, nil
	}
	b, in, out := e.Batch(), p.X.Type.Dims[0], a.Out
	if e.Accumulate() && a.Opt != nil {
		return fmt.Errorf("%s: a fused update inside a micro-batch loop (the planner splits it)", n.Text())
	}
	eps := a.Smoothing
	defs := []def{{"B", b}, {"IN", in}, {"OUT", out}, {"BIAS", a.Bias}, {"DX", a.InputGrad}, {"MASKOUT", a.MaskOut}, {"BWD", !e.Eval()}, {"ACC", e.Accumulate()},
		{"SMOOTH", eps != 0}, {"ON", float32(1 - eps)}, {"OFF", float32(eps / float64(out))}}
	args := []codegen.Arg{buf(p.X), buf(p.W)}
	if a.Bias {
		args = append(args, buf(p.B))
	}
	args = append(args, buf(p.Y), buf(n.Outs[0]), buf(n.Outs[1]), buf(n.Outs[2]))
	k := 3
	if a.InputGrad {
		args = append(args, buf(n.Outs[3]))
		k = 4
	}
	doc := fmt.Sprintf("the classifier tail: logits of [%d] -> [%d] over a batch of %d, softmax cross-entropy", in, out, b)
	if eps != 0 {
		doc += fmt.Sprintf(" with label smoothing %g", eps) // as softmax_cross_entropy's and the CUDA tail's
	}
	if e.Eval() {
		doc += " (evaluation: no gradient, no update)"
	} else {
		doc += ", dW"
	}
	if a.Bias {
		doc += ", dB"
	}
	if a.InputGrad {
		doc += ", dX"
		if a.MaskOut {
			doc += " (masked by x > 0)"
		}
	}
	structs := []structSpec{{"g", defs}}
	impl := "LinearCE<%s, NoOpt>"
	bytes := minBytes(n, b)
	if opt := a.Opt; opt != nil {
		doc += "; then " + opt.String() + " in place"
		impl = "LinearCE<%s, %s>"
		structs = append(structs, structSpec{"o", optDefs(opt)})
		for _, v := range p.State {
			args = append(args, buf(v))
		}
	} else if !e.Eval() {
		for _, v := range n.Outs[k:] {
			args = append(args, buf(v))
		}
		if e.Accumulate() {
			doc += ", added to the gradients"
		}
	}
	args = append(args, codegen.Arg{Kind: kernelarg.Scalars}, codegen.Arg{Kind: kernelarg.Int, Int: 0})
	name := emit(e, kernelSpec{family: "linear_cross_entropy", shape: fmt.Sprintf("b%d_in%d_out%d", b, in, out), doc: doc + ".",
		structs: structs, impl: impl, nparams: len(args)})
	return launch(e, n, name, 1, args, n.FLOPs(b), bytes)
}
