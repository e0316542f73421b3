package kernelcases

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/runtime/device"
)

// The data block's augmentation: models whose first layers augment the raw batch in their loads,
// for both targets' step and kernel tests.

// AugmentCrop: random_crop with padding, hflip, normalize on odd sizes; the conv block reads the
// image (its forward and weight-gradient kernels augment).
const AugmentCrop = `model A(image: f32[3,13,11], label: class[4]) {
    conv1 = conv2d(image, out=4, kernel=3, padding=1)
    relu1 = relu(conv1)
    pool1 = maxpool(relu1, kernel=2)
    fc1   = linear(flatten(pool1), out=4)
    loss  = cross_entropy(fc1, label)
}
train { optimizer = sgd(lr=0.05, momentum=0.9) }
data {
    train = imagefolder("data/train", resize=[15,14])
    augment = [random_crop(size=[13,11], padding=2), hflip(p=0.5), normalize(mean=[0.4,0.5,0.6], std=[0.2,0.25,0.3])]
}
`

// AugmentResized: hflip before random_resized_crop (the box mirrored), the image read by a linear
// layer (to_tensor augments), one channel.
const AugmentResized = `model R(image: f32[1,9,10], label: class[3]) {
    fc1  = linear(flatten(image), out=6)
    relu = relu(fc1)
    fc2  = linear(relu, out=3)
    loss = cross_entropy(fc2, label)
}
train { optimizer = adam(lr=0.01) }
data {
    train = imagefolder("data/train", resize=[17,19])
    augment = [hflip(p=0.7), random_resized_crop(size=[9,10], scale=[0.2,1.0], ratio=[0.5,2.0]), normalize(mean=[0.5], std=[0.3])]
}
`

// AugmentResizedConv: random_resized_crop then hflip, read by a strided conv block without pool.
const AugmentResizedConv = `model Q(image: f32[3,10,9], label: class[3]) {
    conv1 = conv2d(image, out=5, kernel=3, stride=2)
    fc1   = linear(flatten(conv1), out=3)
    loss  = cross_entropy(fc1, label)
}
train { optimizer = sgd(lr=0.05) }
data {
    train = imagefolder("data/train", resize=[21,16])
    augment = [random_resized_crop(size=[10,9], scale=[0.1,0.9]), hflip()]
}
`

// AugmentNodes compiles src at batch and returns its forward nodes that augment the image and
// the weight gradients reading it.
func AugmentNodes(t *testing.T, src string, batch int64) (fwd, grad []*ir.Node) {
	t.Helper()
	res, err := compiler.CompileSource("aug.cnn", []byte(src), compiler.Options{Batch: batch})
	require.NoError(t, err)
	for _, n := range res.Graph.Nodes {
		if n.Attrs.Aug == nil {
			continue
		}
		if n.Phase == ir.Forward {
			fwd = append(fwd, n)
		} else {
			grad = append(grad, n)
		}
	}
	require.NotEmpty(t, fwd)
	return fwd, grad
}

// AugmentKernels checks one target's augmenting kernels against the reference: every Augment*
// model's nodes that read the image, at batch 3, in training (their random draws, at samples
// [4, 7) of a batch of 7 as a micro-batch loop runs them, step 5, seed 11) and in evaluation
// (the center box), at each precision. open generates the nodes' program with the options and
// opens a device on it (closed by the caller's cleanup). Tolerance: kernelcheck.Tolerance at
// fp32; at TF32/BF16, tcTol (the f32 inputs are rounded first, kernelcheck.RoundInputs, but the
// augmented pixels only in the kernels: see the callers).
func AugmentKernels(t *testing.T, precs []codegen.Precision, tcTol float64, open func(nodes []*ir.Node, o codegen.Options) (*codegen.Program, device.Device)) {
	t.Helper()
	const batch = 3
	for _, prec := range precs {
		for mi, src := range []string{AugmentCrop, AugmentResized, AugmentResizedConv} {
			fwd, grad := AugmentNodes(t, src, batch)
			for _, eval := range []bool{false, true} {
				nodes := fwd
				if !eval {
					nodes = append(append([]*ir.Node{}, fwd...), grad...)
				}
				prog, dev := open(nodes, codegen.Options{Batch: batch, Eval: eval, Precision: prec})
				for i, n := range nodes {
					ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(uint64(mi), uint64(i))))
					ValidArgmax(n, ins, rand.New(rand.NewPCG(uint64(mi), 77)))
					ins = kernelcheck.RoundInputs(n, ins, prec)
					o := reference.NodeOptions{Training: !eval, Update: !eval, Seed: 11, Step: 5}
					sl := reference.Slice{First: 4, Of: 4 + batch}
					if eval {
						sl = reference.Slice{}
					}
					r, err := kernelcheck.NodeSlice(dev, prog, n, ins, kernelcheck.Scalars{Seed: 11, Step: 5, LR: LR}, o, sl)
					require.NoError(t, err)
					require.NotEmpty(t, r.Kernel)
					tol := kernelcheck.Tolerance
					if prec != codegen.FP32 && prec != "" {
						tol = tcTol
					}
					require.LessOrEqual(t, r.Worst, tol, "%s eval %v: %s", prec, eval, r)
					require.Zero(t, r.ArgmaxMismatches, "%s", r)
					t.Logf("%s eval %v: %s", prec, eval, r)
				}
			}
		}
	}
}
