package codegen_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// convCase is one conv block configuration.
type convCase struct {
	c, h, w         int64 // input channels and size
	u8              bool  // the input is the u8 HWC image
	out             int64
	k, s, p         [2]int64
	bias, relu      bool
	pool            *ir.Window
	masked, maskout bool          // backward: dOut already masked; dX masked by the input
	opt             *ir.Optimizer // weight gradient: the fused update (nil: gradients out)
}

func (c convCase) String() string {
	s := fmt.Sprintf("x%dx%dx%d", c.c, c.h, c.w)
	if c.u8 {
		s += "u8"
	}
	s += fmt.Sprintf("_o%d_k%dx%d_s%dx%d_p%dx%d", c.out, c.k[0], c.k[1], c.s[0], c.s[1], c.p[0], c.p[1])
	if c.bias {
		s += "_bias"
	}
	if c.relu {
		s += "_relu"
	}
	if w := c.pool; w != nil {
		s += fmt.Sprintf("_pool%dx%ds%dx%dp%dx%d", w.Kernel[0], w.Kernel[1], w.Stride[0], w.Stride[1], w.Pad[0], w.Pad[1])
	}
	if c.masked {
		s += "_masked"
	}
	if c.maskout {
		s += "_maskout"
	}
	if c.opt != nil {
		s += "_" + c.opt.String()
	}
	return s
}

func (c convCase) attrs() ir.Attrs {
	return ir.Attrs{Out: c.out, Kernel: c.k, Stride: c.s, Pad: c.p, Bias: c.bias, ReLU: c.relu, Pool: c.pool}
}

func (c convCase) inputType() ir.Type {
	x := ir.F32Batched(c.c, c.h, c.w)
	if c.u8 {
		return ir.ImageU8Type(x)
	}
	return x
}

// convBlockGraph makes a graph with the block's input and parameters.
type convBlockGraph struct {
	g    *ir.Graph
	x    *ir.Value
	w, b *ir.Param
}

func newConvBlockGraph(c convCase) *convBlockGraph {
	g := ir.NewGraph("T")
	cg := &convBlockGraph{g: g}
	cg.x = g.AddInput("x", c.inputType(), ir.RoleInput, dsl.Pos{})
	cg.w = g.AddParam("conv", "weight", ir.Init{}, dsl.Pos{})
	cg.w.Value.Type = ir.F32Fixed(c.out, c.c, c.k[0], c.k[1])
	if c.bias {
		cg.b = g.AddParam("conv", "bias", ir.Init{}, dsl.Pos{})
		cg.b.Value.Type = ir.F32Fixed(c.out)
	}
	return cg
}

func (cg *convBlockGraph) value(name string, t ir.Type) *ir.Value {
	return cg.g.NewValue(name, t, ir.RoleActivation, dsl.Pos{})
}

// infer types n's outputs by its op's rule.
func infer(t *testing.T, n *ir.Node) *ir.Node {
	t.Helper()
	outs, err := n.Op.Info().Infer(n)
	require.NoError(t, err, n.Text())
	require.Len(t, n.Outs, len(outs))
	for i, ty := range outs {
		n.Outs[i].Type = ty
	}
	return n
}

func convForwardNode(t *testing.T, c convCase) *ir.Node {
	cg := newConvBlockGraph(c)
	ins := []*ir.Value{cg.x, cg.w.Value}
	if c.bias {
		ins = append(ins, cg.b.Value)
	}
	outs := []string{"y"}
	if c.pool != nil {
		outs = append(outs, "y.argmax")
	}
	n := cg.g.NewNode(ir.OpConvBlock, "conv", ir.Forward, dsl.Pos{}, ins, outs, ir.RoleActivation)
	n.Attrs = c.attrs()
	return infer(t, n)
}

// backwardInputs are dOut, then argmax and y when the layout has them.
func backwardInputs(t *testing.T, c convCase, cg *convBlockGraph) []*ir.Value {
	fwd := convForwardNode(t, convCase{c: c.c, h: c.h, w: c.w, u8: c.u8, out: c.out, k: c.k, s: c.s, p: c.p, bias: c.bias, relu: c.relu, pool: c.pool})
	ins := []*ir.Value{cg.value("dout", fwd.Outs[0].Type)}
	if c.pool != nil {
		ins = append(ins, cg.value("argmax", fwd.Outs[1].Type))
	}
	if c.relu && !c.masked {
		ins = append(ins, cg.value("y", fwd.Outs[0].Type))
	}
	return ins
}

func convGradInputNode(t *testing.T, c convCase) *ir.Node {
	cg := newConvBlockGraph(c)
	bw := backwardInputs(t, c, cg)
	ins := append([]*ir.Value{bw[0], cg.w.Value}, bw[1:]...)
	if c.maskout {
		ins = append(ins, cg.value("xmask", cg.x.Type))
	}
	n := cg.g.NewNode(ir.OpConvBlockGradInput, "conv", ir.Backward, dsl.Pos{}, ins, []string{"dx"}, ir.RoleActGrad)
	n.Attrs = c.attrs()
	n.Attrs.DOutMasked, n.Attrs.MaskOut, n.Attrs.Dims = c.masked, c.maskout, []int64{c.c, c.h, c.w}
	return infer(t, n)
}

func convGradWeightNode(t *testing.T, c convCase) *ir.Node {
	cg := newConvBlockGraph(c)
	bw := backwardInputs(t, c, cg)
	ins := append([]*ir.Value{bw[0], cg.x}, bw[1:]...)
	var outs []string
	if c.opt == nil {
		outs = []string{"dw"}
		if c.bias {
			outs = append(outs, "db")
		}
	} else {
		params := []*ir.Param{cg.w}
		if c.bias {
			params = append(params, cg.b)
		}
		for _, p := range params {
			ins = append(ins, p.Value)
		}
		for _, p := range params {
			for _, s := range c.opt.StateNames() {
				v := cg.g.NewValue(p.Name+"."+s, p.Value.Type, ir.RoleOptState, dsl.Pos{})
				v.Param = p
				p.State = append(p.State, v)
				ins = append(ins, v)
			}
		}
	}
	n := cg.g.NewNode(ir.OpConvBlockGradWeight, "conv", ir.Backward, dsl.Pos{}, ins, outs, ir.RoleGrad)
	n.Attrs = c.attrs()
	n.Attrs.DOutMasked, n.Attrs.Opt = c.masked, c.opt
	return infer(t, n)
}

// kernelCheck is one node to run with its reference options.
type kernelCheck struct {
	name string
	n    *ir.Node
	o    reference.NodeOptions
}

// runKernelChecks generates every node into one program (one compile),
// runs each on the emulator with random inputs and compares with the
// reference; it returns the worst error.
func runKernelChecks(t *testing.T, batch int64, checks []kernelCheck) float64 {
	t.Helper()
	return runKernelChecksAt(t, codegen.FP32, batch, checks)
}

// runKernelChecksAt is runKernelChecks at a precision: on tensor cores the
// inputs are first rounded to it (kernelcheck.RoundInputs says why
// kernelcheck.Tolerance then still applies).
func runKernelChecksAt(t *testing.T, prec codegen.Precision, batch int64, checks []kernelCheck) float64 {
	t.Helper()
	var nodes []*ir.Node
	seen := map[*ir.Node]bool{}
	for _, c := range checks {
		if !seen[c.n] {
			seen[c.n] = true
			nodes = append(nodes, c.n)
		}
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Precision: prec})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	worst := 0.0
	for i, c := range checks {
		rng := rand.New(rand.NewPCG(uint64(i)+1, uint64(batch)))
		ins := kernelcheck.RoundInputs(c.n, kernelcheck.RandomInputs(c.n, batch, rng), prec)
		kernelcases.ValidArgmax(c.n, ins, rng)
		r, err := kernelcheck.Node(dev, prog, c.n, ins, kernelcheck.Scalars{LR: 0.05, Step: c.o.Step, Seed: c.o.Seed}, c.o)
		require.NoError(t, err, c.name)
		require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s: %s", c.name, r)
		// Argmax ties: fp32 and float64 can only disagree when two window values
		// are within rounding of each other, which random data does not produce.
		require.Zero(t, r.ArgmaxMismatches, "%s: %s", c.name, r)
		t.Logf("%s b%d %s: %s", prec, batch, c.name, r)
		worst = max(worst, r.Worst)
	}
	return worst
}

// win is a pooling window (kernelcases.Window, shared with codegen/cpu).
var win = kernelcases.Window

var (
	k1  = [2]int64{1, 1}
	k2  = [2]int64{2, 2}
	k3  = [2]int64{3, 3}
	k5  = [2]int64{5, 5}
	p0  = [2]int64{0, 0}
	p1  = [2]int64{1, 1}
	s1  = [2]int64{1, 1}
	s2  = [2]int64{2, 2}
	sgd = func(mom float64, nesterov bool, wd float64) *ir.Optimizer {
		return &ir.Optimizer{Kind: ir.SGD, LR: 0.05, Momentum: mom, Nesterov: nesterov, WeightDecay: wd}
	}
	adam = func(kind ir.OptimizerKind, wd float64) *ir.Optimizer {
		return &ir.Optimizer{Kind: kind, LR: 0.05, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: wd}
	}
)

// forwardCases cover the tile configurations (8, 16, 32 and 64 output
// channel tiles), u8 images, odd sizes and channel counts, kernels 1, 2x3,
// 3, 5 and 7 (split into kernel-row chunks), strides, padding, and pools
// that overlap, are padded, rectangular, or leave conv rows unread.
var (
	// pooled rows wider than a tile: runs of argmax words shared between blocks
	wideRowsCase = convCase{c: 2, h: 9, w: 41, out: 3, k: k3, s: s1, p: p1, bias: true, relu: true, pool: win(k2, s2, p0)}
	// a stride-2 5x5 conv without ReLU or pool
	stridedCase = convCase{c: 5, h: 13, w: 11, out: 8, k: k5, s: s2, p: [2]int64{2, 2}, bias: true}
	// 40 channels (a 64-row tile), stride 2, overlapping padded pool
	overlapCase = convCase{c: 5, h: 13, w: 11, out: 40, k: k3, s: s2, p: p1, bias: true, relu: true, pool: win(k3, s2, p1)}
)

var forwardCases = []convCase{
	{c: 3, h: 13, w: 11, u8: true, out: 5, k: k3, s: s1, p: p1, bias: true, relu: true, pool: win(k2, s2, p0)},
	{c: 1, h: 28, w: 28, u8: true, out: 8, k: k3, s: s1, p: p1, bias: true, relu: true, pool: win(k2, s2, p0)},
	{c: 17, h: 7, w: 5, out: 17, k: k3, s: s1, p: p1, relu: true, pool: win(k3, s2, p1)},
	stridedCase,
	{c: 3, h: 9, w: 7, out: 33, k: k1, s: s1, p: p0, bias: true, relu: true},
	{c: 4, h: 11, w: 13, out: 6, k: [2]int64{2, 3}, s: [2]int64{2, 1}, p: [2]int64{1, 0}, bias: true, relu: true, pool: win([2]int64{3, 2}, [2]int64{1, 2}, [2]int64{1, 0})},
	{c: 8, h: 14, w: 14, out: 16, k: k3, s: s1, p: p1, bias: true, relu: true, pool: win(k2, s2, p0)},
	{c: 2, h: 12, w: 10, out: 3, k: [2]int64{7, 7}, s: s1, p: [2]int64{3, 3}, bias: true, pool: win(k2, s2, p0)},
	{c: 70, h: 5, w: 6, out: 70, k: k3, s: s1, p: p1, relu: true},
	overlapCase,
	{c: 3, h: 7, w: 5, u8: true, out: 4, k: k2, s: s1, p: p0, relu: true, pool: win([2]int64{2, 1}, [2]int64{2, 1}, p0)},
	// a strided 1x1 (ResNet shortcut) and a stride larger than the kernel:
	// input pixels that reach no output, phases without taps
	{c: 6, h: 9, w: 10, out: 5, k: k1, s: s2, p: p0, bias: true},
	{c: 4, h: 11, w: 8, out: 9, k: k2, s: [2]int64{3, 2}, p: p0, relu: true},
	wideRowsCase,
	{c: 1, h: 5, w: 45, out: 2, k: k3, s: s1, p: p1, pool: win(k3, s2, p1)},
}

func TestConvBlockForward(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			checks = append(checks, kernelCheck{name: c.String(), n: convForwardNode(t, c)})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// The forward cases on tensor cores, at batch 3.
func TestConvBlockForwardTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			checks = append(checks, kernelCheck{name: c.String(), n: convForwardNode(t, c)})
		}
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

// f32 is c with an f32 input (input gradients exist only for f32 inputs).
func (c convCase) f32() convCase {
	c.u8 = false
	return c
}

func TestConvBlockGradInput(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range forwardCases {
			// as after a non-ReLU reader (y masks dOut), and after a maskout reader
			// (dOut arrives masked) with this block's own input masked too
			plain, masked := c.f32(), c.f32()
			masked.masked, masked.maskout = c.relu, true
			for _, v := range []convCase{plain, masked} {
				checks = append(checks, kernelCheck{name: v.String(), n: convGradInputNode(t, v)})
			}
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// optimizers cycles through every fused update variant.
var optimizers = []*ir.Optimizer{
	sgd(0.9, true, 0.01), sgd(0, false, 0), adam(ir.Adam, 0.01), adam(ir.AdamW, 0.01), sgd(0.9, false, 0), adam(ir.Adam, 0),
}

func TestConvBlockGradWeight(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for i, c := range forwardCases {
			// the gradients out, then the update fused (at the first step, when
			// SGD's momentum buffer starts as the gradient, and a later one)
			plain := c
			plain.masked = c.relu && i%2 == 1
			checks = append(checks, kernelCheck{name: plain.String(), n: convGradWeightNode(t, plain)})
			fused := c
			fused.opt = optimizers[i%len(optimizers)]
			n := convGradWeightNode(t, fused)
			for _, step := range []int64{0, 3} {
				checks = append(checks, kernelCheck{name: fmt.Sprintf("%s step %d", fused, step), n: n, o: reference.NodeOptions{Update: true, Step: step}})
			}
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}

// realisticCases are layer shapes of real networks (too big for the
// emulator), for the ptxas check: a VGG block, a ResNet downsampling conv,
// a bottleneck 1x1 conv, an ImageNet stem with an overlapping pool.
var realisticCases = []convCase{
	{c: 64, h: 56, w: 56, out: 128, k: k3, s: s1, p: p1, bias: true, relu: true, pool: win(k2, s2, p0)},
	{c: 64, h: 56, w: 56, out: 128, k: k3, s: s2, p: p1, relu: true},
	{c: 256, h: 14, w: 14, out: 64, k: k1, s: s1, p: p0, bias: true, relu: true},
	{c: 3, h: 224, w: 224, u8: true, out: 64, k: [2]int64{7, 7}, s: s2, p: [2]int64{3, 3}, relu: true, pool: win(k3, s2, p1)},
	// 2^31 input elements at batch 32: the 64-bit index variant
	{c: 256, h: 512, w: 512, out: 32, k: k3, s: s1, p: p1, relu: true, pool: win(k2, s2, p0)},
}

// The 64-bit index variants (for tensors of 2^31 elements or more) on
// shapes the emulator can run: pooled and unpooled, u8, strided, every
// backward kernel and the pools.
func TestConvPoolLongIndex(t *testing.T) {
	defer codegen.SetForceLongIndex(true)()
	var checks []kernelCheck
	for _, c := range []convCase{forwardCases[0], stridedCase, overlapCase, wideRowsCase} {
		d := c.f32()
		d.masked, d.maskout = c.relu, true
		w := c
		w.opt = sgd(0.9, false, 0.01)
		checks = append(checks, kernelCheck{name: c.String(), n: convForwardNode(t, c)},
			kernelCheck{name: d.String(), n: convGradInputNode(t, d)},
			kernelCheck{name: w.String(), n: convGradWeightNode(t, w), o: reference.NodeOptions{Update: true, Step: 2}})
	}
	for _, c := range poolCases[1:3] {
		a := ir.Attrs{Kernel: c.k, Stride: c.s, Pad: c.p}
		x := ir.F32Batched(c.c, c.h, c.w)
		fwd := node(t, ir.OpMaxPool2D, a, x)
		ga := a
		ga.Dims = x.Dims
		checks = append(checks, kernelCheck{name: "maxpool2d", n: fwd}, kernelCheck{name: "avgpool2d", n: node(t, ir.OpAvgPool2D, a, x)},
			kernelCheck{name: "maxpool2d_grad", n: node(t, ir.OpMaxPool2DGrad, a, fwd.Out().Type, x)},
			kernelCheck{name: "avgpool2d_grad", n: node(t, ir.OpAvgPool2DGrad, ga, fwd.Out().Type)})
	}
	t.Logf("worst relative error: %.2e", runKernelChecks(t, 3, checks))
}

// Every conv and pool kernel variant compiles for sm_80 and sm_90 with no
// register spill and no local-memory stack frame.
func TestConvPoolKernelsPtxas(t *testing.T) {
	nvcc.Require(t)
	var nodes []*ir.Node
	// one variant per case and family, alternating masks and the update, to
	// keep nvcc's time down; every optimizer, mask and tile occurs
	for i, c := range append(append([]convCase{}, forwardCases...), realisticCases...) {
		d := c.f32()
		d.masked, d.maskout = c.relu && i%2 == 0, i%2 == 1
		wg := c
		wg.masked = c.relu && i%4 == 1
		if i%4 != 3 {
			wg.opt = optimizers[i%len(optimizers)]
		}
		nodes = append(nodes, convForwardNode(t, c), convGradInputNode(t, d), convGradWeightNode(t, wg))
	}
	for _, c := range poolCases[:3] {
		a := ir.Attrs{Kernel: c.k, Stride: c.s, Pad: c.p}
		x := ir.F32Batched(c.c, c.h, c.w)
		fwd := node(t, ir.OpMaxPool2D, a, x)
		ga := a
		ga.Dims = x.Dims
		nodes = append(nodes, fwd, node(t, ir.OpAvgPool2D, a, x), node(t, ir.OpMaxPool2DGrad, a, fwd.Out().Type, x),
			node(t, ir.OpAvgPool2DGrad, ga, fwd.Out().Type))
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "conv.cu", nvcc.Targets)
	require.NoError(t, err)
	reported := map[string]int{}
	most := map[string]codegen.PtxasKernel{}
	for _, k := range ks {
		reported[k.Name]++
		require.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
		if k.Registers > most[k.Arch].Registers {
			most[k.Arch] = k
		}
		t.Log(k)
	}
	for _, name := range prog.KernelNames() {
		require.Equal(t, len(nvcc.Targets), reported[name], "ptxas reports on %s for every target", name)
	}
	for arch, k := range most {
		t.Logf("most registers on %s: %d (%s)", arch, k.Registers, k.Name)
	}
}

// tcBackwardCases are the forward cases whose pool windows do not overlap:
// there every conv output's gradient is one output gradient (or zero),
// representable when the inputs are rounded. Where windows overlap it is a
// sum of several, which the tensor-core kernels round once more when they
// stage it — an error of up to one TF32 (BF16) rounding of dy that
// rounded inputs cannot absorb, so those cases are checked in fp32 only.
func tcBackwardCases() []convCase {
	var out []convCase
	for _, c := range forwardCases {
		if p := c.pool; p != nil && (p.Stride[0] < p.Kernel[0] || p.Stride[1] < p.Kernel[1]) {
			continue
		}
		out = append(out, c)
	}
	return out
}

func TestConvBlockGradInputTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for _, c := range tcBackwardCases() {
			plain, masked := c.f32(), c.f32()
			masked.masked, masked.maskout = c.relu, true
			for _, v := range []convCase{plain, masked} {
				checks = append(checks, kernelCheck{name: v.String(), n: convGradInputNode(t, v)})
			}
		}
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}

func TestConvBlockGradWeightTensorCores(t *testing.T) {
	for _, prec := range []codegen.Precision{codegen.TF32, codegen.BF16} {
		var checks []kernelCheck
		for i, c := range tcBackwardCases() {
			plain := c
			plain.masked = c.relu && i%2 == 1
			checks = append(checks, kernelCheck{name: plain.String(), n: convGradWeightNode(t, plain)})
			fused := c
			fused.opt = optimizers[i%len(optimizers)]
			checks = append(checks, kernelCheck{name: fused.String() + " step 3", n: convGradWeightNode(t, fused), o: reference.NodeOptions{Update: true, Step: 3}})
		}
		t.Logf("%s: worst relative error at batch 3: %.2e", prec, runKernelChecksAt(t, prec, 3, checks))
	}
}
