package codegen_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// The CUDA kernels that augment the raw batch (templates/augment.cu.tmpl in the conv blocks'
// loads and to_tensor) on the emulator against the float64 reference, as codegen/cpu's
// augment_test.go checks the CPU target's: whole steps, the kernels alone in training at a
// micro-batch's place in the batch and in evaluation, at fp32 and (the conv blocks' tensor-core
// variants) TF32. Tolerance as there. At TF32 the f32 inputs are rounded to TF32 first
// (kernelcheck.RoundInputs, as the other tensor-core checks), but the augmented pixels are rounded
// in the kernels only: each product's relative error is then up to 2^-11, the sum's up to 2^-11
// of the sum of the |products|, which for K = 27 terms of random signs is about K·E|p| against a
// tensor maximum of at least about 2·sqrt(K)·rms(p): 2^-11·sqrt(27)/2 ≈ 1.3e-3 of the maximum at
// worst. TF32 is checked at 2e-3 (measured worst: about 3e-4).

func TestAugmentStepsEmulated(t *testing.T) {
	checkSteps(t, "aug_crop.cnn", []byte(kernelcases.AugmentCrop), 5, 7, 2)
	checkSteps(t, "aug_resized.cnn", []byte(kernelcases.AugmentResized), 4, 9, 2)
	checkSteps(t, "aug_resized_conv.cnn", []byte(kernelcases.AugmentResizedConv), 3, 2, 2)
}

func TestAugmentKernelsEmulated(t *testing.T) {
	kernelcases.AugmentKernels(t, []codegen.Precision{codegen.FP32, codegen.TF32}, 2e-3, func(nodes []*ir.Node, o codegen.Options) (*codegen.Program, device.Device) {
		prog, err := codegen.GenerateNodes("A", nodes, o)
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "aug.cu", cpu.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { dev.Close() })
		return prog, dev
	})
}

// The augmenting kernels (training's draw, evaluation's box; fp32 and TF32 conv blocks,
// to_tensor) and examples/mnist_augment.cnn's whole step compile for sm_80 and sm_90 with no
// spill and no local-memory stack frame.
func TestPtxasAugment(t *testing.T) {
	nvcc.Require(t)
	for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32} {
		var nodes []*ir.Node
		for _, src := range []string{kernelcases.AugmentCrop, kernelcases.AugmentResized, kernelcases.AugmentResizedConv} {
			fwd, grad := kernelcases.AugmentNodes(t, src, 32)
			nodes = append(append(nodes, fwd...), grad...)
		}
		for _, eval := range []bool{false, true} {
			some := nodes
			if eval {
				some = nil
				for _, n := range nodes {
					if n.Phase == ir.Forward {
						some = append(some, n)
					}
				}
			}
			prog, err := codegen.GenerateNodes("A", some, codegen.Options{Batch: 32, Eval: eval, Precision: prec})
			require.NoError(t, err)
			ks, err := codegen.CompilePtxas(prog.Source, "aug.cu", nvcc.Targets)
			require.NoError(t, err)
			requireClean(t, prog, ks)
		}
	}
	_, prog := exampleProgram(t, "../examples/mnist_augment.cnn", 64)
	ks, err := codegen.CompilePtxas(prog.Source, "mnist_augment.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}
