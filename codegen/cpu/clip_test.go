package cpu_test

import (
	"testing"

	"github.com/cnnc/cnnc/internal/kernelcases"
)

// Whole steps with gradient clipping (clip_grad_norm's norm kernels, the updates reading the
// coefficient) against the float64 reference, within kernelcheck.Tolerance: SGD with momentum
// and weight decay, and Adam.
func TestClipGradNormSteps(t *testing.T) {
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9, weight_decay=0.01)", "adam(lr=0.01)"} {
		t.Run(opt, func(t *testing.T) {
			checkSteps(t, "clip.cnn", []byte(kernelcases.ClipModel(opt)), 3, 3, 3)
		})
	}
}

// clip_grad_norm's kernels and the clipped updates, one node at a time against the float64
// reference (NaN-poisoned outputs, odd sizes, every instruction set).
func TestClipKernels(t *testing.T) {
	for variant := range 2 {
		checkCases(t, 1, 31, kernelcases.ClipChecks(t, variant))
	}
}
