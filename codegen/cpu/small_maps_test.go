package cpu_test

import (
	"testing"

	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
)

// smallMapConvs are conv blocks on maps a vector wide or less, as ResNet-18's last stages have
// (8x8, 4x4; strided 3x3 and 1x1 projection convs onto them), with odd channel counts: the forward
// and input gradient take one vector a row, the weight gradient units of several samples.
var smallMapConvs = []kernelcases.Conv{
	{C: 13, H: 4, W: 4, Out: 11, K: [2]int64{3, 3}, S: [2]int64{1, 1}, P: [2]int64{1, 1}, ReLU: true},
	{C: 9, H: 7, W: 7, Out: 10, K: [2]int64{3, 3}, S: [2]int64{2, 2}, P: [2]int64{1, 1}, Bias: true, ReLU: true},
	{C: 7, H: 8, W: 8, Out: 12, K: [2]int64{1, 1}, S: [2]int64{2, 2}, P: [2]int64{0, 0}},
	{C: 5, H: 6, W: 3, Out: 7, K: [2]int64{3, 3}, S: [2]int64{1, 1}, P: [2]int64{1, 1}, Bias: true, ReLU: true, Pool: kernelcases.Window([2]int64{2, 2}, [2]int64{2, 2}, [2]int64{0, 0})},
}

// The small-map conv kernels at batch 17 (the weight gradient's units take 2 samples each, the
// last one a single sample) against the float64 reference: forward, input gradient (plain and
// masked), weight gradient with gradients out and with the update fused.
func TestSmallMapConvKernels(t *testing.T) {
	var cases []kernelcases.Case
	for i, c := range smallMapConvs {
		cases = append(cases, kernelcases.Case{Name: "fwd " + c.String(), N: kernelcases.ConvForward(t, c)})
		plain, masked := c.F32(), c.F32()
		masked.Masked, masked.MaskOut = c.ReLU, true
		for _, v := range []kernelcases.Conv{plain, masked} {
			cases = append(cases, kernelcases.Case{Name: "dgrad " + v.String(), N: kernelcases.ConvGradInput(t, v)})
		}
		cases = append(cases, kernelcases.Case{Name: "wgrad " + c.String(), N: kernelcases.ConvGradWeight(t, c)})
		fused := c
		fused.Opt = kernelcases.Optimizers[i%len(kernelcases.Optimizers)]
		cases = append(cases, kernelcases.Case{Name: "wgrad " + fused.String(), N: kernelcases.ConvGradWeight(t, fused), O: reference.NodeOptions{Update: true, Step: 2}})
	}
	checkCases(t, 17, 1, cases)
}
