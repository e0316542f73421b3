package reference

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
)

func pixelBatch(g *ir.Graph, n int, rng *rand.Rand) Batch {
	img := g.Inputs[0].Type
	b := Batch{N: n, Pixels: make([]uint8, n*int(img.SampleElems())), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.Int64N(g.Logits.Type.Dims[0]))
	}
	return b
}

func maxRelDiff(a, b []float64) float64 {
	worst := 0.0
	for i := range a {
		worst = math.Max(worst, math.Abs(a[i]-b[i])/(1e-12+math.Max(math.Abs(a[i]), math.Abs(b[i]))))
	}
	return worst
}

// The fused training step computes what the unfused one does: same loss,
// same parameters and optimizer state after several steps.
func TestFusedStepEqualsUnfused(t *testing.T) {
	simple, err := os.ReadFile("../../examples/simplecnn.cnn")
	require.NoError(t, err)
	_ = simple
	models := map[string]string{
		"small simplecnn": `model S(image: f32[3,14,13], label: class[10]) {
    conv1 = conv2d(image, out=4, kernel=3)
    relu1 = relu(conv1)
    pool1 = maxpool(relu1, kernel=2)
    conv2 = conv2d(pool1, out=5, kernel=3)
    relu2 = relu(conv2)
    pool2 = maxpool(relu2, kernel=2)
    fc1   = linear(flatten(pool2), out=12)
    fc2   = linear(fc1, out=10)
    loss  = cross_entropy(fc2, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9, nesterov=true, weight_decay=0.01) }
`,
		"overlapping pools, relu linear": `model P(image: f32[2,11,9], label: class[3]) {
    c1 = conv2d(image, out=3, kernel=3, padding=1)
    p1 = maxpool(relu(c1), kernel=3, stride=2, padding=1)
    c2 = conv2d(p1, out=4, kernel=[2,3], stride=[1,2])
    r2 = relu(c2)
    h  = linear(flatten(r2), out=7)
    a  = relu(h)
    o  = linear(a, out=3)
    loss = cross_entropy(o, label)
}
train { optimizer = adam(lr=0.01, weight_decay=0.1) }
`,
		"residual dropout avgpool": `model R(image: f32[3,11,9], label: class[5]) {
    stem = conv2d(image, out=4, kernel=3, padding=1)
    act  = relu(stem)
    body = conv2d(act, out=4, kernel=3, padding=1, bias=false)
    sum  = add(act, relu(body))
    down = conv2d(sum, out=6, kernel=[3,2], stride=2, padding=[1,0])
    pool = avgpool(down, kernel=2, stride=[2,1])
    drop = dropout(flatten(pool), p=0.25)
    out  = linear(drop, out=5)
    loss = cross_entropy(out, label)
}
train { optimizer = adamw(lr=0.01) }
`,
		"mlp on pixels": `model M(image: f32[1,5,6], label: class[4]) {
    h = linear(flatten(image), out=9)
    r = relu(h)
    o = linear(r, out=4, bias=false)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.2) }
`,
		// a standalone ReLU (after batch norm) whose only reader is a conv
		// or linear block: that block's input gradient applies its mask
		// (maskout) and the ReLU adds no gradient kernel
		"batch norm relu into blocks": `model B(image: f32[3,9,8], label: class[4]) {
    c1 = conv2d(image, out=4, kernel=3, padding=1, bias=false)
    r1 = relu(batchnorm2d(c1))
    c2 = conv2d(r1, out=5, kernel=3, stride=2)
    h  = linear(flatten(c2), out=6, bias=false)
    r2 = relu(batchnorm1d(h))
    o  = linear(r2, out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`,
		// LeNet-5's layers on odd shapes: the image's block recomputes its
		// tanh output in the weight gradient; the second block, whose input
		// needs a gradient, saves it (an overlapping, padded pool); no bias
		"tanh avgpool blocks": `model T(image: f32[2,11,9], label: class[4]) {
    c1 = conv2d(image, out=3, kernel=3, padding=1)
    p1 = avgpool(tanh(c1), kernel=2)
    c2 = conv2d(p1, out=5, kernel=[2,3], padding=[0,1], bias=false)
    p2 = avgpool(tanh(c2), kernel=3, stride=2, padding=1)
    o  = linear(flatten(p2), out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.2, momentum=0.9) }
`,
		"label smoothing": `model L(image: f32[1,5,6], label: class[4]) {
    c = conv2d(image, out=2, kernel=3, padding=1)
    o = linear(flatten(relu(c)), out=4)
    loss = cross_entropy(o, label, label_smoothing=0.2)
}
train { optimizer = sgd(lr=0.2, momentum=0.5) }
`,
		// the classifier tail on odd shapes (in 37, 7 classes): one
		// linear_cross_entropy with its update fused, and with clipping
		// (it writes dW, dB for the updates after the norm)
		"classifier tail": `model C(image: f32[1,5,6], label: class[7]) {
    h = linear(flatten(image), out=37)
    o = linear(relu(h), out=7)
    loss = cross_entropy(o, label, label_smoothing=0.1)
}
train { optimizer = sgd(lr=0.2, momentum=0.9, weight_decay=0.01) }
`,
		"classifier tail clipped": `model K(image: f32[1,5,6], label: class[7]) {
    h = linear(flatten(image), out=37)
    o = linear(relu(h), out=7, bias=false)
    loss = cross_entropy(o, label)
}
train { optimizer = adam(lr=0.01)
        clip_grad_norm = 0.5 }
`,
	}
	// every pointwise activation folded into batch norm (Attrs.Act): maps,
	// affine, and features without affine (its gradient's z has no weight
	// and bias); the gradient recomputes z
	for _, act := range bnActs {
		models["batch norm "+strings.Split(act, "(")[0]] = bnActModel(act)
	}
	// a max-pool after batch norm and its activation folds into the
	// normalisation (Attrs.Pool): overlapping padded windows (k=3, s=2) and
	// k=2 on odd maps; the ReLU's mask from the reader's maskout epilogue
	// (a conv, a linear through flatten) or, where the pooled output has
	// two readers, a relu_grad on the pooled values
	models["bn pool relu"] = `model Q(image: f32[3,9,7], label: class[4]) {
    c1 = conv2d(image, out=4, kernel=3, padding=1, bias=false)
    p1 = maxpool(relu(batchnorm2d(c1)), kernel=3, stride=2, padding=1)
    c2 = conv2d(p1, out=4, kernel=3, padding=1, bias=false)
    s  = add(c2, p1)
    p2 = maxpool(relu(batchnorm2d(s, affine=false)), kernel=2)
    c3 = conv2d(p2, out=3, kernel=1)
    p3 = maxpool(relu(batchnorm2d(c3)), kernel=[2,1])
    o  = linear(flatten(p3), out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`
	models["bn pool gelu"] = `model G(image: f32[3,9,7], label: class[4]) {
    c1 = conv2d(image, out=4, kernel=3, padding=1, bias=false)
    p1 = maxpool(gelu(batchnorm2d(c1)), kernel=3, stride=2, padding=1)
    c2 = conv2d(p1, out=5, kernel=3, padding=1, bias=false)
    p2 = maxpool(gelu(batchnorm2d(c2, affine=false)), kernel=2)
    o  = linear(flatten(p2), out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`
	// a conv block folds each of them (and the max-pool after one: see the
	// "conv <act>" models), and so does a linear block
	models["activations after blocks"] = `model A(image: f32[3,7,5], label: class[4]) {
    c = conv2d(image, out=4, kernel=3, padding=1)
    s = silu(c)
    d = conv2d(s, out=3, kernel=3)
    h = linear(flatten(sigmoid(d)), out=6)
    o = linear(gelu(h), out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`
	// every pointwise activation folded into a conv block whose input
	// needs a gradient (the second conv, odd shapes), and into the image's
	for _, act := range linearActs {
		models["conv "+linearActName(act)] = convActModel(act)
	}
	// every pointwise activation folded into a linear block whose input
	// needs a gradient (the first block's output)
	for _, act := range linearActs {
		models["linear "+linearActName(act)] = linearActModel(act)
	}
	for name, src := range models {
		t.Run(name, func(t *testing.T) {
			unfused := compileWith(t, src, "fuse")
			fused := compileWith(t, src)
			hasFused := false
			for _, n := range fused.Nodes {
				if n.Op == ir.OpConvBlock || n.Op == ir.OpLinearBlock || n.Op == ops.ConvTanhPoolOp {
					hasFused = true
				}
			}
			require.True(t, hasFused, fused.Text())
			tails := 0
			for _, n := range fused.Nodes {
				assert.NotEqual(t, ir.OpSoftmaxCrossEntropy, n.Op, "the classifier tail is one linear_cross_entropy: %s", n.Text())
				if n.Op == ops.LinearCrossEntropyOp {
					tails++
					assert.Equal(t, name == "classifier tail clipped", n.Attrs.Opt == nil, n.Text())
				}
			}
			assert.Equal(t, 1, tails, fused.Text())
			if name == "batch norm relu into blocks" {
				masked := 0
				for _, n := range fused.Nodes {
					assert.NotEqual(t, ir.OpReLUGrad, n.Op, "the blocks' input gradients apply the ReLUs' masks: %s", n.Text())
					if n.Attrs.MaskOut {
						masked++
					}
				}
				assert.Equal(t, 2, masked, "c2's and o's input gradients take r1's and r2's masks")
			}
			if name == "tanh avgpool blocks" {
				var saves []bool
				for _, n := range fused.Nodes {
					assert.NotEqual(t, ops.Tanh, n.Op, n.Text())
					assert.NotEqual(t, ir.OpAvgPool2D, n.Op, n.Text())
					if n.Op == ops.ConvTanhPoolOp {
						saves = append(saves, n.Attrs.SaveAct)
					}
				}
				assert.Equal(t, []bool{false, true}, saves, "c1 (the image's) recomputes, c2 saves its tanh output")
			}
			if name == "activations after blocks" {
				for _, n := range fused.Nodes {
					assert.Nil(t, ops.PointwiseOf(n.Op), "silu and sigmoid fold into the conv blocks, gelu into h's: %s", n.Text())
				}
			}
			if act, ok := strings.CutPrefix(name, "conv "); ok {
				folded, saves := 0, 0
				for _, n := range fused.Nodes {
					assert.Nil(t, ops.PointwiseOf(n.Op), "%s folds into its conv block: %s", act, n.Text())
					if n.Attrs.Act != 0 {
						assert.Contains(t, []ir.Op{ir.OpConvBlock, ir.OpConvBlockGradInput, ir.OpConvBlockGradWeight}, n.Op, n.Text())
						folded++
					}
					if n.Op == ir.OpConvBlock && n.Attrs.SaveAct {
						saves++
						if n.Attrs.Pool == nil {
							require.Len(t, n.Outs, 2, n.Text()) // y, z
						} else { // y, argmax, z at the argmax: pooled-size
							require.Len(t, n.Outs, 3, n.Text())
							assert.True(t, n.Outs[2].Type.Equal(n.Outs[0].Type), n.Text())
						}
					}
				}
				// c1 (the image's: no input gradient) and c2 (both gradients)
				assert.Equal(t, 5, folded, "both blocks and their three gradients carry %s", act)
				wantSaves := map[string]int{"gelu": 2, "silu": 2, "hardswish": 2, "leaky_relu_negative": 2}[act]
				assert.Equal(t, wantSaves, saves, "a block saves z only when %s's gradient reads its input", act)
				pooled := 0
				for _, n := range fused.Nodes {
					assert.NotEqual(t, ir.OpMaxPool2D, n.Op, "the max-pool joins c2's block after %s: %s", act, n.Text())
					if n.Op == ir.OpConvBlock && n.Attrs.Pool != nil {
						pooled++
					}
				}
				assert.Equal(t, 1, pooled, "c2's block pools after %s", act)
				assert.LessOrEqual(t, savedBytes(fused), savedBytes(unfused), "the blocks save no more than the layers and activations they replace")
			}
			if act, ok := strings.CutPrefix(name, "linear "); ok {
				folded, saves := 0, 0
				for _, n := range fused.Nodes {
					if n.Attrs.Act != 0 {
						assert.Contains(t, []ir.Op{ir.OpLinearBlock, ir.OpLinearBlockGradInput, ir.OpLinearBlockGradWeight}, n.Op, n.Text())
						folded++
					}
					if n.Op == ir.OpLinearBlock && n.Attrs.SaveAct {
						saves++
						require.Len(t, n.Outs, 2, n.Text())
					}
				}
				assert.Equal(t, 3, folded, "h's block and its two gradients carry %s", act)
				wantSaves := map[string]int{"gelu": 1, "silu": 1, "hardswish": 1, "leaky_relu_negative": 1}[act]
				assert.Equal(t, wantSaves, saves, "the block saves z only when %s's gradient reads its input", act)
				standalone := 0
				for _, n := range fused.Nodes {
					if ops.PointwiseOf(n.Op) != nil {
						standalone++
					}
				}
				assert.Zero(t, standalone, "%s folds into h's block", act)
				assert.LessOrEqual(t, savedBytes(fused), savedBytes(unfused), "the blocks save no more than the layers and activations they replace")
			}
			if act, ok := strings.CutPrefix(name, "batch norm "); ok && act != "relu into blocks" {
				folded := 0
				for _, n := range fused.Nodes {
					assert.Nil(t, ops.PointwiseOf(n.Op), "%s folds into its batch norm", n.Text())
					if n.Attrs.Act != 0 {
						folded++
					}
				}
				assert.Equal(t, 4, folded, "both normalisations and both gradients carry %s", act)
			}
			if act, ok := strings.CutPrefix(name, "bn pool "); ok {
				pooled, grads, reluGrads := 0, 0, 0
				for _, n := range fused.Nodes {
					assert.NotEqual(t, ir.OpMaxPool2D, n.Op, "every max-pool folds into the batch norm before it: %s", n.Text())
					assert.Nil(t, ops.PointwiseOf(n.Op), "%s folds into its batch norm: %s", act, n.Text())
					if n.Op == ops.BatchNorm2D {
						require.NotNil(t, n.Attrs.Pool, n.Text())
						require.Len(t, n.Outs, 2, "the pooled output and its argmax: %s", n.Text())
						assert.Equal(t, ir.Argmax, n.Outs[1].Type.DType, n.Text())
						pooled++
					}
					if n.Op == ops.BatchNormGrad {
						require.NotNil(t, n.Attrs.Pool, n.Text())
						assert.Equal(t, ir.Argmax, n.Ins[len(n.Ins)-1].Type.DType, "the gradient reads the argmax: %s", n.Text())
						grads++
					}
					if n.Op == ir.OpReLUGrad {
						reluGrads++
					}
				}
				assert.Equal(t, grads, pooled, fused.Text())
				if act == "relu" {
					assert.Equal(t, 3, pooled, fused.Text())
					assert.Equal(t, 1, reluGrads, "p1 has two readers, so its mask is a relu_grad on the pooled values; p2's and p3's readers apply theirs")
				} else {
					assert.Equal(t, 2, pooled, fused.Text())
				}
				assert.Less(t, savedBytes(fused), savedBytes(unfused), "the full-resolution normalised values are not saved")
			}
			eu, ef := New(unfused, 7), New(fused, 7)
			rng := rand.New(rand.NewPCG(5, 6))
			for step := 0; step < 3; step++ {
				b := pixelBatch(fused, 3, rng)
				ru, err := eu.Run(b, Train)
				require.NoError(t, err)
				rf, err := ef.Run(b, Train)
				require.NoError(t, err)
				assert.InDelta(t, ru.Loss, rf.Loss, 1e-12*math.Abs(ru.Loss), "step %d loss", step)
				assert.Equal(t, ru.Correct, rf.Correct)
			}
			for _, p := range unfused.Params {
				q := fused.ParamByName(p.Name)
				require.NotNil(t, q)
				assert.Less(t, maxRelDiff(eu.Params[p], ef.Params[q]), 1e-10, p.Name)
				for i, s := range p.State {
					assert.Less(t, maxRelDiff(eu.State[s], ef.State[q.State[i]]), 1e-10, s.Name)
				}
			}
		})
	}
}

// Gradients mode on a fused graph reports the gradients its fused updates
// would apply, and leaves the parameters alone.
func TestFusedGradientsModeDoesNotUpdate(t *testing.T) {
	src := img + "  c = conv2d(image, out=3, kernel=3)\n  p = maxpool(relu(c), kernel=2)\n  logits = linear(flatten(p), out=4)\n" + tail
	unfused, fused := compileWith(t, src, "fuse"), compileWith(t, src)
	eu, ef := New(unfused, 1), New(fused, 1)
	b := pixelBatch(fused, 2, rand.New(rand.NewPCG(1, 2)))
	before := ef.Clone()
	ru, err := eu.Run(b, Gradients)
	require.NoError(t, err)
	rf, err := ef.Run(b, Gradients)
	require.NoError(t, err)
	for _, p := range unfused.Params {
		q := fused.ParamByName(p.Name)
		assert.Less(t, maxRelDiff(ru.Grad(unfused, p), rf.Grad(fused, q)), 1e-12, p.Name)
		assert.Equal(t, before.Params[q], ef.Params[q])
	}
}

// bnActs and bnActModel are internal/kernelcases' BNActs and BNActModel (which this package's
// tests cannot import: kernelcases imports the reference): bnrelu_odd.cnn's network with each
// activation besides ReLU in ReLU's place.
var bnActs = []string{"leaky_relu(%s, slope=0.2)", "sigmoid(%s)", "tanh(%s)", "gelu(%s)", "silu(%s)", "hardswish(%s)"}

// savedBytes is what g's forward pass saves for its backward pass: the
// bytes of a sample's forward activations that a backward node reads (not
// the gradients a classifier tail writes in the forward pass).
func savedBytes(g *ir.Graph) int64 {
	forward := map[*ir.Value]bool{}
	for _, n := range g.Nodes {
		if n.Phase == ir.Forward {
			for _, o := range n.Outs {
				forward[o] = true
			}
		}
	}
	seen := map[*ir.Value]bool{}
	var total int64
	for _, n := range g.Nodes {
		for _, v := range n.Ins {
			if n.Phase != ir.Forward && forward[v] && v.Role == ir.RoleActivation && !seen[v] {
				seen[v] = true
				total += v.Type.Bytes(1)
			}
		}
	}
	return total
}

// linearActs are the pointwise activations a linear block folds (a
// leaky_relu with a negative slope too: its output's sign is not its
// input's, so the block saves z), linearActModel a network with act after
// a hidden linear layer whose input needs a gradient.
var linearActs = append([]string{"leaky_relu(%s, slope=-0.3)"}, bnActs...)

func linearActName(act string) string {
	name := strings.Split(act, "(")[0]
	if strings.Contains(act, "slope=-") {
		name += "_negative"
	}
	return name
}

func linearActModel(act string) string {
	return fmt.Sprintf(`model L(image: f32[2,5,3], label: class[4]) {
    e = linear(flatten(image), out=6)
    h = linear(e, out=7)
    a = %s
    o = linear(a, out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`, fmt.Sprintf(act, "h"))
}

// convActModel: act after a conv on the image and after a strided,
// padded one whose input needs a gradient, then a max-pool (the block's
// unless act's gradient reads its input).
func convActModel(act string) string {
	return fmt.Sprintf(`model C(image: f32[2,9,7], label: class[4]) {
    c1 = conv2d(image, out=3, kernel=3, padding=1)
    a1 = %s
    c2 = conv2d(a1, out=5, kernel=[3,2], stride=[2,1], padding=[1,0])
    a2 = %s
    p  = maxpool(a2, kernel=2)
    o  = linear(flatten(p), out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`, fmt.Sprintf(act, "c1"), fmt.Sprintf(act, "c2"))
}

func bnActModel(act string) string {
	return fmt.Sprintf(`model B(image: f32[3,7,5], label: class[4]) {
    c  = conv2d(image, out=5, kernel=3, padding=1, bias=false)
    a  = %s
    p  = maxpool(a, kernel=2)
    f  = linear(flatten(p), out=9, bias=false)
    af = %s
    o  = linear(af, out=4)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) }
`, fmt.Sprintf(act, "batchnorm2d(c)"), fmt.Sprintf(act, "batchnorm1d(f, affine=false)"))
}
