// Package kernelcases builds the IR nodes kernel tests check: every fused conv and linear block
// variant on odd shapes, pools, elementwise ops, the loss, standalone updates and dropout, and
// inputs as the forward pass would produce them (argmax pointing inside the conv output).
//
// In:  a *testing.T and the case tables below.
// Out: typed one-node graphs for kernelcheck.Node, each with the reference options its check
// needs.
//
// Why here: a target's kernel tests (codegen/cpu; codegen's CUDA tests build the same cases in
// their own files) check every kernel family on the same shapes, so both targets are held to one
// set of cases.
package kernelcases

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
)

// Case is one node to check with the reference options it needs.
type Case struct {
	Name string
	N    *ir.Node
	O    reference.NodeOptions
}

// LR is the learning rate of every optimizer below: kernelcheck.Scalars.LR must equal it (the
// reference reads Optimizer.LR).
const LR = 0.05

// Window makes a pooling window.
func Window(k, s, p [2]int64) *ir.Window { return &ir.Window{Kernel: k, Stride: s, Pad: p} }

var (
	k1 = [2]int64{1, 1}
	k2 = [2]int64{2, 2}
	k3 = [2]int64{3, 3}
	k5 = [2]int64{5, 5}
	p0 = [2]int64{0, 0}
	p1 = [2]int64{1, 1}
	s1 = [2]int64{1, 1}
	s2 = [2]int64{2, 2}
)

func sgd(mom float64, nesterov bool, wd float64) *ir.Optimizer {
	return &ir.Optimizer{Kind: ir.SGD, LR: LR, Momentum: mom, Nesterov: nesterov, WeightDecay: wd}
}

func adam(kind ir.OptimizerKind, b1, b2, eps, wd float64) *ir.Optimizer {
	return &ir.Optimizer{Kind: kind, LR: LR, Beta1: b1, Beta2: b2, Eps: eps, WeightDecay: wd}
}

// Optimizers are every fused and standalone update variant.
var Optimizers = []*ir.Optimizer{
	sgd(0, false, 0), sgd(0.9, false, 0), sgd(0.8, true, 0.01), sgd(0.9, true, 0.01),
	adam(ir.Adam, 0.9, 0.999, 1e-8, 0.1), adam(ir.Adam, 0.9, 0.999, 1e-8, 0), adam(ir.AdamW, 0.85, 0.99, 1e-6, 0.01),
}

// Typed creates node op over ins in g and types its outputs with the op's rule.
func Typed(t testing.TB, g *ir.Graph, op ir.Op, name string, attrs ir.Attrs, ins []*ir.Value, outs ...string) *ir.Node {
	t.Helper()
	n := g.NewNode(op, name, ir.Backward, dsl.Pos{}, ins, outs, ir.RoleActivation)
	n.Attrs = attrs
	types, err := op.Info().Infer(n)
	require.NoError(t, err, n.Text())
	require.Len(t, types, len(outs))
	for i, ty := range types {
		n.Outs[i].Type = ty
	}
	return n
}

// Node builds a one-node graph: op over inputs of the given types.
func Node(t testing.TB, op ir.Op, attrs ir.Attrs, ins ...ir.Type) *ir.Node {
	t.Helper()
	g := ir.NewGraph("T")
	var vals []*ir.Value
	for i, ty := range ins {
		vals = append(vals, g.NewValue(string(rune('a'+i)), ty, ir.RoleActivation, dsl.Pos{}))
	}
	return Typed(t, g, op, op.String(), attrs, vals, "out")
}

// NewState gives p fresh optimizer state values (replacing any earlier).
func NewState(g *ir.Graph, p *ir.Param, opt *ir.Optimizer) []*ir.Value {
	p.State = nil
	for _, s := range opt.StateNames() {
		v := g.NewValue(p.Name+"."+s, p.Value.Type, ir.RoleOptState, dsl.Pos{})
		v.Param = p
		p.State = append(p.State, v)
	}
	return p.State
}

// ---- convolution blocks ----

// Conv is one conv block configuration.
type Conv struct {
	C, H, W         int64 // input channels and size
	U8              bool  // the input is the u8 HWC image
	Out             int64
	K, S, P         [2]int64
	Bias, ReLU      bool
	Pool            *ir.Window
	Masked, MaskOut bool          // backward: dOut already masked; dX masked by the input
	NoArgmax        bool          // forward of an inference graph: a pooled block keeps no argmax
	Opt             *ir.Optimizer // weight gradient: the fused update (nil: gradients out)
	// Act and Alpha: an activation other than ReLU folded in (Attrs.Act), its gradient reading
	// y, or z when the block saves it (ops.LinearSavesPre)
	Act   ir.Op
	Alpha float64
}

func (c Conv) String() string {
	s := fmt.Sprintf("x%dx%dx%d", c.C, c.H, c.W)
	if c.U8 {
		s += "u8"
	}
	s += fmt.Sprintf("_o%d_k%dx%d_s%dx%d_p%dx%d", c.Out, c.K[0], c.K[1], c.S[0], c.S[1], c.P[0], c.P[1])
	for _, f := range []struct {
		on   bool
		name string
	}{{c.Bias, "_bias"}, {c.ReLU, "_relu"}} {
		if f.on {
			s += f.name
		}
	}
	if c.Act != 0 {
		s += fmt.Sprintf("_%s%g", c.Act, c.Alpha)
	}
	if w := c.Pool; w != nil {
		s += fmt.Sprintf("_pool%dx%ds%dx%dp%dx%d", w.Kernel[0], w.Kernel[1], w.Stride[0], w.Stride[1], w.Pad[0], w.Pad[1])
	}
	if c.NoArgmax {
		s += "_noargmax"
	}
	if c.Masked {
		s += "_masked"
	}
	if c.MaskOut {
		s += "_maskout"
	}
	if c.Opt != nil {
		s += "_" + c.Opt.String()
	}
	return s
}

func (c Conv) attrs() ir.Attrs {
	a := ir.Attrs{Out: c.Out, Kernel: c.K, Stride: c.S, Pad: c.P, Bias: c.Bias, ReLU: c.ReLU, Pool: c.Pool, NoArgmax: c.NoArgmax && c.Pool != nil,
		Act: c.Act, Alpha: c.Alpha}
	a.SaveAct = ops.LinearSavesPre(&a) && !a.NoArgmax
	return a
}

// F32 is c with an f32 input (input gradients exist only for f32 inputs).
func (c Conv) F32() Conv {
	c.U8 = false
	return c
}

type convGraph struct {
	g    *ir.Graph
	x    *ir.Value
	w, b *ir.Param
}

func (c Conv) graph() *convGraph {
	g := ir.NewGraph("T")
	x := ir.F32Batched(c.C, c.H, c.W)
	if c.U8 {
		x = ir.ImageU8Type(x)
	}
	cg := &convGraph{g: g, x: g.AddInput("x", x, ir.RoleInput, dsl.Pos{})}
	cg.w = g.AddParam("conv", "weight", ir.Init{}, dsl.Pos{})
	cg.w.Value.Type = ir.F32Fixed(c.Out, c.C, c.K[0], c.K[1])
	if c.Bias {
		cg.b = g.AddParam("conv", "bias", ir.Init{}, dsl.Pos{})
		cg.b.Value.Type = ir.F32Fixed(c.Out)
	}
	return cg
}

func (cg *convGraph) value(name string, t ir.Type) *ir.Value {
	return cg.g.NewValue(name, t, ir.RoleActivation, dsl.Pos{})
}

// ConvForward is c's conv2d_block.
func ConvForward(t testing.TB, c Conv) *ir.Node {
	cg := c.graph()
	ins := []*ir.Value{cg.x, cg.w.Value}
	if c.Bias {
		ins = append(ins, cg.b.Value)
	}
	outs := []string{"y"}
	if c.Pool != nil && !c.NoArgmax {
		outs = append(outs, "y.argmax")
	}
	if c.attrs().SaveAct {
		outs = append(outs, "z")
	}
	return Typed(t, cg.g, ir.OpConvBlock, "conv", c.attrs(), ins, outs...)
}

// backwardInputs are dOut, then argmax and y when the layout has them.
func (c Conv) backwardInputs(t testing.TB, cg *convGraph) []*ir.Value {
	plain := c
	plain.Masked, plain.MaskOut, plain.Opt = false, false, nil
	fwd := ConvForward(t, plain)
	ins := []*ir.Value{cg.value("dout", fwd.Outs[0].Type)}
	if c.Pool != nil {
		ins = append(ins, cg.value("argmax", fwd.Outs[1].Type))
	}
	if (c.ReLU && !c.Masked) || c.Act != 0 {
		ins = append(ins, cg.value("y", fwd.Outs[0].Type)) // y, or z for an activation whose gradient reads it
	}
	return ins
}

// ConvGradInput is c's conv2d_block_grad_input.
func ConvGradInput(t testing.TB, c Conv) *ir.Node {
	cg := c.graph()
	bw := c.backwardInputs(t, cg)
	ins := append([]*ir.Value{bw[0], cg.w.Value}, bw[1:]...)
	if c.MaskOut {
		ins = append(ins, cg.value("xmask", cg.x.Type))
	}
	a := c.attrs()
	a.DOutMasked, a.MaskOut, a.Dims = c.Masked, c.MaskOut, []int64{c.C, c.H, c.W}
	return Typed(t, cg.g, ir.OpConvBlockGradInput, "conv", a, ins, "dx")
}

// ConvGradWeight is c's conv2d_block_grad_weight, its update fused when c.Opt is set.
func ConvGradWeight(t testing.TB, c Conv) *ir.Node {
	cg := c.graph()
	bw := c.backwardInputs(t, cg)
	ins := append([]*ir.Value{bw[0], cg.x}, bw[1:]...)
	var outs []string
	if c.Opt == nil {
		outs = []string{"dw"}
		if c.Bias {
			outs = append(outs, "db")
		}
	} else {
		params := []*ir.Param{cg.w}
		if c.Bias {
			params = append(params, cg.b)
		}
		for _, p := range params {
			ins = append(ins, p.Value)
		}
		for _, p := range params {
			ins = append(ins, NewState(cg.g, p, c.Opt)...)
		}
	}
	a := c.attrs()
	a.DOutMasked, a.Opt = c.Masked, c.Opt
	return Typed(t, cg.g, ir.OpConvBlockGradWeight, "conv", a, ins, outs...)
}

// ConvCases cover u8 images, odd sizes and channel counts (register-tile tails), kernels 1,
// 2x3, 3, 5 and 7, strides (larger than the kernel too: pixels no output reads, stride phases
// without taps), padding, and pools that overlap, are padded, rectangular, leave conv rows
// unread, or have rows wider than a task's argmax words.
var ConvCases = []Conv{
	{C: 3, H: 13, W: 11, U8: true, Out: 5, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: Window(k2, s2, p0)},
	{C: 1, H: 28, W: 28, U8: true, Out: 8, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: Window(k2, s2, p0)},
	{C: 17, H: 7, W: 5, Out: 17, K: k3, S: s1, P: p1, ReLU: true, Pool: Window(k3, s2, p1)},
	{C: 5, H: 13, W: 11, Out: 8, K: k5, S: s2, P: [2]int64{2, 2}, Bias: true},
	{C: 3, H: 9, W: 7, Out: 33, K: k1, S: s1, P: p0, Bias: true, ReLU: true},
	{C: 4, H: 11, W: 13, Out: 6, K: [2]int64{2, 3}, S: [2]int64{2, 1}, P: [2]int64{1, 0}, Bias: true, ReLU: true, Pool: Window([2]int64{3, 2}, [2]int64{1, 2}, [2]int64{1, 0})},
	{C: 8, H: 14, W: 14, Out: 16, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: Window(k2, s2, p0)},
	{C: 2, H: 12, W: 10, Out: 3, K: [2]int64{7, 7}, S: s1, P: [2]int64{3, 3}, Bias: true, Pool: Window(k2, s2, p0)},
	{C: 70, H: 5, W: 6, Out: 70, K: k3, S: s1, P: p1, ReLU: true},
	{C: 5, H: 13, W: 11, Out: 40, K: k3, S: s2, P: p1, Bias: true, ReLU: true, Pool: Window(k3, s2, p1)},
	{C: 3, H: 7, W: 5, U8: true, Out: 4, K: k2, S: s1, P: p0, ReLU: true, Pool: Window([2]int64{2, 1}, [2]int64{2, 1}, p0)},
	{C: 6, H: 9, W: 10, Out: 5, K: k1, S: s2, P: p0, Bias: true},
	{C: 4, H: 11, W: 8, Out: 9, K: k2, S: [2]int64{3, 2}, P: p0, ReLU: true},
	{C: 2, H: 9, W: 41, Out: 3, K: k3, S: s1, P: p1, Bias: true, ReLU: true, Pool: Window(k2, s2, p0)},
	{C: 1, H: 5, W: 45, Out: 2, K: k3, S: s1, P: p1, Pool: Window(k3, s2, p1)},
	// SimpleCNN's first block, cut down: u8 RGB, rows of 126 conv outputs (vector tails), 2x2 pool
	{C: 3, H: 20, W: 128, U8: true, Out: 16, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: Window(k2, s2, p0)},
	// a padded stride-3 conv under a u8 image, a 3x3/3 pool
	{C: 3, H: 17, W: 19, U8: true, Out: 7, K: k3, S: [2]int64{3, 3}, P: [2]int64{2, 1}, Bias: true, ReLU: true, Pool: Window(k3, [2]int64{3, 3}, p0)},
}

// ConvChecks are the forward, input-gradient and weight-gradient checks of every conv case:
// each backward as after a non-ReLU reader (y masks dOut) and after a maskout reader (dOut
// arrives masked) with its own input masked too; the weight gradient with its gradients out and
// with the update fused, at the first step (SGD's momentum buffer starts as the gradient) and a
// later one.
func ConvChecks(t testing.TB) []Case {
	var checks []Case
	for i, c := range ConvCases {
		checks = append(checks, Case{Name: "fwd " + c.String(), N: ConvForward(t, c)})
		plain, masked := c.F32(), c.F32()
		masked.Masked, masked.MaskOut = c.ReLU, true
		for _, v := range []Conv{plain, masked} {
			checks = append(checks, Case{Name: "dgrad " + v.String(), N: ConvGradInput(t, v)})
		}
		grads := c
		grads.Masked = c.ReLU && i%2 == 1
		checks = append(checks, Case{Name: "wgrad " + grads.String(), N: ConvGradWeight(t, grads)})
		fused := c
		fused.Opt = Optimizers[i%len(Optimizers)]
		n := ConvGradWeight(t, fused)
		for _, step := range []int64{0, 3} {
			checks = append(checks, Case{Name: fmt.Sprintf("wgrad %s step %d", fused, step), N: n, O: reference.NodeOptions{Update: true, Step: step}})
		}
	}
	return checks
}

// ConvActCases are conv blocks for the activations of LinearActs (odd sizes and channel
// counts, u8 images, strides, padding, 1x1 and 64-row tiles; pools that overlap, are padded or
// rectangular — for an activation whose gradient reads z, the forward writes z at the argmax).
var ConvActCases = []Conv{
	{C: 3, H: 13, W: 11, U8: true, Out: 5, K: k3, S: s1, P: p1, Bias: true, Pool: Window(k2, s2, p0)},
	{C: 5, H: 9, W: 7, Out: 9, K: [2]int64{2, 3}, S: [2]int64{2, 1}, P: [2]int64{1, 0}},
	{C: 17, H: 7, W: 5, Out: 40, K: k3, S: s2, P: p1, Bias: true, Pool: Window(k3, s2, p1)},
	{C: 3, H: 9, W: 7, Out: 33, K: k1, S: s1, P: p0, Bias: true},
	{C: 4, H: 11, W: 13, Out: 6, K: [2]int64{2, 3}, S: [2]int64{2, 1}, P: [2]int64{1, 0}, Pool: Window([2]int64{3, 2}, [2]int64{1, 2}, [2]int64{1, 0})},
}

// ConvActChecks are conv blocks with each of LinearActs folded in: forward (f, and z where
// saved), input gradient (with and without maskout) and weight gradient (gradients out, and a
// fused update at a later step), on two of ConvActCases each.
func ConvActChecks(t testing.TB) []Case {
	var checks []Case
	for ai, a := range LinearActs {
		for j := 0; j < 2; j++ {
			c := ConvActCases[(ai+j)%len(ConvActCases)]
			c.Act, c.Alpha = a.Op, a.Alpha
			checks = append(checks, Case{Name: "fwd " + c.String(), N: ConvForward(t, c)})
			d := c.F32()
			d.MaskOut = j == 1
			checks = append(checks, Case{Name: "dgrad " + d.String(), N: ConvGradInput(t, d)})
			if j == 0 {
				checks = append(checks, Case{Name: "wgrad " + c.String(), N: ConvGradWeight(t, c)})
			} else {
				c.Opt = Optimizers[ai%len(Optimizers)]
				checks = append(checks, Case{Name: "wgrad " + c.String() + " step 3", N: ConvGradWeight(t, c), O: reference.NodeOptions{Update: true, Step: 3}})
			}
		}
	}
	return checks
}

// DirectConv is one unfused conv2d configuration (the direct kernels: grouped, depthwise,
// dilated).
type DirectConv struct {
	C, H, W, Out int64
	K, S, P, D   [2]int64
	Groups       int64
	Bias         bool
}

func (c DirectConv) String() string {
	return fmt.Sprintf("x%dx%dx%d_o%d_k%dx%d_s%dx%d_p%dx%d_d%dx%d_g%d", c.C, c.H, c.W, c.Out, c.K[0], c.K[1], c.S[0], c.S[1], c.P[0], c.P[1], c.D[0], c.D[1], c.Groups)
}

// DirectConvCases: depthwise (stride 1 and 2, a channel multiplier), grouped with rectangular
// windows and strides, dilated (rows and columns apart), everything at once, 1x1 grouped, and
// rows long enough for vector loops with their tails (33 columns); padding wider than the
// window's reach leaves output columns no tap reads; many small planes make tasks of several.
var DirectConvCases = []DirectConv{
	{C: 5, H: 9, W: 11, Out: 5, K: k3, S: s2, P: p1, D: s1, Groups: 5},
	{C: 3, H: 7, W: 13, Out: 6, K: k3, S: s1, P: p1, D: s1, Groups: 3, Bias: true},
	{C: 6, H: 10, W: 9, Out: 4, K: [2]int64{3, 2}, S: [2]int64{1, 2}, P: [2]int64{1, 0}, D: s1, Groups: 2, Bias: true},
	{C: 3, H: 12, W: 11, Out: 5, K: k3, S: s1, P: [2]int64{2, 1}, D: [2]int64{2, 3}, Groups: 1},
	{C: 4, H: 13, W: 17, Out: 8, K: [2]int64{3, 5}, S: s2, P: [2]int64{2, 4}, D: [2]int64{2, 2}, Groups: 4, Bias: true},
	{C: 8, H: 5, W: 6, Out: 12, K: k1, S: s1, P: p0, D: s1, Groups: 4},
	{C: 16, H: 33, W: 33, Out: 16, K: k3, S: s1, P: p1, D: s1, Groups: 16, Bias: true},
	{C: 2, H: 6, W: 7, Out: 2, K: k2, S: [2]int64{3, 3}, P: [2]int64{3, 3}, D: [2]int64{2, 1}, Groups: 2},
	// many small planes: tasks of several planes (weight rows, channels), the last one short
	{C: 35, H: 5, W: 6, Out: 35, K: k3, S: s1, P: p1, D: s1, Groups: 35, Bias: true},
}

// DirectConvChecks are the forward, input-gradient, weight-gradient and (with a bias)
// bias-gradient nodes of every direct conv case.
func DirectConvChecks(t testing.TB) []Case {
	var checks []Case
	for _, c := range DirectConvCases {
		a := ir.Attrs{Out: c.Out, Kernel: c.K, Stride: c.S, Pad: c.P, Dilation: c.D, Groups: c.Groups}
		x := ir.F32Batched(c.C, c.H, c.W)
		w := ir.ConvWeightType(a, x)
		ins := []ir.Type{x, w}
		if c.Bias {
			ins = append(ins, ir.F32Fixed(c.Out))
		}
		fwd := Node(t, ir.OpConv2D, a, ins...)
		y := fwd.Out().Type
		ga := a
		ga.Dims = x.Dims
		checks = append(checks,
			Case{Name: "direct fwd " + c.String(), N: fwd},
			Case{Name: "direct dgrad " + c.String(), N: Node(t, ir.OpConv2DGradInput, ga, y, w)},
			Case{Name: "direct wgrad " + c.String(), N: Node(t, ir.OpConv2DGradWeight, a, y, x)})
		if c.Bias {
			checks = append(checks, Case{Name: "direct bgrad " + c.String(), N: Node(t, ir.OpConv2DGradBias, ir.Attrs{}, y)})
		}
	}
	return checks
}

// ConvInferChecks are the forward checks of every pooled conv case as an
// inference graph has it (cnnc build --infer): no argmax output. Then each
// activation of LinearActs on a pooled ConvActCases case (in turn): those
// whose gradient reads z save none there.
func ConvInferChecks(t testing.TB) []Case {
	var checks []Case
	for _, c := range ConvCases {
		if c.Pool != nil {
			c.NoArgmax = true
			checks = append(checks, Case{Name: "fwd " + c.String(), N: ConvForward(t, c)})
		}
	}
	var pooled []Conv
	for _, c := range ConvActCases {
		if c.Pool != nil {
			pooled = append(pooled, c)
		}
	}
	for ai, a := range LinearActs {
		c := pooled[ai%len(pooled)]
		c.Act, c.Alpha, c.NoArgmax = a.Op, a.Alpha, true
		checks = append(checks, Case{Name: "fwd " + c.String(), N: ConvForward(t, c)})
	}
	return checks
}

// SmoothedLossChecks: softmax cross-entropy with PyTorch's label smoothing (ε of 0.1 and 0.3)
// over 2, 3, 10 and 33 classes. (Not 1: with one class the smoothed loss is lse - (1-ε)·x - ε·x,
// identically 0, so fp32's rounding of x·(1-ε) + x·ε has no magnitude to be relative to.)
func SmoothedLossChecks(t testing.TB) []Case {
	g := ir.NewGraph("T")
	var cases []Case
	for _, classes := range []int64{2, 3, 10, 33} {
		for _, eps := range []float64{0.1, 0.3} {
			logits := g.NewValue(fmt.Sprintf("logits%d_%g", classes, eps), ir.F32Batched(classes), ir.RoleActivation, dsl.Pos{})
			label := g.NewValue(fmt.Sprintf("label%d_%g", classes, eps), ir.Type{DType: ir.Class, Batched: true, Classes: classes}, ir.RoleLabel, dsl.Pos{})
			cases = append(cases, Case{Name: fmt.Sprintf("softmax_cross_entropy c%d label_smoothing %g", classes, eps),
				N: Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{Smoothing: eps}, []*ir.Value{logits, label}, "loss", "dlogits", "correct")})
		}
	}
	return cases
}

// ValidArgmax replaces random argmax inputs of a pooled backward node — a conv block's input or
// weight gradient, or a batch norm's gradient with the max-pool folded in — by window indices
// that point inside the pooled map (as the forward produces them: a padded position is never a
// maximum).
func ValidArgmax(n *ir.Node, ins [][]float64, rng *rand.Rand) {
	if n.Attrs.Pool == nil {
		return
	}
	var argmax *ir.Value
	var h, w int64 // the map the windows pool
	switch n.Op {
	case ir.OpConvBlockGradInput, ir.OpConvBlockGradWeight:
		p, _ := n.Parts()
		var xt ir.Type
		if p.X != nil {
			xt = p.X.Type
			if xt.DType == ir.U8 {
				xt = ir.F32Batched(xt.Dims[2], xt.Dims[0], xt.Dims[1])
			}
		} else {
			xt = ir.F32Batched(n.Attrs.Dims...)
		}
		a := n.Attrs
		h, _ = ir.ConvOut(xt.Dims[1], a.Kernel[0], a.Stride[0], a.Pad[0])
		w, _ = ir.ConvOut(xt.Dims[2], a.Kernel[1], a.Stride[1], a.Pad[1])
		argmax = p.Argmax
	case ops.BatchNormGrad: // x (its second input) is the map; the argmax its last input
		x := n.Ins[1].Type
		h, w = x.Dims[1], x.Dims[2]
		argmax = n.Ins[len(n.Ins)-1]
	default:
		return
	}
	pw := n.Attrs.Pool
	pho, pwo := argmax.Type.Dims[1], argmax.Type.Dims[2]
	for i, v := range n.Ins {
		if v != argmax {
			continue
		}
		for e := range ins[i] {
			py, px := int64(e)/pwo%pho, int64(e)%pwo
			var valid []float64
			for ky := int64(0); ky < pw.Kernel[0]; ky++ {
				for kx := int64(0); kx < pw.Kernel[1]; kx++ {
					cy, cx := py*pw.Stride[0]-pw.Pad[0]+ky, px*pw.Stride[1]-pw.Pad[1]+kx
					if cy >= 0 && cy < h && cx >= 0 && cx < w {
						valid = append(valid, float64(ky*pw.Kernel[1]+kx))
					}
				}
			}
			ins[i][e] = valid[rng.IntN(len(valid))]
		}
	}
}

// ---- linear blocks ----

// Linear is a linear block's values in a test graph.
type Linear struct {
	g             *ir.Graph
	name          string
	in, out       int64
	x, y, dy, xm  *ir.Value
	w, b          *ir.Param
	bias, relu    bool
	Masked, XMask bool
	// Act and Alpha: an activation other than ReLU folded in (Attrs.Act),
	// its gradient reading y, or z when the block saves it
	// (ops.LinearSavesPre); set before Forward.
	Act   ir.Op
	Alpha float64
}

// NewLinear makes a linear block of in -> out features in g.
func NewLinear(g *ir.Graph, name string, in, out int64, bias, relu bool) *Linear {
	l := &Linear{g: g, name: name, in: in, out: out, bias: bias, relu: relu}
	l.x = g.NewValue(name+".x", ir.F32Batched(in), ir.RoleActivation, dsl.Pos{})
	l.y = g.NewValue(name+".y", ir.F32Batched(out), ir.RoleActivation, dsl.Pos{})
	l.dy = g.NewValue(name+".dy", ir.F32Batched(out), ir.RoleActGrad, dsl.Pos{})
	l.xm = g.NewValue(name+".xmask", ir.F32Batched(in), ir.RoleActivation, dsl.Pos{})
	l.w = g.AddParam(name, "weight", ir.Init{}, dsl.Pos{})
	l.w.Value.Type = ir.F32Fixed(out, in)
	if bias {
		l.b = g.AddParam(name, "bias", ir.Init{}, dsl.Pos{})
		l.b.Value.Type = ir.F32Fixed(out)
	}
	return l
}

func (l *Linear) params() []*ir.Param {
	if l.b != nil {
		return []*ir.Param{l.w, l.b}
	}
	return []*ir.Param{l.w}
}

func (l *Linear) attrs() ir.Attrs {
	a := ir.Attrs{Out: l.out, Bias: l.bias, ReLU: l.relu, DOutMasked: l.Masked, MaskOut: l.XMask, Act: l.Act, Alpha: l.Alpha}
	a.SaveAct = ops.LinearSavesPre(&a)
	return a
}

// saved is what the gradients read for the block's activation: y (for
// ReLU's mask unless it arrives masked, or another activation's
// derivative) — a random tensor either way, named y.
func (l *Linear) saved() bool { return (l.relu && !l.Masked) || l.Act != 0 }

// Forward is the block's linear_block.
func (l *Linear) Forward(t testing.TB) *ir.Node {
	ins := []*ir.Value{l.x, l.w.Value}
	if l.bias {
		ins = append(ins, l.b.Value)
	}
	outs := []string{l.name + ".out"}
	if a := l.attrs(); a.SaveAct {
		outs = append(outs, l.name+".z")
	}
	return Typed(t, l.g, ir.OpLinearBlock, l.name, l.attrs(), ins, outs...)
}

// GradInput is the block's linear_block_grad_input.
func (l *Linear) GradInput(t testing.TB) *ir.Node {
	ins := []*ir.Value{l.dy, l.w.Value}
	if l.saved() {
		ins = append(ins, l.y)
	}
	if l.XMask {
		ins = append(ins, l.xm)
	}
	return Typed(t, l.g, ir.OpLinearBlockGradInput, l.name, l.attrs(), ins, l.name+".dx")
}

// GradWeight is the block's linear_block_grad_weight, its update fused when opt != nil (each
// parameter then gets fresh optimizer state).
func (l *Linear) GradWeight(t testing.TB, opt *ir.Optimizer) *ir.Node {
	ins := []*ir.Value{l.dy, l.x}
	if l.saved() {
		ins = append(ins, l.y)
	}
	a := l.attrs()
	a.MaskOut = false
	var outs []string
	if opt == nil {
		outs = []string{l.name + ".dw"}
		if l.bias {
			outs = append(outs, l.name+".db")
		}
	} else {
		a.Opt = opt
		for _, p := range l.params() {
			ins = append(ins, p.Value)
		}
		for _, p := range l.params() {
			ins = append(ins, NewState(l.g, p, opt)...)
		}
	}
	return Typed(t, l.g, ir.OpLinearBlockGradWeight, l.name, a, ins, outs...)
}

// LinearChecks: edge shapes (single features, register-tile and task boundaries, vector tails),
// a random pair, every combination of bias, ReLU, masked and maskout, the weight gradient
// unfused or with each optimizer at the first and a later step. variant varies the choices
// between batches.
// LinearActs are the activations other than ReLU a linear block folds (Attrs.Act, with Alpha),
// a leaky_relu of negative slope among them (its block saves z).
var LinearActs = []struct {
	Op    ir.Op
	Alpha float64
}{{ops.LeakyReLU, 0.2}, {ops.LeakyReLU, -0.3}, {ops.Sigmoid, 0}, {ops.Tanh, 0}, {ops.GELU, 0}, {ops.SiLU, 0}, {ops.HardSwish, 0}}

// LinearActChecks are linear blocks with each of LinearActs folded in: forward (f, and z where
// saved), input gradient (with and without maskout) and weight gradient (unfused and with a fused
// update), two shapes each among an odd one, split-K over in (forward), split-K over out (input
// gradient on the GPU) and N a multiple of 4 (the vectorised epilogues).
func LinearActChecks(t testing.TB) []Case {
	shapes := [][2]int64{{17, 3}, {700, 3}, {5, 300}, {64, 64}}
	g := ir.NewGraph("T")
	var cases []Case
	for ai, a := range LinearActs {
		for j := 0; j < 2; j++ {
			s := shapes[(ai+j)%len(shapes)]
			l := NewLinear(g, fmt.Sprintf("fc%d_%d", ai, j), s[0], s[1], j == 0, false)
			l.Act, l.Alpha = a.Op, a.Alpha
			l.XMask = j == 1
			name := fmt.Sprintf("%dx%d %s(%g) bias=%t maskout=%t", s[0], s[1], a.Op, a.Alpha, j == 0, l.XMask)
			cases = append(cases, Case{Name: "fwd " + name, N: l.Forward(t)}, Case{Name: "dgrad " + name, N: l.GradInput(t)})
			if j == 0 {
				cases = append(cases, Case{Name: "wgrad " + name, N: l.GradWeight(t, nil)})
			} else {
				opt := Optimizers[ai%len(Optimizers)]
				cases = append(cases, Case{Name: fmt.Sprintf("wgrad %s %s step 3", name, opt), N: l.GradWeight(t, opt), O: reference.NodeOptions{Step: 3, Update: true}})
			}
		}
	}
	return cases
}

func LinearChecks(t testing.TB, variant int, rng *rand.Rand) []Case {
	type shape struct{ in, out int64 }
	shapes := []shape{{1, 1}, {3, 17}, {17, 3}, {130, 130}, {700, 3}, {5, 300}, {64, 64}, {1000, 11},
		{1 + rng.Int64N(200), 1 + rng.Int64N(200)}}
	g := ir.NewGraph("T")
	var cases []Case
	for si, s := range shapes {
		for v := 0; v < 8; v++ {
			bias, relu, masked := v&1 != 0, v&2 != 0, v&4 != 0
			if masked && !relu {
				continue // masked only means something for a ReLU block
			}
			l := NewLinear(g, fmt.Sprintf("fc%d_%d", si, v), s.in, s.out, bias, relu)
			l.Masked = masked
			l.XMask = (v+si+variant)%2 == 0
			name := fmt.Sprintf("%dx%d bias=%t relu=%t masked=%t maskout=%t", s.in, s.out, bias, relu, masked, l.XMask)
			if v == 0 || v == 3 || si%2 == 0 {
				cases = append(cases, Case{Name: "fwd " + name, N: l.Forward(t)})
			}
			cases = append(cases, Case{Name: "dgrad " + name, N: l.GradInput(t)})
			k := (v + si + variant) % (len(Optimizers) + 1)
			if k == len(Optimizers) {
				cases = append(cases, Case{Name: "wgrad " + name, N: l.GradWeight(t, nil)})
			} else {
				step := int64(0)
				if (v+si)%2 == 1 {
					step = 4
				}
				cases = append(cases, Case{Name: fmt.Sprintf("wgrad %s %s step %d", name, Optimizers[k], step), N: l.GradWeight(t, Optimizers[k]),
					O: reference.NodeOptions{Step: step, Update: true}})
			}
		}
	}
	for k, opt := range Optimizers {
		for _, step := range []int64{0, 7} {
			l := NewLinear(g, fmt.Sprintf("opt%d_%d", k, step), 37, 19, true, true)
			cases = append(cases, Case{Name: fmt.Sprintf("wgrad 37x19 %s step %d", opt, step), N: l.GradWeight(t, opt), O: reference.NodeOptions{Step: step, Update: true}})
		}
	}
	return cases
}

// ---- pools, elementwise, loss, updates, dropout ----

// PoolChecks are max- and average-pool forward and gradient kernels on odd sizes (rows and
// columns no window reads), overlapping and padded windows, rectangular windows, strides larger
// than the window (gaps), 1x1 windows.
func PoolChecks(t testing.TB) []Case {
	var cases []Case
	for _, c := range []struct {
		c, h, w int64
		k, s, p [2]int64
	}{
		{3, 13, 11, k2, s2, p0}, {5, 7, 5, k3, s2, p1}, {17, 9, 8, [2]int64{3, 2}, [2]int64{1, 2}, [2]int64{1, 0}},
		{2, 6, 7, k1, s1, p0}, {4, 11, 12, k5, [2]int64{3, 3}, [2]int64{2, 2}}, {3, 10, 9, k2, [2]int64{3, 3}, p1},
	} {
		a := ir.Attrs{Kernel: c.k, Stride: c.s, Pad: c.p}
		x := ir.F32Batched(c.c, c.h, c.w)
		name := fmt.Sprintf("%dx%dx%d_k%dx%d_s%dx%d_p%dx%d", c.c, c.h, c.w, c.k[0], c.k[1], c.s[0], c.s[1], c.p[0], c.p[1])
		maxFwd := Node(t, ir.OpMaxPool2D, a, x)
		y := maxFwd.Out().Type
		ga := a
		ga.Dims = x.Dims
		cases = append(cases,
			Case{Name: "maxpool2d " + name, N: maxFwd},
			Case{Name: "avgpool2d " + name, N: Node(t, ir.OpAvgPool2D, a, x)},
			Case{Name: "maxpool2d_grad " + name, N: Node(t, ir.OpMaxPool2DGrad, a, y, x)},
			Case{Name: "avgpool2d_grad " + name, N: Node(t, ir.OpAvgPool2DGrad, ga, y)})
	}
	return cases
}

// ElementwiseChecks: to_tensor, add, relu, relu_grad; large enough for several tasks.
func ElementwiseChecks(t testing.TB) []Case {
	var cases []Case
	for _, d := range [][]int64{{5, 7, 3}, {3, 130, 70}} {
		u8 := ir.Type{DType: ir.U8, Batched: true, Dims: d}
		x := ir.F32Batched(d[2], d[0], d[1])
		cases = append(cases,
			Case{Name: "to_tensor", N: Node(t, ir.OpToTensor, ir.Attrs{}, u8)},
			Case{Name: "add", N: Node(t, ir.OpAdd, ir.Attrs{}, x, x)},
			Case{Name: "relu", N: Node(t, ir.OpReLU, ir.Attrs{}, x)},
			Case{Name: "relu_grad", N: Node(t, ir.OpReLUGrad, ir.Attrs{}, x, x)})
	}
	// global average pooling over maps of 1, 35 and 9100 elements (a task per map: several tasks)
	for _, d := range [][]int64{{3, 1, 1}, {5, 7, 5}, {5, 130, 70}} {
		x := ir.F32Batched(d...)
		cases = append(cases,
			Case{Name: fmt.Sprintf("global_avgpool %v", d), N: Node(t, ops.GlobalAvgPool, ir.Attrs{}, x)},
			Case{Name: fmt.Sprintf("global_avgpool_grad %v", d), N: Node(t, ops.GlobalAvgPoolGrad, ir.Attrs{Dims: d}, ir.F32Batched(d[0]))})
	}
	return cases
}

// LossUpdateDropoutChecks: softmax cross-entropy over 1, 3, 10, 33 and 130 classes; standalone
// updates with every optimizer (variant picks the step); dropout and its gradient, whose masks
// must equal the reference's bit for bit (streams and steps vary with variant).
func LossUpdateDropoutChecks(t testing.TB, variant int) []Case {
	g := ir.NewGraph("T")
	var cases []Case
	for _, classes := range []int64{1, 3, 10, 33, 130} {
		logits := g.NewValue(fmt.Sprintf("logits%d", classes), ir.F32Batched(classes), ir.RoleActivation, dsl.Pos{})
		label := g.NewValue(fmt.Sprintf("label%d", classes), ir.Type{DType: ir.Class, Batched: true, Classes: classes}, ir.RoleLabel, dsl.Pos{})
		cases = append(cases, Case{Name: fmt.Sprintf("softmax_cross_entropy c%d", classes),
			N: Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{}, []*ir.Value{logits, label}, "loss", "dlogits", "correct")})
	}
	for k, opt := range Optimizers {
		for si, dims := range [][]int64{{1}, {17, 130}, {200, 130}} {
			p := g.AddParam(fmt.Sprintf("u%d_%d", k, si), "weight", ir.Init{}, dsl.Pos{})
			p.Value.Type = ir.F32Fixed(dims...)
			grad := g.NewValue(p.Name+".grad", p.Value.Type, ir.RoleGrad, dsl.Pos{})
			op := ir.OpSGDUpdate
			if opt.Kind != ir.SGD {
				op = ir.OpAdamUpdate
			}
			n := g.NewNode(op, p.Layer, ir.Update, dsl.Pos{}, append([]*ir.Value{p.Value, grad}, NewState(g, p, opt)...), nil, 0)
			n.Attrs.Opt = opt
			_, err := op.Info().Infer(n)
			require.NoError(t, err)
			cases = append(cases, Case{Name: fmt.Sprintf("%s %v %s", op, dims, opt), N: n, O: reference.NodeOptions{Step: int64((k + variant) % 2 * 5), Update: true}})
		}
	}
	for di, dims := range [][]int64{{3, 5, 7}, {130}, {9, 60, 70}} {
		for _, p := range []float64{0.1, 0.5} {
			x := g.NewValue(fmt.Sprintf("x%d", di), ir.F32Batched(dims...), ir.RoleActivation, dsl.Pos{})
			a := ir.Attrs{P: p, Stream: int64(di*3 + variant)}
			o := reference.NodeOptions{Training: true, Seed: 0x9e3779b97f4a7c15, Step: int64(di + 3*variant)}
			cases = append(cases,
				Case{Name: fmt.Sprintf("dropout %v p=%g", dims, p), N: Typed(t, g, ir.OpDropout, "drop", a, []*ir.Value{x}, "y"), O: o},
				Case{Name: fmt.Sprintf("dropout_grad %v p=%g", dims, p), N: Typed(t, g, ir.OpDropoutGrad, "drop", a, []*ir.Value{x}, "dx"), O: o})
		}
	}
	return cases
}

// ClipChecks: clip_grad_norm over gradients of odd sizes whose concatenation crosses the CUDA
// (4,096) and CPU (16,384 elements) partial sums' boundaries within a gradient, with a max_norm
// that clips and one that does not; and the standalone updates with every optimizer reading a
// clipping coefficient (variant picks the step).
func ClipChecks(t testing.TB, variant int) []Case {
	g := ir.NewGraph("T")
	var grads []*ir.Value
	for i, dims := range [][]int64{{1}, {17, 130}, {3, 5001}, {9, 2003}, {7}} {
		grads = append(grads, g.NewValue(fmt.Sprintf("g%d", i), ir.F32Fixed(dims...), ir.RoleGrad, dsl.Pos{}))
	}
	var cases []Case
	for _, maxNorm := range []float64{0.5, 1e9} {
		cases = append(cases, Case{Name: fmt.Sprintf("clip_grad_norm max_norm=%g", maxNorm),
			N: Typed(t, g, ops.ClipGradNormOp, "clip", ir.Attrs{MaxNorm: maxNorm}, grads, "coef")})
	}
	for k, opt := range Optimizers {
		for si, dims := range [][]int64{{1}, {17, 130}} {
			p := g.AddParam(fmt.Sprintf("c%d_%d", k, si), "weight", ir.Init{}, dsl.Pos{})
			p.Value.Type = ir.F32Fixed(dims...)
			grad := g.NewValue(p.Name+".grad", p.Value.Type, ir.RoleGrad, dsl.Pos{})
			coef := g.NewValue(p.Name+".coef", ops.ClipCoefType, ir.RoleActivation, dsl.Pos{})
			op := ir.OpSGDUpdate
			if opt.Kind != ir.SGD {
				op = ir.OpAdamUpdate
			}
			ins := append(append([]*ir.Value{p.Value, grad}, NewState(g, p, opt)...), coef)
			n := g.NewNode(op, p.Layer, ir.Update, dsl.Pos{}, ins, nil, 0)
			n.Attrs.Opt = opt
			_, err := op.Info().Infer(n)
			require.NoError(t, err)
			cases = append(cases, Case{Name: fmt.Sprintf("%s %v %s clipped", op, dims, opt), N: n, O: reference.NodeOptions{Step: int64((k + variant) % 2 * 5), Update: true}})
		}
	}
	return cases
}

// ConvPool is a conv2d -> tanh -> avgpool2d block configuration (ops.ConvTanhPoolOp).
type ConvPool struct {
	C, H, W   int64
	U8        bool // the input is the u8 [H,W,C] image
	Out       int64
	K, S, P   [2]int64
	Bias      bool
	Pool      *ir.Window
	SaveAct   bool
	ValidOnly bool // no gradient: forward only
}

func (c ConvPool) String() string {
	return fmt.Sprintf("x%dx%dx%d u8=%v o%d k%v s%v p%v bias=%v avg%v save=%v", c.C, c.H, c.W, c.U8, c.Out, c.K, c.S, c.P, c.Bias, *c.Pool, c.SaveAct)
}

// ConvPoolCases are odd shapes: windows that leave conv outputs outside
// every pool window (their gradient is 0), overlapping padded pools,
// strides, u8 images, a weight row longer than the weight-gradient
// kernel's block (K + 1 > 128), more positions than its splits' chunks.
var ConvPoolCases = []ConvPool{
	{C: 1, H: 7, W: 6, U8: true, Out: 3, K: k3, S: s1, P: p1, Bias: true, Pool: Window(k2, s2, p0)},
	{C: 1, H: 30, W: 29, U8: true, Out: 2, K: k5, S: s1, P: [2]int64{2, 2}, Bias: true, Pool: Window(k2, s2, p0)},
	{C: 2, H: 7, W: 9, Out: 4, K: [2]int64{2, 3}, S: [2]int64{1, 2}, P: [2]int64{0, 1}, Pool: Window(k3, s2, p1), SaveAct: true},
	{C: 6, H: 9, W: 8, Out: 3, K: k5, S: s1, P: [2]int64{2, 2}, Bias: true, Pool: Window(k2, s2, p0), SaveAct: true},
	{C: 6, H: 9, W: 8, Out: 3, K: k5, S: s1, P: [2]int64{2, 2}, Bias: true, Pool: Window(k2, s2, p0)},
	{C: 3, H: 6, W: 5, Out: 5, K: k2, S: s2, P: p0, Bias: true, Pool: Window([2]int64{2, 1}, [2]int64{2, 1}, p0)},
}

// ConvTanhPoolPtxasCases are ConvPoolCases, LeNet-5's two blocks
// (examples/lenet5.cnn: conv1 on the image recomputing t, conv2 saving it)
// and the longest weight row the fuse pass fuses (ops.MaxConvTanhPoolTaps:
// 64 channels x 4x4), recomputing and saving.
func ConvTanhPoolPtxasCases() []ConvPool {
	long := ConvPool{C: 64, H: 7, W: 7, Out: 3, K: [2]int64{4, 4}, S: s1, P: p0, Bias: true, Pool: Window(k2, s2, p0)}
	longSaved := long
	longSaved.SaveAct = true
	return append(append([]ConvPool{}, ConvPoolCases...),
		ConvPool{C: 1, H: 28, W: 28, U8: true, Out: 6, K: k5, S: s1, P: [2]int64{2, 2}, Bias: true, Pool: Window(k2, s2, p0)},
		ConvPool{C: 6, H: 14, W: 14, Out: 16, K: k5, S: s1, P: p0, Bias: true, Pool: Window(k2, s2, p0), SaveAct: true},
		long, longSaved)
}

func (c ConvPool) attrs() ir.Attrs {
	return ir.Attrs{Out: c.Out, Kernel: c.K, Stride: c.S, Pad: c.P, Bias: c.Bias, Pool: c.Pool, SaveAct: c.SaveAct}
}

// ConvPoolNodes builds c's forward node, its input gradient (with save)
// and its weight gradient, each in a graph of its own.
func ConvPoolNodes(t testing.TB, c ConvPool) []*ir.Node {
	t.Helper()
	xt := ir.F32Batched(c.C, c.H, c.W)
	if c.U8 {
		xt = ir.ImageU8Type(xt)
	}
	wt := ir.F32Fixed(c.Out, c.C, c.K[0], c.K[1])
	bt := ir.F32Fixed(c.Out)
	a := c.attrs()
	g := ir.NewGraph("T")
	val := func(name string, t ir.Type) *ir.Value { return g.NewValue(name, t, ir.RoleActivation, dsl.Pos{}) }
	ins := []*ir.Value{val("x", xt), val("w", wt)}
	if c.Bias {
		ins = append(ins, val("b", bt))
	}
	outs := []string{"pooled"}
	if c.SaveAct {
		outs = append(outs, "t")
	}
	fwd := Typed(t, g, ops.ConvTanhPoolOp, "conv", a, ins, outs...)
	nodes := []*ir.Node{fwd}
	if c.ValidOnly {
		return nodes
	}
	pooled := fwd.Outs[0].Type
	var convT ir.Type
	if c.SaveAct {
		convT = fwd.Outs[1].Type
		g := ir.NewGraph("T")
		val := func(name string, t ir.Type) *ir.Value { return g.NewValue(name, t, ir.RoleActivation, dsl.Pos{}) }
		ga := a
		ga.Dims = []int64{c.C, c.H, c.W}
		if !c.U8 {
			nodes = append(nodes, Typed(t, g, ops.ConvTanhPoolGradInputOp, "conv", ga, []*ir.Value{val("dout", pooled), val("w", wt), val("t", convT)}, "dx"))
		}
	}
	g = ir.NewGraph("T")
	val = func(name string, t ir.Type) *ir.Value { return g.NewValue(name, t, ir.RoleActivation, dsl.Pos{}) }
	wins := []*ir.Value{val("dout", pooled), val("x", xt)}
	if c.SaveAct {
		wins = append(wins, val("t", convT))
	} else {
		wins = append(wins, val("w", wt))
		if c.Bias {
			wins = append(wins, val("b", bt))
		}
	}
	wouts := []string{"dw"}
	if c.Bias {
		wouts = append(wouts, "db")
	}
	return append(nodes, Typed(t, g, ops.ConvTanhPoolGradWeightOp, "conv", a, wins, wouts...))
}

// ConvPoolChecks are every ConvPoolCases node.
func ConvPoolChecks(t testing.TB) []Case {
	var cs []Case
	for _, c := range ConvPoolCases {
		for _, n := range ConvPoolNodes(t, c) {
			cs = append(cs, Case{Name: n.Op.String() + " " + c.String(), N: n})
		}
	}
	return cs
}

// ---- the classifier tail ----

// LinearCrossEntropy is one linear_cross_entropy configuration: [In] -> Out classes.
type LinearCrossEntropy struct {
	In, Out         int64
	Bias, InputGrad bool
	MaskOut         bool
	Smoothing       float64
	Opt             *ir.Optimizer // the fused update (nil: dW, dB? written)
}

func (c LinearCrossEntropy) String() string {
	s := fmt.Sprintf("%dx%d bias=%t dx=%t maskout=%t", c.In, c.Out, c.Bias, c.InputGrad, c.MaskOut)
	if c.Smoothing != 0 {
		s += fmt.Sprintf(" ls=%g", c.Smoothing)
	}
	if c.Opt != nil {
		s += " " + c.Opt.String()
	}
	return s
}

// LinearCrossEntropyNode builds the tail's node in g (fresh optimizer state with an update).
func LinearCrossEntropyNode(t testing.TB, g *ir.Graph, name string, c LinearCrossEntropy) *ir.Node {
	x := g.NewValue(name+".x", ir.F32Batched(c.In), ir.RoleActivation, dsl.Pos{})
	w := g.AddParam(name, "weight", ir.Init{}, dsl.Pos{})
	w.Value.Type = ir.F32Fixed(c.Out, c.In)
	params := []*ir.Param{w}
	ins := []*ir.Value{x, w.Value}
	if c.Bias {
		b := g.AddParam(name, "bias", ir.Init{}, dsl.Pos{})
		b.Value.Type = ir.F32Fixed(c.Out)
		params = append(params, b)
		ins = append(ins, b.Value)
	}
	ins = append(ins, g.NewValue(name+".label", ir.Type{DType: ir.Class, Batched: true, Classes: c.Out}, ir.RoleLabel, dsl.Pos{}))
	a := ir.Attrs{Out: c.Out, Bias: c.Bias, Smoothing: c.Smoothing, InputGrad: c.InputGrad, MaskOut: c.MaskOut, Opt: c.Opt}
	outs := []string{name + ".loss", name + ".logits", name + ".correct"}
	if c.InputGrad {
		outs = append(outs, name+".dx")
	}
	if c.Opt == nil {
		for _, p := range params {
			outs = append(outs, p.Name+".grad")
		}
	} else {
		for _, p := range params {
			ins = append(ins, p.Value)
		}
		for _, p := range params {
			ins = append(ins, NewState(g, p, c.Opt)...)
		}
	}
	return Typed(t, g, ops.LinearCrossEntropyOp, name, a, ins, outs...)
}

// LinearCrossEntropyCases: odd shapes (one class and one input; 7 classes of 37 inputs; 33
// classes, more than a thread's 16 accumulators; 700 inputs, which the block stages 5 rows at a
// time at batch 37), with and without bias, input gradient and its mask, label smoothing, the
// gradients written or each optimizer fused.
func LinearCrossEntropyCases() []LinearCrossEntropy {
	type shape struct{ in, out int64 }
	var cs []LinearCrossEntropy
	for si, s := range []shape{{1, 1}, {37, 7}, {130, 33}, {700, 11}} {
		for v := 0; v < 4; v++ {
			c := LinearCrossEntropy{In: s.in, Out: s.out, Bias: v&1 == 0, InputGrad: v != 3, MaskOut: v == 1 || v == 2 && si%2 == 0}
			if v == 2 && s.out > 1 {
				// (not with one class: the smoothed loss is then identically 0, see SmoothedLossChecks)
				c.Smoothing = 0.1
			}
			if k := (v + 2*si) % (len(Optimizers) + 1); k < len(Optimizers) {
				c.Opt = Optimizers[k]
			}
			cs = append(cs, c)
		}
	}
	return cs
}

// LinearCrossEntropyChecks are the cases' nodes, those with an update at the first step and a
// later one.
func LinearCrossEntropyChecks(t testing.TB) []Case {
	g := ir.NewGraph("T")
	var cases []Case
	for i, c := range LinearCrossEntropyCases() {
		n := LinearCrossEntropyNode(t, g, fmt.Sprintf("tail%d", i), c)
		o := reference.NodeOptions{}
		if c.Opt != nil {
			o = reference.NodeOptions{Step: int64(4 * (i % 2)), Update: true}
		}
		cases = append(cases, Case{Name: "linear_cross_entropy " + c.String(), N: n, O: o})
	}
	return cases
}
