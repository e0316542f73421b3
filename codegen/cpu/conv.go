package cpu

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"strings"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Convolution blocks (ir/fused.go) on the CPU: cnnc_cpu.h's ConvFwd, ConvDgrad, ConvWgrad and
// ConvWgradReduce. This file decides the geometry and how each kernel's work splits into tasks.

func init() {
	register(ir.OpConvBlock, convForward)
	register(ir.OpConvBlockGradInput, convGradInput)
	register(ir.OpConvBlockGradWeight, convGradWeight)
	registerScratch(ir.OpConvBlockGradWeight, convGradWeightScratch)
}

// convGeom is a conv block's compile-time geometry, as cnnc_cpu.h's struct G names it.
type convGeom struct {
	B, C, H, W                   int64
	U8                           bool
	O, KH, KW, SH, SW, PH, PW    int64
	HO, WO                       int64
	Bias, ReLU, Pool             bool
	Argmax                       bool // a pooled forward block writes its argmax (not in inference)
	PKH, PKW, PSH, PSW, PPH, PPW int64
	PHO, PWO, Bits               int64
	HasY, MaskOut, Acc           bool
	// Act: an activation other than ReLU folded in (its functor, cnnc_cpu.h, and constants;
	// HasY then means the saved y or z its derivative reads), SaveZ: the forward writes z (pooled: at
	// each pooled output's argmax).
	Act, SaveZ  bool
	functor     string
	actName     string // its kernel family (ops.BNActKernel)
	consts      []def
	Band, OT, S int64 // the split into tasks
	NS          int64 // the weight gradient's samples a unit (1 elsewhere)
}

func newConvGeom(n *ir.Node, x ir.Type, batch int64) (*convGeom, error) {
	a := n.Attrs
	g := &convGeom{B: batch, O: a.Out, KH: a.Kernel[0], KW: a.Kernel[1], SH: a.Stride[0], SW: a.Stride[1], PH: a.Pad[0], PW: a.Pad[1],
		Bias: a.Bias, ReLU: a.ReLU, HasY: a.ReLU && !a.DOutMasked, MaskOut: a.MaskOut,
		PKH: 1, PKW: 1, PSH: 1, PSW: 1, Bits: 1, NS: 1, SaveZ: a.SaveAct}
	g.functor, g.consts = bnActFunctor(n)
	g.actName = ops.BNActKernel(&a)
	if g.Act = a.Act != 0; g.Act {
		g.HasY = true
	}
	switch {
	case x.DType == ir.U8 && len(x.Dims) == 3:
		g.U8, g.H, g.W, g.C = true, x.Dims[0], x.Dims[1], x.Dims[2]
		if s := a.Aug; s != nil { // the conv sees the augmented input (augment.go)
			g.H, g.W = s.OutH, s.OutW
		}
	case x.DType == ir.F32 && len(x.Dims) == 3:
		g.C, g.H, g.W = x.Dims[0], x.Dims[1], x.Dims[2]
	default:
		return nil, fmt.Errorf("%s: block input %s is neither f32 [C,H,W] nor u8 [H,W,C]", n.Text(), x)
	}
	var ok1, ok2 bool
	g.HO, ok1 = ir.ConvOut(g.H, g.KH, g.SH, g.PH)
	g.WO, ok2 = ir.ConvOut(g.W, g.KW, g.SW, g.PW)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%s: the kernel does not fit the input", n.Text())
	}
	g.PHO, g.PWO = g.HO, g.WO
	if p := a.Pool; p != nil {
		g.Pool = true
		g.PKH, g.PKW, g.PSH, g.PSW, g.PPH, g.PPW = p.Kernel[0], p.Kernel[1], p.Stride[0], p.Stride[1], p.Pad[0], p.Pad[1]
		g.PHO, ok1 = ir.ConvOut(g.HO, g.PKH, g.PSH, g.PPH)
		g.PWO, ok2 = ir.ConvOut(g.WO, g.PKW, g.PSW, g.PPW)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%s: the pool window does not fit the conv output", n.Text())
		}
		g.Argmax = !a.NoArgmax
		g.Bits = ir.ArgmaxType(g.PKH * g.PKW).Bits
		if g.Bits > 16 {
			return nil, fmt.Errorf("%s: pool windows over 65536 elements are not supported", n.Text())
		}
	}
	if g.KH > 32 || g.KW > 32 || g.SH > 16 || g.SW > 16 {
		return nil, fmt.Errorf("%s: kernels larger than 32x32 or strides over 16 are not supported", n.Text())
	}
	return g, nil
}

func (g *convGeom) defs() []def {
	return append([]def{{"B", g.B}, {"C", g.C}, {"H", g.H}, {"W", g.W}, {"U8", g.U8},
		{"O", g.O}, {"KH", g.KH}, {"KW", g.KW}, {"SH", g.SH}, {"SW", g.SW}, {"PH", g.PH}, {"PW", g.PW}, {"HO", g.HO}, {"WO", g.WO},
		{"BIAS", g.Bias}, {"RELU", g.ReLU}, {"POOL", g.Pool}, {"ARGMAX", g.Argmax},
		{"PKH", g.PKH}, {"PKW", g.PKW}, {"PSH", g.PSH}, {"PSW", g.PSW}, {"PPH", g.PPH}, {"PPW", g.PPW}, {"PHO", g.PHO}, {"PWO", g.PWO}, {"BITS", g.Bits},
		{"HASY", g.HasY}, {"MASKOUT", g.MaskOut}, {"ACC", g.Acc}, {"ACT", g.Act}, {"SAVEZ", g.SaveZ},
		{"BAND", g.Band}, {"OT", g.OT}, {"S", g.S}, {"NS", g.NS}}, g.consts...)
}

// withAct adds the block's activation functor to a kernel's impl (ConvFwd<%s> ->
// ConvFwd<%s, GELUF>), its constants read from the geometry struct (the impl's %[1]s, or
// %[2]s behind an augmentation's struct).
func (g *convGeom) withAct(k kernelSpec) kernelSpec {
	if !g.Act {
		return k
	}
	ref := "%[1]s"
	if strings.Contains(k.impl, "%[2]s") {
		ref = "%[2]s"
	}
	k.impl = strings.TrimSuffix(k.impl, ">") + ", " + strings.ReplaceAll(g.functor, "%[1]s", ref) + ">"
	return k
}

// shape is the kernel name's description: x16x63x63_o32_k3x3s1p0_pool2s2_b32.
func (g *convGeom) shape() string {
	s := fmt.Sprintf("x%dx%dx%d", g.C, g.H, g.W)
	if g.U8 {
		s += "u8"
	}
	s += fmt.Sprintf("_o%d_k%dx%ds%dp%d", g.O, g.KH, g.KW, g.SH, g.PH)
	if g.Pool {
		s += fmt.Sprintf("_pool%ds%d", g.PKH, g.PSH)
		if !g.Argmax {
			s += "_noargmax"
		}
	}
	return s + fmt.Sprintf("_b%d", g.B)
}

func (g *convGeom) doc() string {
	s := fmt.Sprintf("conv %dx%d stride %dx%d pad %dx%d of [B=%d,%d,%d,%d]", g.KH, g.KW, g.SH, g.SW, g.PH, g.PW, g.B, g.C, g.H, g.W)
	if g.U8 {
		s += " (u8 HWC images, /255)"
	}
	s += fmt.Sprintf(" to %d channels", g.O)
	if g.Bias {
		s += " + bias"
	}
	if g.ReLU {
		s += ", ReLU"
	}
	if g.Act {
		s += ", then " + g.actName
	}
	if g.Pool {
		s += fmt.Sprintf(", max-pool %dx%d stride %dx%d pad %dx%d", g.PKH, g.PKW, g.PSH, g.PSW, g.PPH, g.PPW)
	}
	return s
}

// shrink halves band (keeping it a multiple of step) while too big says so, then while the
// tasks are fewer than minTasks, and finally evens the bands out over rows.
func shrink(rows, step, band int64, tooBig func(band int64) bool, tasks func(band int64) int64) int64 {
	for band > step && tooBig(band) {
		band = rup(cdiv(band, 2), step)
	}
	for band > step && tasks(band) < minTasks && !tooBig(band) {
		band = rup(cdiv(band, 2), step)
	}
	return rup(cdiv(rows, cdiv(rows, band)), step)
}

// The forward kernel's split: OT channels and BAND output rows (pooled rows when pooled) a task.
func (g *convGeom) splitForward() {
	g.OT = g.O
	if g.O > 64 {
		g.OT = 32
	}
	rows := g.HO
	if g.Pool {
		rows = g.PHO
	}
	scratch := func(band int64) int64 {
		wop := rup(g.WO, 2*maxVW)
		jw := wop + (g.KW-1)/g.SW
		cr := band
		if g.Pool {
			cr = (band-1)*g.PSH + g.PKH
		}
		ir := (cr-1)*g.SH + g.KH
		s := floats64(g.C * ir * g.SW * jw)
		if g.Pool {
			s += floats64(g.OT*cr*wop) + floats64(band*g.PWO)
			if g.SaveZ { // z beside f(z), for z at the argmax
				s += floats64(g.OT * cr * wop)
			}
		}
		return s
	}
	g.Band = shrink(rows, 1, rows, func(b int64) bool { return scratch(b) > scratchTarget },
		func(b int64) int64 { return g.B * cdiv(rows, b) * cdiv(g.O, g.OT) })
}

func (g *convGeom) forwardTasks() int64 {
	rows := g.HO
	if g.Pool {
		rows = g.PHO
	}
	return g.B * cdiv(rows, g.Band) * cdiv(g.O, g.OT)
}

func convForward(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	g, err := newConvGeom(n, p.X.Type, e.Batch())
	if err != nil {
		return err
	}
	g.Acc = e.Accumulate() // a micro-batch loop's step, as the plan says
	g.splitForward()
	args := []codegen.Arg{buf(p.X), buf(p.W)}
	if g.Bias {
		args = append(args, buf(p.B))
	}
	args = append(args, buf(n.Outs[0]))
	if g.SaveZ {
		args = append(args, buf(n.Outs[len(n.Outs)-1]))
	}
	if g.Argmax {
		args = append(args, buf(n.Outs[1]))
	}
	k, args := augKernel(e, n, kernelSpec{family: "conv_fwd", shape: g.shape(), doc: g.doc() + ".",
		structs: []structSpec{{"g", g.defs()}}, impl: "ConvFwd<%s>", nparams: len(args)}, args)
	k = g.withAct(k)
	name := emit(e, k)
	if err := launch(e, n, name, g.forwardTasks(), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch())); err != nil {
		return err
	}
	if n.Attrs.BNStats {
		return bnPartials(e, n)
	}
	return nil
}

// bnPartials launches, after a conv block or direct conv with Attrs.BNStats, the batch norm statistics partials
// of its output (its second output) in their layout (compiler/ops BNPartialsType); this target's
// batchnorm_stats still reads the conv output itself (in float64), so they serve the layout's
// tests and the other targets.
func bnPartials(e codegen.Emitter, n *ir.Node) error {
	y, part := n.Outs[0], n.Outs[1]
	c, s := bnGeom(y.Type)
	b := e.Batch()
	defs := []def{{"B", b}, {"C", c}, {"S", s}, {"CHUNK", int64(ops.BNChunk)}, {"ELEMS", part.Type.Elems(b)}}
	name := emit(e, kernelSpec{family: "bn_partials", shape: fmt.Sprintf("c%d_s%d_b%d", c, s, b),
		doc:     fmt.Sprintf("batch norm statistics partials of [%d,%d,%d] (the batch valid at run time).", b, c, s),
		structs: []structSpec{{"g", defs}}, impl: "BNPartials<%s>", nparams: 3})
	return launch(e, n, name, c, []codegen.Arg{buf(y), buf(part), {Kind: kernelarg.Scalars}},
		4*y.Type.Elems(b), y.Type.Bytes(b)+part.Type.Bytes(b))
}

// The input gradient's split: OT input channels and BAND input rows (a multiple of the stride) a
// task.
func (g *convGeom) splitGradInput() {
	g.OT = g.C
	if g.C > 64 {
		g.OT = 64
	}
	scratch := func(band int64) int64 {
		khp, kwp := cdiv(g.KH, g.SH), cdiv(g.KW, g.SW)
		vp := rup(cdiv(g.W, g.SW), 2*maxVW)
		dw := kwp - 1 + (g.SW-1+g.PW)/g.SW + vp
		dr := band/g.SH + (g.SH-1+g.PH)/g.SH - g.PH/g.SH + khp - 1
		return floats64(g.O * dr * dw)
	}
	rows := rup(g.H, g.SH)
	g.Band = shrink(rows, g.SH, rows, func(b int64) bool { return scratch(b) > scratchTarget },
		func(b int64) int64 { return g.B * cdiv(g.H, b) * cdiv(g.C, g.OT) })
}

func convGradInput(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	g, err := newConvGeom(n, ir.F32Batched(n.Attrs.Dims...), e.Batch())
	if err != nil {
		return err
	}
	g.Acc = e.Accumulate() // a micro-batch loop's step, as the plan says
	g.splitGradInput()
	args := []codegen.Arg{buf(p.DOut), buf(p.W)}
	if g.Pool {
		args = append(args, buf(p.Argmax))
	}
	if g.HasY {
		args = append(args, buf(p.Y))
	}
	if g.MaskOut {
		args = append(args, buf(p.XMask))
	}
	args = append(args, buf(n.Out()))
	name := emit(e, g.withAct(kernelSpec{family: "conv_dgrad", shape: g.shape(), doc: "input gradient of " + g.doc() + gradDoc(g) + ".",
		structs: []structSpec{{"g", g.defs()}}, impl: "ConvDgrad<%s>", nparams: len(args)}))
	return launch(e, n, name, g.B*cdiv(g.H, g.Band)*cdiv(g.C, g.OT), args, n.FLOPs(e.Batch()), minBytes(n, e.Batch()))
}

func gradDoc(g *convGeom) string {
	s := "; dy from the output gradient"
	if g.Act {
		s += " times f'(·) of the block's " + g.actName + " (through the saved y or z)"
	} else if g.HasY {
		s += " masked by y > 0"
	}
	if g.Pool {
		s += " routed through the packed argmax"
	}
	if g.MaskOut {
		s += "; dx masked by the input's x > 0"
	}
	return s
}

// wgradTasks is the most tasks a weight gradient's reduction is split into (the partial sums
// the plan's workspace holds): a fixed number, so the sums' order does not depend on the
// machine's threads.
const wgradTasks = 64

// The weight gradient's split: units of BAND conv rows of NS samples, S tasks of consecutive
// units. The band is as tall as the staged input and dy rows stay within scratchTarget (the
// task's own sums of the weight gradient come on top: no band makes them smaller, and a short
// band only adds lane sums); where a band is the whole map, a unit takes as many samples as fit
// in wgradUnitTarget while at least wgradMinUnits units remain, so that each lane sum adds
// many products even on small maps.
func (g *convGeom) splitGradWeight() {
	staged := func(band int64) int64 {
		wop := rup(g.WO, maxVW)
		jw := wop + (g.KW-1)/g.SW
		ir := (band-1)*g.SH + g.KH
		return floats64(g.C*ir*g.SW*jw) + floats64(g.O*band*wop)
	}
	g.Band = shrink(g.HO, 1, g.HO, func(b int64) bool { return staged(b) > scratchTarget }, func(int64) int64 { return minTasks })
	g.NS = 1
	if g.Band == g.HO {
		for 2*g.NS*staged(g.Band) <= wgradUnitTarget && cdiv(g.B, 2*g.NS) >= wgradMinUnits && g.HO*g.WO*g.NS < wgradUnitPositions {
			g.NS *= 2
		}
	}
	g.S = min(cdiv(g.B, g.NS)*cdiv(g.HO, g.Band), wgradTasks)
}

const (
	// wgradUnitTarget bounds the staged inputs and dy of a weight-gradient unit of several
	// samples (an L2 cache's share).
	wgradUnitTarget = 1 << 20
	// wgradMinUnits keeps the weight gradient's reduction split into this many tasks at least.
	wgradMinUnits = 8
	// wgradUnitPositions: a unit of this many output positions already adds enough products
	// to each lane sum.
	wgradUnitPositions = 256
)

func (g *convGeom) weightElems() int64 {
	we := g.O * g.C * g.KH * g.KW
	if g.Bias {
		we += g.O
	}
	return we
}

// gradWeightPartials is the type of the weight-gradient kernel's scratch (after
// splitGradWeight): a partial weight gradient per task, sized for the batch's split, the
// largest of any batch up to it (a micro-batch loop's smaller last iteration uses part of it).
func (g *convGeom) gradWeightPartials() ir.Type { return ir.F32Fixed(g.S, g.weightElems()) }

// convGradWeightScratch is convGradWeight's scratch.
func convGradWeightScratch(n *ir.Node, b int64) (int64, error) {
	p, err := n.Parts()
	if err != nil {
		return 0, err
	}
	g, err := newConvGeom(n, p.X.Type, b)
	if err != nil {
		return 0, err
	}
	g.splitGradWeight()
	return codegen.ScratchAligned(g.gradWeightPartials().Bytes(b)), nil
}

func convGradWeight(e codegen.Emitter, n *ir.Node) error {
	p, err := n.Parts()
	if err != nil {
		return err
	}
	g, err := newConvGeom(n, p.X.Type, e.Batch())
	if err != nil {
		return err
	}
	g.Acc = e.Accumulate() // a micro-batch loop's step, as the plan says
	g.splitGradWeight()
	partial := e.Scratch(n, "dw_partials", g.gradWeightPartials())
	args := []codegen.Arg{buf(p.DOut), buf(p.X)}
	if g.Pool {
		args = append(args, buf(p.Argmax))
	}
	if g.HasY {
		args = append(args, buf(p.Y))
	}
	args = append(args, buf(partial))
	k, args := augKernel(e, n, kernelSpec{family: "conv_wgrad", shape: g.shape(), doc: "weight gradient of " + g.doc() + gradDoc(g) +
		fmt.Sprintf(", %d partial sums", g.S) + ".", structs: []structSpec{{"g", g.defs()}}, impl: "ConvWgrad<%s>", nparams: len(args)}, args)
	k = g.withAct(k)
	name := emit(e, k)
	if err := launch(e, n, name, g.S, args, n.FLOPs(e.Batch()), minBytes(n, e.Batch())+partial.Type.Bytes(e.Batch())); err != nil {
		return err
	}
	return convWeightReduce(e, n, p, g, partial)
}

// convWeightReduce adds the partial sums in task order and writes dw (and db), adds to them, or
// applies the fused optimizer update.
func convWeightReduce(e codegen.Emitter, n *ir.Node, p ir.BlockParts, g *convGeom, partial *ir.Value) error {
	args := []codegen.Arg{buf(partial)}
	opt := n.Attrs.Opt
	what, impl := "grads", "ConvWgradReduce<%s, NoOpt>"
	structs := []structSpec{{"g", g.defs()}}
	moved := partial.Type.Bytes(e.Batch())
	if opt == nil {
		if g.Acc {
			what = "grads_acc"
		}
		for _, v := range n.Outs {
			args = append(args, buf(v))
			moved += v.Type.Bytes(e.Batch())
		}
	} else {
		what, impl = "update", "ConvWgradReduce<%s, %s>"
		structs = append(structs, structSpec{"o", optDefs(opt)})
		for _, v := range append(append([]*ir.Value{}, p.Params...), p.State...) {
			args = append(args, buf(v))
			moved += 2 * v.Type.Bytes(e.Batch())
		}
		args = append(args, codegen.Arg{Kind: kernelarg.Scalars})
	}
	we := g.weightElems()
	doc := fmt.Sprintf("adds the %d partial sums of the %dx%d weight gradient", g.S, g.O, g.C*g.KH*g.KW)
	if g.Bias {
		doc += " and the bias gradient"
	}
	if opt != nil {
		doc += ", then " + opt.String() + " in place"
	}
	name := emit(e, kernelSpec{family: "conv_wgrad_reduce", shape: fmt.Sprintf("o%d_k%d_s%d_%s", g.O, g.C*g.KH*g.KW, g.S, what), doc: doc + ".",
		structs: structs, impl: impl, nparams: len(args)})
	return launch(e, n, name, cdiv(we, reduceChunk), args, (g.S-1)*we, moved)
}

// reduceChunk is ConvWgradReduce's CHUNK: elements a task adds up.
const reduceChunk = 1024
