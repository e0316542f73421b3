package cpu

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Linear blocks (ir/fused.go) on the CPU: cnnc_cpu.h's LinFwd, LinDgrad and LinWgrad, W being
// [out, in]. This file decides each kernel's split into tasks.

func init() {
	register(ir.OpLinearBlock, linearForward)
	register(ir.OpLinearBlockGradInput, linearGradInput)
	register(ir.OpLinearBlockGradWeight, linearGradWeight)
}

// linGeom is cnnc_cpu.h's struct L.
type linGeom struct {
	B, K, N                        int64 // batch, in, out
	Bias, ReLU, HasY, MaskOut, Acc bool
	Act, SaveZ                     bool // an activation other than ReLU folded in; z saved
	Tile, BT                       int64
	consts                         []def // the activation's constants
}

func (l *linGeom) defs() []def {
	return append([]def{{"B", l.B}, {"K", l.K}, {"N", l.N}, {"BIAS", l.Bias}, {"RELU", l.ReLU}, {"ACT", l.Act}, {"SAVEZ", l.SaveZ},
		{"HASY", l.HasY}, {"MASKOUT", l.MaskOut}, {"ACC", l.Acc}, {"TILE", l.Tile}, {"BT", l.BT}}, l.consts...)
}

// linAct sets l's folded activation from block node n (Attrs.Act) and
// returns its functor (NoActF for none, bnActFunctor's) and a doc phrase.
func (l *linGeom) linAct(n *ir.Node) (string, string) {
	functor, consts := bnActFunctor(n)
	l.Act, l.consts = n.Attrs.Act != 0, consts
	if !l.Act {
		return functor, ""
	}
	return functor, ops.BNActKernel(&n.Attrs)
}

func (l *linGeom) shape() string { return fmt.Sprintf("b%d_in%d_out%d", l.B, l.K, l.N) }

// The forward kernel's split: BT samples x TILE outputs a task (a multiple of its register
// tile's 3 outputs), about minTasks tasks, the task's vector sums (BT x TILE vectors) within the
// scratch target. Every task reads its samples' x and its outputs' rows of W whole, in chunks.
func (l *linGeom) splitForward() {
	l.BT = min(l.B, 64)
	bTiles := cdiv(l.B, l.BT)
	l.Tile = rup(max(1, cdiv(l.N, max(1, minTasks/bTiles))), 3)
	for l.Tile > 3 && floats64(l.BT*l.Tile*maxVW) > scratchTarget {
		l.Tile = rup(cdiv(l.Tile, 2), 3)
	}
}

// The gradients' split: TILE input columns a task (a multiple of the register tile's 3 vectors
// of 8), about 64 tasks, at most 480 columns.
func (l *linGeom) splitGrad() {
	l.Tile = min(480, max(24, rup(cdiv(l.K, 64), 24)))
}

// linMaskDoc says what a gradient kernel does to dY as it loads it.
func linMaskDoc(l *linGeom, act string) string {
	switch {
	case act != "":
		return ", dY·f'(·) of the block's " + act + " (through the saved y or z)"
	case l.HasY:
		return ", dY masked by the block's ReLU (y > 0)"
	}
	return ""
}

func linearForward(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	a := n.Attrs
	l := &linGeom{B: e.Batch(), K: p.W.Type.Dims[1], N: p.W.Type.Dims[0], Bias: a.Bias, ReLU: a.ReLU, SaveZ: a.SaveAct}
	functor, act := l.linAct(n)
	l.splitForward()
	args := []codegen.Arg{buf(p.X), buf(p.W)}
	if p.B != nil {
		args = append(args, buf(p.B))
	}
	args = append(args, buf(n.Out()))
	if l.SaveZ {
		args = append(args, buf(n.Outs[1]))
	}
	doc := fmt.Sprintf("linear block forward: y[%d,%d] = x[%d,%d]·Wᵀ", l.B, l.N, l.B, l.K)
	if l.Bias {
		doc += " + bias"
	}
	if l.ReLU {
		doc += ", then ReLU"
	}
	if act != "" {
		doc += ", then " + act
	}
	if l.SaveZ {
		doc += " (z, before it, saved)"
	}
	name := emit(e, kernelSpec{family: "linear_fwd", shape: l.shape(), doc: doc + ".", structs: []structSpec{{"g", l.defs()}},
		impl: "LinFwd<%[1]s, " + functor + ">", nparams: len(args)})
	return launch(e, n, name, cdiv(l.N, l.Tile)*cdiv(l.B, l.BT), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

func linearGradInput(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	l := &linGeom{B: e.Batch(), K: p.W.Type.Dims[1], N: p.W.Type.Dims[0], HasY: p.Y != nil, MaskOut: p.XMask != nil}
	functor, act := l.linAct(n)
	l.splitGrad()
	args := []codegen.Arg{buf(p.DOut), buf(p.W)}
	if p.Y != nil {
		args = append(args, buf(p.Y))
	}
	if p.XMask != nil {
		args = append(args, buf(p.XMask))
	}
	args = append(args, buf(n.Out()))
	doc := fmt.Sprintf("linear block input gradient: dX[%d,%d] = dY[%d,%d]·W", l.B, l.K, l.B, l.N)
	doc += linMaskDoc(l, act)
	if l.MaskOut {
		doc += ", then masked by the producer's ReLU (x > 0)"
	}
	name := emit(e, kernelSpec{family: "linear_dgrad", shape: l.shape(), doc: doc + ".", structs: []structSpec{{"g", l.defs()}},
		impl: "LinDgrad<%[1]s, " + functor + ">", nparams: len(args)})
	return launch(e, n, name, cdiv(l.K, l.Tile), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

func linearGradWeight(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	a := n.Attrs
	l := &linGeom{B: e.Batch(), K: p.X.Type.Dims[0], N: a.Out, Bias: a.Bias, HasY: p.Y != nil, Acc: e.Accumulate() && a.Opt == nil}
	functor, act := l.linAct(n)
	l.splitGrad()
	args := []codegen.Arg{buf(p.DOut), buf(p.X)}
	if p.Y != nil {
		args = append(args, buf(p.Y))
	}
	doc := fmt.Sprintf("linear block weight gradient: dW[%d,%d] = dYᵀ·x over a batch of %d", l.N, l.K, l.B)
	doc += linMaskDoc(l, act)
	if l.Bias {
		doc += "; dB = the batch sum of dY"
	}
	structs := []structSpec{{"g", l.defs()}}
	impl := "LinWgrad<%[1]s, NoOpt, " + functor + ">"
	bytes := minBytes(n, e.Batch())
	if opt := a.Opt; opt != nil {
		doc += "; then " + opt.String() + " in place"
		impl = "LinWgrad<%[1]s, %[2]s, " + functor + ">"
		structs = append(structs, structSpec{"o", optDefs(opt)})
		for _, v := range append(append([]*ir.Value{}, p.Params...), p.State...) {
			args = append(args, buf(v))
			bytes += v.Type.Bytes(e.Batch())
		}
		args = append(args, codegen.Arg{Kind: kernelarg.Scalars})
	} else {
		if l.Acc {
			doc += ", added to the gradients"
		}
		for _, v := range n.Outs {
			args = append(args, buf(v))
		}
	}
	name := emit(e, kernelSpec{family: "linear_wgrad", shape: l.shape(), doc: doc + ".", structs: structs, impl: impl, nparams: len(args)})
	return launch(e, n, name, cdiv(l.K, l.Tile), args, n.FLOPs(e.Batch()), bytes)
}
