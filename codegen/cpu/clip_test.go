package cpu_test

import (
	"testing"

	"github.com/cnnc/cnnc/internal/kernelcases"
)

// clipModel is a small SimpleCNN (odd sizes: 4 and 5 channels, 12 features, 14x13 images) whose
// train block clips the gradients' global norm to a max_norm so small that the coefficient is
// far below 1 at every step, with optimizer opt.
func clipModel(opt string) string {
	return `model S(image: f32[3,14,13], label: class[10]) {
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
train {
    optimizer = ` + opt + `
    clip_grad_norm = 0.01
}
`
}

// Whole steps with gradient clipping (clip_grad_norm's norm kernels, the updates reading the
// coefficient) against the float64 reference, within kernelcheck.Tolerance: SGD with momentum
// and weight decay, and Adam.
func TestClipGradNormSteps(t *testing.T) {
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9, weight_decay=0.01)", "adam(lr=0.01)"} {
		t.Run(opt, func(t *testing.T) {
			checkSteps(t, "clip.cnn", []byte(clipModel(opt)), 3, 3, 3)
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
