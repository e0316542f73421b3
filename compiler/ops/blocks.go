package ops

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// What the fused conv and linear blocks share: their input layouts (see
// ir/fused.go), their gradient rule, and the pieces of their reference
// kernels. Each block's own file (conv_block.go, linear_block.go) holds its
// type rules, FLOPs and kernels.

// blockLayout decodes a forward block: x, w, b?.
func blockLayout(n *ir.Node) (ir.BlockParts, error) {
	d := layoutDecoder{n: n}
	var p ir.BlockParts
	p.X, p.W = d.next(), d.next()
	if n.Attrs.Bias {
		p.B = d.next()
	}
	return p, d.done()
}

// gradInputLayout decodes a block's input gradient: dOut, w, argmax?, y?, xmask?.
func gradInputLayout(n *ir.Node) (ir.BlockParts, error) {
	d := layoutDecoder{n: n}
	var p ir.BlockParts
	a := n.Attrs
	p.DOut, p.W = d.next(), d.next()
	if a.Pool != nil {
		p.Argmax = d.next()
	}
	if (a.ReLU && !a.DOutMasked) || a.Act != 0 {
		p.Y = d.next()
	}
	if a.MaskOut {
		p.XMask = d.next()
	}
	return p, d.done()
}

// gradWeightLayout decodes a block's weight gradient: dOut, x, argmax?,
// y?, then with a fused update the parameters and their state.
func gradWeightLayout(n *ir.Node) (ir.BlockParts, error) {
	d := layoutDecoder{n: n}
	var p ir.BlockParts
	a := n.Attrs
	p.DOut, p.X = d.next(), d.next()
	if a.Pool != nil {
		p.Argmax = d.next()
	}
	if (a.ReLU && !a.DOutMasked) || a.Act != 0 {
		p.Y = d.next()
	}
	if a.Opt != nil {
		np := 1
		if a.Bias {
			np = 2
		}
		for k := 0; k < np; k++ {
			p.Params = append(p.Params, d.next())
		}
		for k := 0; k < np*len(a.Opt.StateNames()); k++ {
			p.State = append(p.State, d.next())
		}
	}
	return p, d.done()
}

type layoutDecoder struct {
	n *ir.Node
	i int
}

func (d *layoutDecoder) next() *ir.Value {
	if d.i >= len(d.n.Ins) {
		d.i++
		return nil
	}
	d.i++
	return d.n.Ins[d.i-1]
}

func (d *layoutDecoder) done() error {
	if d.i != len(d.n.Ins) {
		return fmt.Errorf("%s: %d inputs, the layout takes %d", d.n.Op, len(d.n.Ins), d.i)
	}
	return nil
}

// checkBackwardParts checks dOut, argmax and y against the block output types.
func checkBackwardParts(n *ir.Node, p ir.BlockParts, outs []ir.Type) error {
	if p.DOut == nil {
		return fmt.Errorf("%s: no gradient input", n.Op)
	}
	if !p.DOut.Type.Equal(outs[0]) {
		return fmt.Errorf("%s: gradient %s is %s, want %s", n.Op, p.DOut.Name, p.DOut.Type, outs[0])
	}
	if p.Argmax != nil && !p.Argmax.Type.Equal(outs[1]) {
		return fmt.Errorf("%s: argmax %s is %s, want %s", n.Op, p.Argmax.Name, p.Argmax.Type, outs[1])
	}
	if p.Y != nil && !p.Y.Type.Equal(outs[0]) {
		return fmt.Errorf("%s: saved output %s is %s, want %s", n.Op, p.Y.Name, p.Y.Type, outs[0])
	}
	return nil
}

// gradWeightOuts: the gradients, or nothing when the update is fused (then
// the parameters and their state must have the weight and bias types).
func gradWeightOuts(n *ir.Node, p ir.BlockParts, wt ir.Type) ([]ir.Type, error) {
	want := []ir.Type{wt}
	if n.Attrs.Bias {
		want = append(want, ir.F32Fixed(wt.Dims[0]))
	}
	if n.Attrs.Opt == nil {
		return want, nil
	}
	for i, v := range p.Params {
		if v == nil || v.Role != ir.RoleParam || !v.Type.Equal(want[i]) {
			return nil, fmt.Errorf("%s: fused update of %v, want a %s parameter", n.Op, v, want[i])
		}
	}
	per := len(n.Attrs.Opt.StateNames())
	for i, v := range p.State {
		if v == nil || v.Role != ir.RoleOptState || v.Param != p.Params[i/per].Param {
			return nil, fmt.Errorf("%s: %v is not optimizer state of %s", n.Op, v, p.Params[i/per].Name)
		}
	}
	return nil, nil
}

// maskedKey marks a block output whose gradient arrives with the block's
// ReLU mask already applied (by its reader's maskout epilogue).
const maskedKey = "relu-masked"

// maskSource returns the ReLU block or ReLU output whose mask x's gradient
// can take in its reader's epilogue: x itself, or the input of a flatten
// view of it, when nothing else reads it. The masked gradient may then
// overwrite x in place (maskOutInput): the ReLU's own gradient kernel, which
// would read x beside a separate gradient buffer, is not needed.
func maskSource(b GradBuilder, x *ir.Value) *ir.Value {
	src := x
	if len(b.Readers(src)) != 1 {
		return nil
	}
	if src.Def != nil && src.Def.Op.Info().View {
		src = src.Def.Ins[0]
		if len(b.Readers(src)) != 1 {
			return nil
		}
	}
	if d := src.Def; d != nil && (d.Op == ir.OpConvBlock || d.Op == ir.OpLinearBlock) && d.Attrs.ReLU && src == d.Out() {
		return src
	}
	if d := src.Def; d != nil && d.Op == ir.OpReLU {
		return src // a standalone ReLU: y > 0 is its mask too
	}
	if d := src.Def; d != nil && (d.Op == BatchNorm2D || d.Op == BatchNorm1D) && d.Attrs.ReLU && src == d.Out() {
		return src // a batch norm with its ReLU folded in (the fuse pass; pooled or not: max and ReLU commute)
	}
	return nil
}

// blockGrad is the gradient rule of a fused block: its grad_input (if its
// input needs a gradient; with the input producer's ReLU mask in the
// epilogue when that block's output has no other reader) and its weight
// gradient with the optimizer update fused, so the parameters get no
// gradient values (with gradient clipping, the weight gradient writes
// them, for separate updates). It returns the input gradient in position
// 0 (and the parameters' gradients after it when they exist).
func blockGrad(gradOp, weightOp ir.Op) GradRule {
	return func(b GradBuilder, n *ir.Node, dy *ir.Value, need []bool) []*ir.Value {
		g := b.Graph()
		x := n.Ins[0]
		a := n.Attrs
		a.BNStats = false // the forward's alone
		a.DOutMasked = b.Marked(maskedKey, n.Out())
		var saved []*ir.Value
		if a.Pool != nil {
			saved = append(saved, n.Outs[1]) // the argmax
		}
		if a.ReLU && !a.DOutMasked {
			saved = append(saved, n.Out()) // y, for the mask
		}
		if a.Act != 0 {
			saved = append(saved, activationSaved(n)) // y or z, for the activation's derivative
		}
		grads := make([]*ir.Value, len(n.Ins))
		if need[0] {
			ga := a
			ga.Dims = x.Type.Dims
			ins := append([]*ir.Value{dy, n.Ins[1]}, saved...)
			if src := maskSource(b, x); src != nil {
				ga.MaskOut = true
				ins = append(ins, x)
				b.Mark(maskedKey, src)
			}
			grads[0] = b.Node(gradOp, n, ga, ins, []string{x.Name + ".grad"}, ir.RoleActGrad).Out()
		}
		wa := a
		ins := append([]*ir.Value{dy, x}, saved...)
		params := n.Ins[1:]
		if g.ClipGradNorm > 0 {
			// clipping reads every gradient before any update: the
			// gradients go to buffers, the updates come after the norm
			gradientBuffers(b, weightOp, n, wa, ins, params, grads)
			return grads
		}
		wa.Opt = g.Opt
		ins = append(ins, params...)
		for _, p := range params {
			ins = append(ins, p.Param.State...)
		}
		b.Node(weightOp, n, wa, ins, nil, ir.RoleGrad)
		return grads
	}
}

// Reference pieces.

// partsValues maps a fused node's inputs to their data.
func partsValues(n *ir.Node, ins [][]float64) (ir.BlockParts, map[*ir.Value][]float64) {
	p, err := n.Parts()
	if err != nil {
		panic(err) // the verifier rejects such graphs before they run
	}
	vals := map[*ir.Value][]float64{}
	for i, v := range n.Ins {
		vals[v] = ins[i]
	}
	return p, vals
}

// activationSaved is the tensor the gradient of block n's folded
// activation (Attrs.Act) reads: its pre-activation output z when the block
// saves it (Attrs.SaveAct; its last output, after a conv block's argmax),
// else its output y.
func activationSaved(n *ir.Node) *ir.Value {
	if n.Attrs.SaveAct {
		return n.Outs[len(n.Outs)-1]
	}
	return n.Out()
}

// preActivationGrad turns the gradient of a block's output into the
// gradient of its conv (or linear) output: the ReLU mask unless already
// applied, then routing through the argmax to full resolution.
func preActivationGrad(env *RefEnv, n *ir.Node, p ir.BlockParts, vals map[*ir.Value][]float64, convT ir.Type) []float64 {
	d := vals[p.DOut]
	if pw := PointwiseOf(n.Attrs.Act); pw != nil {
		d = pw.Grad.Ref(env, n, [][]float64{d, vals[p.Y]})[0] // dy·f'(s), s = y or z (activationSaved)
	} else if p.Y != nil {
		masked := make([]float64, len(d))
		for i, y := range vals[p.Y] {
			if y > 0 {
				masked[i] = d[i]
			}
		}
		d = masked
	}
	pw := n.Attrs.Pool
	if pw == nil {
		return d
	}
	return unpoolArgmax(env, pw, convT, d, vals[p.Argmax])
}

// unpoolArgmax routes d, the gradient of the max-pool pw's output over
// the full-resolution type convT, back to full resolution through the
// argmax am (window indices, as maxpoolArgmax gives them): each position
// gets the sum of the gradients of the windows whose maximum it is
// (overlapping windows included).
func unpoolArgmax(env *RefEnv, pw *ir.Window, convT ir.Type, d, am []float64) []float64 {
	out := poolOutType(pw, convT)
	g := windowGeom(ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad}, convT, out)
	full := make([]float64, convT.Elems(int64(env.Batch)))
	for b := 0; b < env.Batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					o := ((b*g.c+c)*g.ho+oy)*g.wo + ox
					k := int(am[o])
					iy, ix := oy*g.sh-g.ph+k/g.kw, ox*g.sw-g.pw+k%g.kw
					full[((b*g.c+c)*g.h+iy)*g.w+ix] += d[o]
				}
			}
		}
	}
	return full
}

func applyMaskOut(dx []float64, p ir.BlockParts, vals map[*ir.Value][]float64) []float64 {
	if p.XMask != nil {
		for i, x := range vals[p.XMask] {
			if x <= 0 {
				dx[i] = 0
			}
		}
	}
	return dx
}

// fusedUpdate applies the optimizer to each parameter with its gradient
// (the optimizer's Ref, as the update ops) or, without a fused update,
// returns the gradients.
func fusedUpdate(env *RefEnv, n *ir.Node, p ir.BlockParts, vals map[*ir.Value][]float64, grads [][]float64) [][]float64 {
	opt := n.Attrs.Opt
	if opt == nil {
		return grads
	}
	if !env.Update {
		if env.FusedGrad != nil {
			for i, pv := range p.Params {
				env.FusedGrad(pv.Param, grads[i])
			}
		}
		return nil
	}
	o, err := OptimizerOf(opt.Kind)
	if err != nil {
		panic(err) // the verifier rejects unknown optimizers before anything runs
	}
	per := len(opt.StateNames())
	for i, pv := range p.Params {
		var state [][]float64
		for _, s := range p.State[i*per : (i+1)*per] {
			state = append(state, vals[s])
		}
		o.Ref(opt, env.Step, vals[pv], grads[i], state)
	}
	return nil
}

// gradientBuffers adds n's weight-gradient node op (attributes a, inputs
// ins) writing each parameter's gradient to a buffer of its own (no fused
// update), and sets grads[1+i] to parameter i's.
func gradientBuffers(b GradBuilder, op ir.Op, n *ir.Node, a ir.Attrs, ins, params []*ir.Value, grads []*ir.Value) {
	var names []string
	for _, p := range params {
		names = append(names, p.Name+".grad")
	}
	w := b.Node(op, n, a, ins, names, ir.RoleGrad)
	for i, p := range params {
		w.Outs[i].Param = p.Param
		grads[1+i] = w.Outs[i]
	}
}
