package codegen_test

import (
	"fmt"
	"testing"

	"github.com/cnnc/cnnc/compiler/ir"
)

// poolCases: odd sizes (rows and columns no window reads), overlapping and
// padded windows, rectangular windows, strides larger than the window
// (gaps), 1x1 windows.
var poolCases = []struct {
	c, h, w int64
	k, s, p [2]int64
}{
	{c: 3, h: 13, w: 11, k: k2, s: s2, p: p0},
	{c: 5, h: 7, w: 5, k: k3, s: s2, p: p1},
	{c: 17, h: 9, w: 8, k: [2]int64{3, 2}, s: [2]int64{1, 2}, p: [2]int64{1, 0}},
	{c: 2, h: 6, w: 7, k: k1, s: s1, p: p0},
	{c: 4, h: 11, w: 12, k: k5, s: [2]int64{3, 3}, p: [2]int64{2, 2}},
	{c: 3, h: 10, w: 9, k: k2, s: [2]int64{3, 3}, p: p1},
}

func TestPoolKernels(t *testing.T) {
	for _, batch := range []int64{1, 3} {
		var checks []kernelCheck
		for _, c := range poolCases {
			a := ir.Attrs{Kernel: c.k, Stride: c.s, Pad: c.p}
			x := ir.F32Batched(c.c, c.h, c.w)
			name := fmt.Sprintf("%dx%dx%d_k%dx%d_s%dx%d_p%dx%d", c.c, c.h, c.w, c.k[0], c.k[1], c.s[0], c.s[1], c.p[0], c.p[1])
			maxFwd := node(t, ir.OpMaxPool2D, a, x)
			avgFwd := node(t, ir.OpAvgPool2D, a, x)
			y := maxFwd.Out().Type
			ga := a
			ga.Dims = x.Dims
			checks = append(checks,
				kernelCheck{name: "maxpool2d " + name, n: maxFwd},
				kernelCheck{name: "avgpool2d " + name, n: avgFwd},
				kernelCheck{name: "maxpool2d_grad " + name, n: node(t, ir.OpMaxPool2DGrad, a, y, x)},
				kernelCheck{name: "avgpool2d_grad " + name, n: node(t, ir.OpAvgPool2DGrad, ga, y)})
		}
		t.Logf("worst relative error at batch %d: %.2e", batch, runKernelChecks(t, batch, checks))
	}
}
