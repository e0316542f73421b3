package codegen

import (
	"fmt"
	"strings"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// linear_cross_entropy(x, w, b?, label, [w, b?, state...]) -> loss, logits,
// correct, dX?, [dW, dB?]: the classifier tail in one single-block kernel
// (templates/linear_ce.cu.tmpl; compiler/ops/linear_cross_entropy.go says
// what it computes and which shapes the fuse pass gives it).

const linearCEThreads = 256 // 8 warps; the template's loss reduction assumes it

func init() {
	register(ops.LinearCrossEntropyOp, linearCrossEntropyRule)
}

func linearCrossEntropyRule(e *emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	a := n.Attrs
	if e.eval {
		// evaluation runs the training graph's forward nodes: the tail's
		// forward alone (logits, loss, correct), no gradient, no update
		a.InputGrad, a.MaskOut, a.Opt = false, false, nil
	}
	out, in, b := a.Out, p.X.Type.Dims[0], e.batch
	if e.accumulate && a.Opt != nil {
		return fmt.Errorf("codegen: %s: a fused update inside a micro-batch loop (the planner splits it)", n.Text())
	}
	if ops.LinearCrossEntropyXRows(b, in, out) == 0 {
		return fmt.Errorf("codegen: %s: a batch of %d does not fit the tail's one block", n.Text(), b)
	}
	name := fmt.Sprintf("linear_cross_entropy_b%d_in%d_out%d", b, in, out) + flags("bias", a.Bias, "dx", a.InputGrad, "maskout", a.MaskOut, "fwd", e.eval)
	eps := a.Smoothing
	if eps != 0 {
		name += "_ls" + nameNumber(eps)
	}
	params := []string{inParam("x")}
	args := []Arg{buf(p.X)}
	if a.Opt != nil {
		params = append(params, outParam("w")) // read into shared memory, then updated
	} else {
		params = append(params, inParam("w"))
	}
	args = append(args, buf(p.W))
	if a.Bias {
		if a.Opt != nil {
			params = append(params, outParam("bias"))
		} else {
			params = append(params, inParam("bias"))
		}
		args = append(args, buf(p.B))
	}
	params = append(params, "const int* __restrict__ label")
	args = append(args, buf(p.Y))
	params = append(params, outParam("loss"), outParam("logits"), outParam("correct"))
	args = append(args, buf(n.Outs[0]), buf(n.Outs[1]), buf(n.Outs[2]))
	k := 3
	if a.InputGrad {
		params, args = append(params, outParam("dx")), append(args, buf(n.Outs[3]))
		k = 4
	}
	doc := fmt.Sprintf("the classifier tail: logits = x·Wᵀ%s of a batch of %d, [%d] -> [%d], their softmax cross-entropy (loss, correct count)",
		map[bool]string{true: " + b", false: ""}[a.Bias], b, in, out)
	if eps != 0 {
		doc += fmt.Sprintf(" with label smoothing %g", eps)
	}
	if !e.eval {
		doc += ", dW = dlogitsᵀ·x"
		if a.Bias {
			doc += ", dB = the batch sum of dlogits"
		}
	} else {
		doc += " (evaluation: no gradient, no update)"
	}
	if a.InputGrad {
		doc += ", dX = dlogits·W"
		if a.MaskOut {
			doc += " masked by the producer's ReLU (x > 0)"
		}
	}
	data := map[string]any{"Batch": b, "In": in, "Out": out, "Bias": a.Bias, "InputGrad": a.InputGrad, "MaskOut": a.MaskOut, "Backward": !e.eval,
		"Idx": indexType(b*in, b*out), "Accumulate": e.accumulate, "Opt": a.Opt != nil,
		"MACs": (2 + boolInt(a.InputGrad)) * b * in * out, "XRows": ops.LinearCrossEntropyXRows(b, in, out), "OChunk": min(out, 16)}
	if eps != 0 {
		data["Smoothing"] = eps
		data["OnTarget"] = cFloat(1 - eps)
		data["OffTarget"] = cFloat(eps / float64(out))
	}
	bytes := minBytes(n, b)
	if opt := a.Opt; opt != nil {
		names := []string{"w", "bias"}
		per := len(opt.StateNames())
		for i, v := range p.State {
			params, args = append(params, outParam(stateParams(names[i/per], opt)[i%per])), append(args, buf(v))
			bytes += v.Type.Bytes(b)
		}
		data["Site"] = newOptSite(opt, "grad", "w", stateParams("w", opt), "e")
		if a.Bias {
			data["BiasSite"] = newOptSite(opt, "grad", "bias", stateParams("bias", opt), "o")
		}
		doc += "; then " + optDoc(opt) + ", updating W" + map[bool]string{true: " and b", false: ""}[a.Bias] + " in place"
		name += "_" + optName(opt)
	} else if !e.eval {
		params, args = append(params, outParam("dw")), append(args, buf(n.Outs[k]))
		if a.Bias {
			params, args = append(params, outParam("db")), append(args, buf(n.Outs[k+1]))
		}
		if e.accumulate {
			doc += ", added to dW" + map[bool]string{true: " and dB", false: ""}[a.Bias] + " (a micro-batch's share)"
		}
	}
	if e.accumulate {
		name += "_acc" // a micro-batch of a loop: adds its share of the loss and gradients
	}
	// the step's scalars (valid rows, learning rate, step) and the micro-batch's first row (set by
	// GenerateFromPlan inside loops)
	params = append(params, scalarsParam, "long long first")
	args = append(args, scalarsArg, Arg{Kind: kernelarg.Int, Int: 0})
	data["Name"], data["Doc"], data["Params"] = name, doc+".", strings.Join(params, ", ")
	if err := e.kernel("linear_cross_entropy", name, data); err != nil {
		return err
	}
	e.launch(&Launch{Node: n, Kernel: name, Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{linearCEThreads, 1, 1},
		Args: args, FLOPs: n.FLOPs(b), MinBytes: bytes})
	return nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
