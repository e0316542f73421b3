package compiler

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/ir"
)

// fusePass rewrites the training step into fused kernels.
//
// Forward: conv2d [-> relu] [-> maxpool2d] becomes one conv2d_block (the
// full-resolution conv output never exists; a pooled block saves its
// pooled output and a packed argmax), linear [-> relu] one linear_block,
// cross_entropy one softmax_cross_entropy that also writes the logits'
// gradient. Images arrive as uint8 HWC, converted inside conv loads (or by
// to_tensor for other readers). Other ops stay as they are.
//
// Backward: derived again over the fused forward graph — one rule per
// fused op in fusedGradRules, the unfused rules (gradRules) for the rest —
// so the unfused backward that autodiff built is replaced, not patched.
// A block's backward kernels read the gradient of its output at output
// resolution and route it through the argmax on the fly. A grad_input whose
// input comes from a ReLU block with no other reader applies that ReLU's
// mask in its epilogue (maskout), and that block's backward then takes the
// gradient as already masked. Each parameter's update is fused into the
// weight-gradient kernel, scheduled after the layer's grad_input (which
// still reads the old weights).
//
// The reference interpreter runs fused ops too; a test checks that the
// fused step equals the unfused one.
func fusePass(ctx *Context, g *ir.Graph) error {
	f := &fuser{g: g, readers: map[*ir.Value][]*ir.Node{}, absorbed: map[*ir.Node]bool{}, repl: map[*ir.Value]*ir.Value{}}
	var forward []*ir.Node
	for _, n := range g.Nodes {
		if n.Phase == ir.Forward {
			forward = append(forward, n)
			for _, v := range n.Ins {
				f.readers[v] = append(f.readers[v], n)
			}
		}
	}
	g.Nodes = nil
	g.ResetNames()
	f.convertImage(forward)
	for _, n := range forward {
		if err := f.fuseForward(n); err != nil {
			return err
		}
	}
	return f.backward()
}

// MaxFusedPoolWindow is the largest max-pool window (in elements) a conv
// block pools in its epilogue: the window's conv outputs must fit one tile
// of the forward kernel's 64 columns (codegen's tileFor). A larger pool
// stays a max-pool of its own.
const MaxFusedPoolWindow = 64

type fuser struct {
	g        *ir.Graph
	readers  map[*ir.Value][]*ir.Node // in the unfused forward graph
	absorbed map[*ir.Node]bool        // relu/maxpool nodes folded into a block
	repl     map[*ir.Value]*ir.Value  // unfused value -> fused value
	blocks   []*ir.Node               // fused forward nodes, in order
	image    *ir.Value                // u8 image input
	tensor   *ir.Value                // f32 image, when a non-conv layer reads it
}

func (f *fuser) val(v *ir.Value) *ir.Value {
	if r, ok := f.repl[v]; ok {
		return r
	}
	return v
}

// only returns v's single reader with the given op, or nil.
func (f *fuser) only(v *ir.Value, op ir.Op) *ir.Node {
	rs := f.readers[v]
	if len(rs) == 1 && rs[0].Op == op && v != f.g.Loss {
		return rs[0]
	}
	return nil
}

// convertImage makes the image input uint8 HWC, as the loader delivers it.
func (f *fuser) convertImage(forward []*ir.Node) {
	for _, in := range f.g.Inputs {
		if in.Role != ir.RoleInput || in.Type.DType != ir.F32 {
			continue
		}
		f32 := in.Type
		in.Type = ir.ImageU8Type(f32)
		f.image = in
		for _, r := range f.readers[in] {
			if r.Op != ir.OpConv2D {
				n := f.g.NewNode(ir.OpToTensor, in.Name, ir.Forward, in.Pos, []*ir.Value{in}, []string{in.Name + ".f32"}, ir.RoleActivation)
				n.Out().Type = f32
				f.g.Append(n)
				f.tensor = n.Out()
				break
			}
		}
	}
}

func (f *fuser) fuseForward(n *ir.Node) error {
	if f.absorbed[n] {
		return nil
	}
	var out *ir.Node
	switch n.Op {
	case ir.OpConv2D:
		out = f.convBlock(n)
	case ir.OpLinear:
		out = f.linearBlock(n)
	case ir.OpCrossEntropy:
		out = f.g.NewNode(ir.OpSoftmaxCrossEntropy, n.Name, ir.Forward, n.Pos, []*ir.Value{f.val(n.Ins[0]), f.val(n.Ins[1])},
			[]string{n.Out().Name, n.Ins[0].Name + ".grad", n.Name + ".correct"}, ir.RoleActivation)
		out.Attrs.Smoothing = n.Attrs.Smoothing
		out.Outs[0].Role = ir.RoleLoss
		out.Outs[1].Role = ir.RoleActGrad
		f.repl[n.Out()] = out.Outs[0]
		f.g.Loss, f.g.Logits = out.Outs[0], out.Ins[0]
	default:
		ins := make([]*ir.Value, len(n.Ins))
		for i, v := range n.Ins {
			ins[i] = f.val(v)
			if v == f.image {
				ins[i] = f.tensor
			}
		}
		out = f.g.NewNode(n.Op, n.Name, ir.Forward, n.Pos, ins, []string{n.Out().Name}, ir.RoleActivation)
		out.Attrs = n.Attrs
		f.repl[n.Out()] = out.Out()
	}
	if err := inferNode(out); err != nil {
		return fmt.Errorf("fuse: %s: %v", out.Text(), err)
	}
	f.g.Append(out)
	f.blocks = append(f.blocks, out)
	return nil
}

// blockStart begins a conv or linear block at n: its attributes with the
// bias and a ReLU reading n (absorbed) folded in, its inputs, and the last
// node the block covers so far.
func (f *fuser) blockStart(n *ir.Node) (ir.Attrs, []*ir.Value, *ir.Node) {
	a := n.Attrs
	a.Bias = len(n.Ins) > 2
	last := n
	if r := f.only(n.Out(), ir.OpReLU); r != nil {
		a.ReLU = true
		f.absorbed[r] = true
		last = r
	}
	ins := []*ir.Value{f.val(n.Ins[0]), n.Ins[1]}
	if a.Bias {
		ins = append(ins, n.Ins[2])
	}
	return a, ins, last
}

func (f *fuser) convBlock(n *ir.Node) *ir.Node {
	a, ins, last := f.blockStart(n)
	if p := f.only(last.Out(), ir.OpMaxPool2D); p != nil && p.Attrs.Kernel[0]*p.Attrs.Kernel[1] <= MaxFusedPoolWindow {
		a.Pool = &ir.Window{Kernel: p.Attrs.Kernel, Stride: p.Attrs.Stride, Pad: p.Attrs.Pad}
		f.absorbed[p] = true
		last = p
	}
	outs := []string{last.Out().Name}
	if a.Pool != nil {
		outs = append(outs, last.Out().Name+".argmax")
	}
	b := f.g.NewNode(ir.OpConvBlock, n.Name, ir.Forward, n.Pos, ins, outs, ir.RoleActivation)
	b.Attrs = a
	f.replaceOutput(last, b)
	return b
}

// replaceOutput makes block b's outputs stand for last's output: later
// uses read b's, and they keep the position of the DSL line that named
// the value (pool1 is reported at its own line, not at conv1's).
func (f *fuser) replaceOutput(last, b *ir.Node) {
	for _, o := range b.Outs {
		o.Pos = last.Out().Pos
	}
	f.repl[last.Out()] = b.Out()
}

func (f *fuser) linearBlock(n *ir.Node) *ir.Node {
	a, ins, last := f.blockStart(n)
	b := f.g.NewNode(ir.OpLinearBlock, n.Name, ir.Forward, n.Pos, ins, []string{last.Out().Name}, ir.RoleActivation)
	b.Attrs = a
	f.replaceOutput(last, b)
	return b
}

// backward derives the fused backward phase.
func (f *fuser) backward() error {
	g := f.g
	needsGrad := map[*ir.Value]bool{}
	for _, p := range g.Params {
		needsGrad[p.Value] = true
	}
	readers := map[*ir.Value][]*ir.Node{}
	for _, n := range f.blocks {
		for _, v := range n.Ins {
			readers[v] = append(readers[v], n)
			if needsGrad[v] {
				for _, o := range n.Outs {
					needsGrad[o] = true
				}
			}
		}
	}
	bb := &fusedBackward{gb: &gradBuilder{g: g}, readers: readers, needsGrad: needsGrad, masked: map[*ir.Value]bool{}}
	partial := map[*ir.Value][]*ir.Value{}
	for i := len(f.blocks) - 1; i >= 0; i-- {
		n := f.blocks[i]
		if n.Op == ir.OpSoftmaxCrossEntropy {
			partial[n.Ins[0]] = append(partial[n.Ins[0]], n.Outs[1])
			continue
		}
		if n.Op == ir.OpToTensor {
			continue
		}
		dy := sumGradients(bb.gb, n, n.Out(), partial[n.Out()])
		if dy == nil {
			continue
		}
		var grads []*ir.Value
		switch n.Op {
		case ir.OpConvBlock, ir.OpLinearBlock:
			gs, err := bb.block(n, dy)
			if err != nil {
				return err
			}
			grads = gs
		default:
			rule, ok := gradRules[n.Op]
			if !ok {
				return fmt.Errorf("fuse: no gradient rule for %s", n.Op)
			}
			need := make([]bool, len(n.Ins))
			for j, v := range n.Ins {
				need[j] = needsGrad[v]
			}
			grads = rule(bb.gb, n, dy, need)
		}
		for j, gv := range grads {
			if gv != nil && needsGrad[n.Ins[j]] && n.Ins[j].Role != ir.RoleParam {
				partial[n.Ins[j]] = append(partial[n.Ins[j]], gv)
			}
		}
	}
	return nil
}

type fusedBackward struct {
	gb        *gradBuilder
	readers   map[*ir.Value][]*ir.Node
	needsGrad map[*ir.Value]bool
	// masked marks block outputs whose gradient arrives with the block's
	// ReLU mask already applied (by the reader's maskout epilogue).
	masked map[*ir.Value]bool
}

// maskSource returns the ReLU block output whose mask x's gradient can take
// in the reader's epilogue: x itself, or the input of a flatten view of it,
// when nothing else reads it.
func (b *fusedBackward) maskSource(x *ir.Value, reader *ir.Node) *ir.Value {
	src := x
	if len(b.readers[src]) != 1 {
		return nil
	}
	if src.Def != nil && src.Def.Op == ir.OpFlatten {
		src = src.Def.Ins[0]
		if len(b.readers[src]) != 1 {
			return nil
		}
	}
	if d := src.Def; d != nil && (d.Op == ir.OpConvBlock || d.Op == ir.OpLinearBlock) && d.Attrs.ReLU && src == d.Out() {
		return src
	}
	return nil
}

// block emits a fused block's grad_input (if its input needs a gradient)
// and its weight gradient with the update fused, and returns the input
// gradient in position 0.
func (b *fusedBackward) block(n *ir.Node, dy *ir.Value) ([]*ir.Value, error) {
	g := b.gb.g
	x := n.Ins[0]
	a := n.Attrs
	a.DOutMasked = b.masked[n.Out()]
	var argmax, y *ir.Value
	if a.Pool != nil {
		argmax = n.Outs[1]
	}
	if a.ReLU && !a.DOutMasked {
		y = n.Out()
	}
	optional := func(vs ...*ir.Value) []*ir.Value {
		var out []*ir.Value
		for _, v := range vs {
			if v != nil {
				out = append(out, v)
			}
		}
		return out
	}
	gradOp, weightOp := ir.OpConvBlockGradInput, ir.OpConvBlockGradWeight
	if n.Op == ir.OpLinearBlock {
		gradOp, weightOp = ir.OpLinearBlockGradInput, ir.OpLinearBlockGradWeight
	}
	grads := make([]*ir.Value, len(n.Ins))
	if b.needsGrad[x] {
		ga := a
		ga.Dims = x.Type.Dims
		var xmask *ir.Value
		if src := b.maskSource(x, n); src != nil {
			ga.MaskOut = true
			xmask = x
			b.masked[src] = true
		}
		ins := append([]*ir.Value{dy, n.Ins[1]}, optional(argmax, y, xmask)...)
		gi := g.NewNode(gradOp, n.Name, ir.Backward, n.Pos, ins, []string{x.Name + ".grad"}, ir.RoleActGrad)
		gi.Attrs = ga
		if err := inferNode(gi); err != nil {
			return nil, fmt.Errorf("fuse: %s: %v", gi.Text(), err)
		}
		g.Append(gi)
		grads[0] = gi.Out()
	}
	wa := a
	wa.Opt = g.Opt
	ins := append([]*ir.Value{dy, x}, optional(argmax, y)...)
	params := n.Ins[1:]
	ins = append(ins, params...)
	for _, p := range params {
		ins = append(ins, p.Param.State...)
	}
	gw := g.NewNode(weightOp, n.Name, ir.Backward, n.Pos, ins, nil, ir.RoleGrad)
	gw.Attrs = wa
	if err := inferNode(gw); err != nil {
		return nil, fmt.Errorf("fuse: %s: %v", gw.Text(), err)
	}
	g.Append(gw)
	return grads, nil
}
