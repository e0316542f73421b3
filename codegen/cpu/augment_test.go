package cpu_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/native"
)

// The data block's augmentation, done by the kernels that read the raw batch, against the
// float64 reference (compiler/augment's Apply on the draw of ops.AugmentWord): whole training
// steps (kernelcheck.Step: loss, parameters, optimizer state after each, outputs NaN-poisoned),
// the kernels alone in training at a micro-batch's place in the batch, and evaluation's kernels.
// The augmented image differs from the reference's by a few float32 roundings per pixel (the
// bilinear weights and taps, the normalisation: relative ~1e-6 of a pixel), far below
// kernelcheck.Tolerance, so the steps' tolerance argument is TestStepSmallSimpleCNN's.

func TestAugmentSteps(t *testing.T) {
	checkSteps(t, "aug_crop.cnn", []byte(kernelcases.AugmentCrop), 5, 7, 3)
	checkSteps(t, "aug_resized.cnn", []byte(kernelcases.AugmentResized), 4, 9, 3)
	checkSteps(t, "aug_resized_conv.cnn", []byte(kernelcases.AugmentResizedConv), 3, 2, 2)
}

// The augmenting kernels alone: training (random draws) at samples [first, first+batch) of a
// larger batch, as a micro-batch loop runs them, with its step and seed; and evaluation (center
// box, normalize: no draw, no scalars).
func TestAugmentKernels(t *testing.T) {
	const batch = 3
	for mi, src := range []string{kernelcases.AugmentCrop, kernelcases.AugmentResized, kernelcases.AugmentResizedConv} {
		fwd, grad := kernelcases.AugmentNodes(t, src, batch)
		for _, eval := range []bool{false, true} {
			nodes := fwd
			if !eval {
				nodes = append(append([]*ir.Node{}, fwd...), grad...)
			}
			prog, err := cpu.GenerateNodes("A", nodes, codegen.Options{Batch: batch, Eval: eval})
			require.NoError(t, err)
			dev := openDevice(t, prog, native.Options{})
			for i, n := range nodes {
				ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(uint64(mi), uint64(i))))
				kernelcases.ValidArgmax(n, ins, rand.New(rand.NewPCG(uint64(mi), 77)))
				o := reference.NodeOptions{Training: !eval, Update: !eval, Seed: 11, Step: 5}
				sl := reference.Slice{First: 4, Of: 4 + batch}
				if eval {
					sl = reference.Slice{}
				}
				r, err := kernelcheck.NodeSlice(dev, prog, n, ins, kernelcheck.Scalars{Seed: 11, Step: 5, LR: kernelcases.LR}, o, sl)
				require.NoError(t, err)
				require.NotEmpty(t, r.Kernel)
				require.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "eval %v: %s", eval, r)
				require.Zero(t, r.ArgmaxMismatches, "%s", r)
				t.Log(r)
			}
		}
	}
}
