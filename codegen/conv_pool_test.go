package codegen_test

import (
	"testing"

	"github.com/cnnc/cnnc/internal/kernelcases"
)

// The conv2d -> tanh -> avgpool2d block's kernels (forward with and
// without the saved tanh output, input gradient, weight gradient reading
// t or recomputing it) against the reference on odd shapes, outputs
// NaN-poisoned, at batches 1 and 3.
func TestConvTanhPoolKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range kernelcases.ConvPoolChecks(t) {
			checks = append(checks, kernelCheck{name: c.Name, n: c.N, o: c.O})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}
