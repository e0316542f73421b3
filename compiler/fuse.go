package compiler

import (
	"fmt"

	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

// fusePass rewrites the training step into fused kernels.
//
// Forward: conv2d [-> relu or another pointwise activation] [-> maxpool2d]
// becomes one conv2d_block (the full-resolution conv output never exists; a
// pooled block saves its pooled output and a packed argmax; an activation
// whose gradient reads its input has the block also write the
// pre-activation output — pooled, only at each pooled output's argmax)
// unless the conv is grouped or dilated
// (then it runs its own direct kernels, and its parameters a separate
// update); conv2d -> tanh -> avgpool2d becomes one conv2d_tanh_avgpool
// (compiler/ops/conv_tanh_pool.go: the pooled output, plus the tanh
// output only when the conv's input needs a gradient — reading the image,
// the weight gradient recomputes it; its parameters get separate updates),
// linear [-> relu or another pointwise activation] one linear_block (an
// activation whose gradient reads its input has the block also write the
// pre-activation output),
// cross_entropy one softmax_cross_entropy that also writes the logits'
// gradient — or, in a training graph, the last linear layer and the
// cross_entropy reading it one linear_cross_entropy when one block holds
// it (the whole tail, its backward and its update in one kernel; see
// linearCrossEntropy) — batch norm's normalisation [-> relu or another
// pointwise activation] [-> maxpool2d] one normalisation with the
// activation folded in (Attrs.ReLU, Attrs.Act; its statistics stay a node
// of their own) and, for batchnorm2d, the max-pool too (Attrs.Pool: the
// pooled output and, training, a packed argmax, as a pooled conv block's;
// the full-resolution normalised values never exist). An
// unpooled conv block whose output only a batch norm reads, in a training
// graph, also writes the statistics' partials in its epilogue
// (Attrs.BNStats, its second output; of the activation's output when one
// is folded), which the statistics node merges instead of reading the
// conv output again (compiler/ops/batchnorm.go); so does an unfused
// (grouped, depthwise or dilated) conv2d whose output only a batch norm
// reads, in its direct kernel (directConvStats); evaluation and inference
// use the running statistics, and their conv blocks write none. Images arrive as uint8 HWC, converted inside conv loads (or by
// to_tensor for other readers). Other ops stay as they are.
//
// Backward: derived again over the fused forward graph by autodiff's
// reverse-mode engine — the fused ops' gradient rules (compiler/ops), the
// unfused rules for the rest — so the unfused backward that autodiff built
// is replaced, not patched.
// A block's backward kernels read the gradient of its output at output
// resolution and route it through the argmax on the fly. A grad_input whose
// input comes from a ReLU block (or a standalone ReLU, or a batch norm with
// its ReLU folded in) with no other reader
// applies that ReLU's mask in its epilogue (maskout), and that block's
// backward then takes the gradient as already masked (the standalone ReLU
// adds no gradient kernel). Each parameter's update is fused into the
// weight-gradient kernel, scheduled after the layer's grad_input (which
// still reads the old weights) — except with gradient clipping, which
// needs every gradient before any update: the weight gradients then go to
// buffers and the updates follow clip_grad_norm (see compiler/ops).
//
// An inference graph (the infer pass) gets the forward blocks alone, and a
// pooled block keeps no argmax.
//
// The reference interpreter runs fused ops too; a test checks that the
// fused step equals the unfused one.
func fusePass(ctx *Context, g *ir.Graph) error {
	f := &fuser{ctx: ctx, g: g, readers: map[*ir.Value][]*ir.Node{}, absorbed: map[*ir.Node]bool{}, repl: map[*ir.Value]*ir.Value{}}
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
	f.convertImage(forward, ctx.Data.Augment)
	for _, n := range forward {
		if err := f.fuseForward(n); err != nil {
			return err
		}
	}
	if g.Infer {
		// an inference graph: forward blocks only, its output replaced
		g.Logits = f.val(g.Logits)
		return nil
	}
	if g.Eval {
		return nil // an evaluation graph: forward blocks only
	}
	return f.backward()
}

// fusableConv: the conv block kernels take plain convolutions; a grouped
// or dilated conv2d runs its own (direct) kernels, reading the image as
// f32 like any other layer.
func fusableConv(n *ir.Node) bool {
	return n.Op == ir.OpConv2D && n.Attrs.Dil() == [2]int64{1, 1} && n.Attrs.GroupCount() == 1
}

// MaxFusedPoolWindow is the largest max-pool window (in elements) a conv
// block pools in its epilogue: the window's conv outputs must fit one tile
// of the forward kernel's 64 columns (codegen's tileFor). A larger pool
// stays a max-pool of its own.
const MaxFusedPoolWindow = 64

type fuser struct {
	ctx      *Context
	g        *ir.Graph
	readers  map[*ir.Value][]*ir.Node // in the unfused forward graph
	absorbed map[*ir.Node]bool        // relu/maxpool nodes folded into a block
	repl     map[*ir.Value]*ir.Value  // unfused value -> fused value
	blocks   []*ir.Node               // fused forward nodes, in order
	image    *ir.Value                // u8 image input
	aug      *augment.Spec            // the data block's augmentation, applied by the image's readers
	tensor   *ir.Value                // f32 image, when a non-conv layer reads it
	bnPart   map[*ir.Node]*ir.Value   // batchnorm_stats node -> the partials its conv block writes
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
	if len(rs) == 1 && rs[0].Op == op && v != f.g.Loss && !(f.g.Infer && v == f.g.Logits) {
		return rs[0]
	}
	return nil
}

// convertImage makes the image input uint8 HWC, as the loader delivers it:
// with an augment list, at the size the list crops from (aug.H, aug.W),
// and the readers of the image (conv blocks, to_tensor) carry the list.
func (f *fuser) convertImage(forward []*ir.Node, aug *augment.Spec) {
	for _, in := range f.g.Inputs {
		if in.Role != ir.RoleInput || in.Type.DType != ir.F32 {
			continue
		}
		f32 := in.Type
		in.Type = ir.ImageU8Type(f32)
		if aug != nil {
			in.Type = ir.ImageU8Type(ir.F32Batched(aug.C, aug.H, aug.W))
			f.aug = aug
		}
		f.image = in
		for _, r := range f.readers[in] {
			if !fusableConv(r) {
				n := f.g.NewNode(ir.OpToTensor, in.Name, ir.Forward, in.Pos, []*ir.Value{in}, []string{in.Name + ".f32"}, ir.RoleActivation)
				n.Attrs.Aug = aug
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
	switch {
	case fusableConv(n):
		if out = f.convTanhPool(n); out == nil {
			out = f.convBlock(n)
		}
	case n.Op == ir.OpLinear:
		if out = f.linearCrossEntropy(n); out == nil {
			out = f.linearBlock(n)
		}
	case n.Op == ops.BatchNorm2D || n.Op == ops.BatchNorm1D:
		out = f.batchNormReLU(n)
	case n.Op == ir.OpCrossEntropy:
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
		if part := f.bnPart[n]; part != nil {
			ins = append(ins, part)
		}
		var names []string
		for _, o := range n.Outs {
			names = append(names, o.Name)
		}
		stats := f.directConvStats(n)
		if stats != nil {
			names = append(names, n.Out().Name+".bnpart")
		}
		out = f.g.NewNode(n.Op, n.Name, ir.Forward, n.Pos, ins, names, ir.RoleActivation)
		out.Attrs = n.Attrs
		for i, o := range n.Outs {
			f.repl[o] = out.Outs[i]
		}
		if stats != nil {
			out.Attrs.BNStats = true
			out.Outs[1].Pos = n.Out().Pos
			f.setBNPart(stats, out.Outs[1])
		}
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

// convBlock fuses conv2d [-> relu or another pointwise activation]
// [-> maxpool2d] into one conv2d_block. Like linearBlock, an activation
// whose gradient reads its input has the block also write the
// pre-activation output (Attrs.SaveAct, the block's last output, named as
// the conv's output was). A max-pool joins the block after any of them:
// after ReLU or an activation whose derivative reads its output (sigmoid,
// tanh, leaky_relu with a positive slope) f'(·) at the argmax comes from
// the pooled y; after gelu, silu or hardswish the saved z is pooled-size,
// z at each pooled output's argmax (ops/conv_block.go).
func (f *fuser) convBlock(n *ir.Node) *ir.Node {
	a, ins, last := f.blockStart(n)
	if r := f.onlyPointwise(n.Out()); !a.ReLU && r != nil {
		a.Act, a.Alpha = r.Op, r.Attrs.Alpha
		a.SaveAct = ops.LinearSavesPre(&a) && !f.g.ForwardOnly()
		f.absorbed[r] = true
		last = r
	}
	last, outs := f.foldMaxPool(last, &a)
	stats := f.onlyBatchNorm(last.Out())
	if a.BNStats = a.Pool == nil && stats != nil; a.BNStats {
		outs = append(outs, last.Out().Name+".bnpart")
	}
	if a.SaveAct { // z, the last output
		outs = append(outs, n.Out().Name)
	}
	b := f.g.NewNode(ir.OpConvBlock, n.Name, ir.Forward, n.Pos, ins, outs, ir.RoleActivation)
	if ins[0] == f.image {
		a.Aug = f.aug
	}
	b.Attrs = a
	f.replaceOutput(last, b)
	if a.BNStats {
		f.setBNPart(stats, b.Outs[1])
	}
	if a.SaveAct {
		b.Outs[len(b.Outs)-1].Pos = n.Out().Pos
	}
	return b
}

// setBNPart records that part, a conv's second output, holds the
// statistics' partials that batchnorm_stats node stats merges (its fifth
// input).
func (f *fuser) setBNPart(stats *ir.Node, part *ir.Value) {
	if f.bnPart == nil {
		f.bnPart = map[*ir.Node]*ir.Value{}
	}
	f.bnPart[stats] = part
}

// directConvStats returns the statistics node of the batch norm that is
// the only reader of conv2d n's output when n runs the direct kernels (a
// grouped, depthwise or dilated conv, which no block takes), in a
// training graph, or nil: such a conv, unfused, writes the statistics'
// partials as its second output (Attrs.BNStats) like a conv block.
func (f *fuser) directConvStats(n *ir.Node) *ir.Node {
	if n.Op != ir.OpConv2D || fusableConv(n) {
		return nil
	}
	return f.onlyBatchNorm(n.Out())
}

// foldMaxPool folds a max-pool of at most MaxFusedPoolWindow values that
// is the only reader of last's output into the block whose attributes are
// a (Attrs.Pool; Attrs.NoArgmax in a forward-only graph, where no backward
// reads the argmax). It returns the node whose output the block now stands
// for and the names of the block's first outputs: that output and, with
// an argmax, the argmax.
func (f *fuser) foldMaxPool(last *ir.Node, a *ir.Attrs) (*ir.Node, []string) {
	if p := f.only(last.Out(), ir.OpMaxPool2D); p != nil && p.Attrs.Kernel[0]*p.Attrs.Kernel[1] <= MaxFusedPoolWindow {
		a.Pool = &ir.Window{Kernel: p.Attrs.Kernel, Stride: p.Attrs.Stride, Pad: p.Attrs.Pad}
		a.NoArgmax = f.g.ForwardOnly()
		f.absorbed[p] = true
		last = p
	}
	outs := []string{last.Out().Name}
	if a.Pool != nil && !a.NoArgmax {
		outs = append(outs, last.Out().Name+".argmax")
	}
	return last, outs
}

// onlyBatchNorm returns the statistics node of the batch norm that is v's
// only reader — its batchnorm_stats and the normalisation reading those
// statistics, nothing else — in a training graph (evaluation and inference
// use the running statistics), or nil.
func (f *fuser) onlyBatchNorm(v *ir.Value) *ir.Node {
	rs := f.readers[v]
	if f.g.ForwardOnly() || len(rs) != 2 || v == f.g.Loss || rs[0].Op != ops.BatchNormStats || rs[0].Ins[0] != v || len(rs[0].Ins) != 4 {
		return nil
	}
	apply := rs[1]
	if (apply.Op != ops.BatchNorm2D) || apply.Ins[0] != v || apply.Ins[1] != rs[0].Outs[0] {
		return nil
	}
	return rs[0]
}

// convTanhPool fuses conv2d -> tanh -> avgpool2d (each the only reader of
// the one before) into one conv2d_tanh_avgpool block, or returns nil. The
// block saves its full-resolution tanh output for the backward only when
// its input needs a gradient (it does not read the image): otherwise the
// weight gradient recomputes it, and neither the conv output nor its
// gradient ever exists. An augmented image stays with the conv blocks,
// whose loads apply the augmentation, and so does a conv with a weight row
// longer than ops.MaxConvTanhPoolTaps.
func (f *fuser) convTanhPool(n *ir.Node) *ir.Node {
	t := f.only(n.Out(), ops.Tanh)
	if t == nil {
		return nil
	}
	p := f.only(t.Out(), ir.OpAvgPool2D)
	if p == nil || (n.Ins[0] == f.image && f.aug != nil) || convTaps(n) > ops.MaxConvTanhPoolTaps {
		return nil
	}
	a := ir.Attrs{Out: n.Attrs.Out, Kernel: n.Attrs.Kernel, Stride: n.Attrs.Stride, Pad: n.Attrs.Pad, Bias: len(n.Ins) > 2,
		Pool: &ir.Window{Kernel: p.Attrs.Kernel, Stride: p.Attrs.Stride, Pad: p.Attrs.Pad}}
	a.SaveAct = n.Ins[0] != f.image && !f.g.ForwardOnly()
	ins := append([]*ir.Value{f.val(n.Ins[0])}, n.Ins[1:]...)
	outs := []string{p.Out().Name}
	if a.SaveAct {
		outs = append(outs, t.Out().Name)
	}
	b := f.g.NewNode(ops.ConvTanhPoolOp, n.Name, ir.Forward, n.Pos, ins, outs, ir.RoleActivation)
	b.Attrs = a
	f.absorbed[t], f.absorbed[p] = true, true
	f.replaceOutput(p, b)
	if a.SaveAct {
		b.Outs[1].Pos = t.Out().Pos
	}
	return b
}

// convTaps is conv n's weight row length: its input channels (u8 HWC
// images: the last dimension) times its kernel window.
func convTaps(n *ir.Node) int64 {
	x := n.Ins[0].Type
	c := x.Dims[0]
	if x.DType == ir.U8 {
		c = x.Dims[len(x.Dims)-1]
	}
	return c * n.Attrs.Kernel[0] * n.Attrs.Kernel[1]
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

// linearBlock fuses linear [-> relu or another pointwise activation] into
// one linear_block: the activation in the epilogue (Attrs.ReLU, Attrs.Act),
// and, when the activation's gradient reads its input, the pre-activation
// output saved as the block's second output (Attrs.SaveAct; not in a
// forward-only graph), named as the linear's output was.
func (f *fuser) linearBlock(n *ir.Node) *ir.Node {
	a, ins, last := f.blockStart(n)
	if r := f.onlyPointwise(n.Out()); !a.ReLU && r != nil {
		a.Act, a.Alpha = r.Op, r.Attrs.Alpha
		a.SaveAct = ops.LinearSavesPre(&a) && !f.g.ForwardOnly()
		f.absorbed[r] = true
		last = r
	}
	outs := []string{last.Out().Name}
	if a.SaveAct {
		outs = append(outs, n.Out().Name)
	}
	b := f.g.NewNode(ir.OpLinearBlock, n.Name, ir.Forward, n.Pos, ins, outs, ir.RoleActivation)
	b.Attrs = a
	f.replaceOutput(last, b)
	if a.SaveAct {
		b.Outs[1].Pos = n.Out().Pos
	}
	return b
}

// onlyPointwise returns v's single reader when it is a pointwise activation
// other than ReLU (ops.PointwiseOf), or nil.
func (f *fuser) onlyPointwise(v *ir.Value) *ir.Node {
	if rs := f.readers[v]; len(rs) == 1 && ops.PointwiseOf(rs[0].Op) != nil {
		return f.only(v, rs[0].Op)
	}
	return nil
}

// linearCrossEntropy fuses the classifier tail — a linear layer whose
// only reader is the cross_entropy loss — into one linear_cross_entropy
// node of the training graph: the logits, the loss, the correct count, the
// input gradient and the weight gradient with the update fused, in one
// single-block kernel (compiler/ops/linear_cross_entropy.go). Only when
// the layer is small enough for one block (ops.LinearCrossEntropyFits at
// the step's batch) and does not read the image; evaluation and inference
// graphs keep linear_block and softmax_cross_entropy. With gradient
// clipping the node writes dW and dB (the updates follow the norm); a
// data-parallel rank or a micro-batch loop gets that form from the
// planner's splitUpdate, as any weight gradient's.
func (f *fuser) linearCrossEntropy(n *ir.Node) *ir.Node {
	g := f.g
	ce := f.only(n.Out(), ir.OpCrossEntropy)
	if g.ForwardOnly() || ce == nil || n.Ins[0] == f.image || len(n.Ins[1].Type.Dims) != 2 {
		return nil
	}
	w := n.Ins[1].Type
	if !ops.LinearCrossEntropyFits(f.ctx.Train.Batch, w.Dims[1], w.Dims[0]) {
		return nil
	}
	a := ir.Attrs{Out: n.Attrs.Out, Bias: len(n.Ins) > 2, Smoothing: ce.Attrs.Smoothing, InputGrad: needsGrad(n.Ins[0])}
	x := f.val(n.Ins[0])
	ins := append([]*ir.Value{x}, n.Ins[1:]...)
	ins = append(ins, f.val(ce.Ins[1]))
	outs := []string{ce.Out().Name, n.Out().Name, ce.Name + ".correct"}
	if a.InputGrad {
		outs = append(outs, n.Ins[0].Name+".grad")
	}
	params := n.Ins[1:]
	if g.ClipGradNorm > 0 {
		// clipping reads every gradient before any update: the tail writes them
		for _, p := range params {
			outs = append(outs, p.Name+".grad")
		}
	} else {
		a.Opt = g.Opt
		ins = append(ins, params...)
		for _, p := range params {
			ins = append(ins, p.Param.State...)
		}
	}
	t := g.NewNode(ops.LinearCrossEntropyOp, n.Name, ir.Forward, n.Pos, ins, outs, ir.RoleActivation)
	t.Attrs = a
	t.Outs[0].Role, t.Outs[0].Pos = ir.RoleLoss, ce.Out().Pos
	t.Outs[2].Pos = ce.Out().Pos // the correct count is the loss's, as softmax_cross_entropy's
	k := 3
	if a.InputGrad {
		t.Outs[3].Role = ir.RoleActGrad
		k = 4
	}
	for i, p := range params {
		if g.ClipGradNorm > 0 {
			t.Outs[k+i].Role, t.Outs[k+i].Param = ir.RoleGrad, p.Param
		}
	}
	f.absorbed[ce] = true
	f.repl[n.Out()], f.repl[ce.Out()] = t.Outs[1], t.Outs[0]
	g.Loss, g.Logits = t.Outs[0], t.Outs[1]
	return t
}

// needsGrad says whether a gradient flows into v: some parameter lies
// upstream of it.
func needsGrad(v *ir.Value) bool {
	seen := map[*ir.Value]bool{}
	var walk func(v *ir.Value) bool
	walk = func(v *ir.Value) bool {
		if v == nil || seen[v] {
			return false
		}
		seen[v] = true
		if v.Role == ir.RoleParam {
			return true
		}
		if v.Def == nil {
			return false
		}
		for _, in := range v.Def.Ins {
			if walk(in) {
				return true
			}
		}
		return false
	}
	return walk(v)
}

// batchNormReLU copies batch norm's normalisation n, with a ReLU that is
// its only reader folded in (Attrs.ReLU), or another pointwise activation
// (Attrs.Act, ops.PointwiseOf): one elementwise kernel instead of two, and
// the normalised values before the activation never exist. A batchnorm2d
// whose (activated) output only a max-pool of at most MaxFusedPoolWindow
// values reads takes the pool too (Attrs.Pool), as a conv block does: it
// writes the pooled output and, in a training graph, the packed argmax
// (named after the pool's output), and the full-resolution normalised
// values never exist. Its statistics node stays before it
// (compiler/ops/batchnorm.go).
func (f *fuser) batchNormReLU(n *ir.Node) *ir.Node {
	last := n
	a := n.Attrs
	if r := f.only(n.Out(), ir.OpReLU); r != nil {
		a.ReLU = true
		f.absorbed[r] = true
		last = r
	} else if r := f.onlyPointwise(n.Out()); r != nil {
		a.Act, a.Alpha = r.Op, r.Attrs.Alpha
		f.absorbed[r] = true
		last = r
	}
	outs := []string{last.Out().Name}
	if n.Op == ops.BatchNorm2D {
		last, outs = f.foldMaxPool(last, &a)
	}
	ins := make([]*ir.Value, len(n.Ins))
	for i, v := range n.Ins {
		ins[i] = f.val(v)
		if v == f.image {
			ins[i] = f.tensor
		}
	}
	b := f.g.NewNode(n.Op, n.Name, ir.Forward, n.Pos, ins, outs, ir.RoleActivation)
	b.Attrs = a
	f.replaceOutput(last, b)
	return b
}

// backward derives the fused backward phase with autodiff's engine over
// the fused forward nodes: the fused ops' rules emit each block's
// grad_input (with the ReLU mask of the block before it where it can take
// it) and its weight gradient with the update fused. A parameter whose
// gradient an unfused op computes gets a separate update after the
// backward phase.
func (f *fuser) backward() error {
	g := f.g
	b := newGradBuilder(g, f.blocks)
	partial, err := reverse(b, f.blocks, g.Loss)
	if err != nil {
		return fmt.Errorf("fuse: %v", err)
	}
	var updates []*ir.Param
	grads := map[*ir.Param]*ir.Value{}
	for _, p := range g.Params {
		if parts := partial[p.Value]; len(parts) > 0 {
			grads[p] = sumGradients(b, parts[len(parts)-1].Def, p.Value, parts)
			updates = append(updates, p)
		}
	}
	return addUpdates(f.ctx, g, updates, grads)
}
