package cpu_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/device"
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

// The augmenting kernels alone: training (random draws) at a micro-batch's place in the batch,
// and evaluation (center box, normalize: no draw, no scalars).
func TestAugmentKernels(t *testing.T) {
	kernelcases.AugmentKernels(t, []codegen.Precision{codegen.FP32}, 0, func(nodes []*ir.Node, o codegen.Options) (*codegen.Program, device.Device) {
		prog, err := cpu.GenerateNodes("A", nodes, o)
		require.NoError(t, err)
		return prog, openDevice(t, prog, native.Options{})
	})
}
