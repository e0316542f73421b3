package codegen_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// haloCases exercise the staged-region weight gradient beyond the forward
// cases: SimpleCNN's conv2 on an odd map (regions past the conv output,
// a pooled block's argmax routing), stride 2 with padding and two channel
// and row tiles (17 channels, 40 outputs), a rectangular kernel with a
// vertical stride over three column tiles (70 columns), a 2x2 kernel
// over a map one row high, and a u8 image of 3 channels (SimpleCNN's
// conv1 on an odd map: 9 planes).
var haloCases = []convCase{
	{C: 16, H: 15, W: 15, Out: 32, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
	{C: 17, H: 19, W: 37, Out: 40, K: k3, S: s2, P: p1, Bias: true, ReLU: true},
	{C: 3, H: 11, W: 70, Out: 7, K: [2]int64{3, 5}, S: [2]int64{2, 1}, P: [2]int64{0, 2}, Bias: true},
	{C: 5, H: 2, W: 9, Out: 16, K: k2, S: s1, P: p0, ReLU: true},
	{C: 3, H: 21, W: 19, U8: true, Out: 16, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: win(k2, s2, p0)},
}

// The staged-region kernel against the float64 reference (NaN-poisoned
// outputs: kernelcheck) on the forward cases whose pools do not overlap
// (tcBackwardCases says why) and haloCases, masked and unmasked, with
// and without a fused update, at batches 1, 3 and 5 (regions that split
// unevenly), TF32 and kernelcheck.Tolerance as every weight gradient.
// Where the kernel applies (TF32, f32 or u8 input without augmentation,
// more than one tap, shared memory enough) it is the one generated: here
// on every case of more than one tap, u8 images (HWC, scaled at the end)
// and few channels (planes of (kx, channel) pairs: a 7x7 kernel over 2
// channels, 14 planes, one fragment per kernel row) included.
//
// Its partials can outgrow the gathering kernel's on these small shapes
// and few SMs, where the generator would keep the gathering kernel
// (wgradHaloChosen): the test forces the staged-region one, and
// TestConvWeightGradHaloOnlyWhereItsPartialsFit checks the choice.
func TestConvWeightGradHaloTensorCores(t *testing.T) {
	defer codegen.SetForceWgradHalo(true)()
	cases := append(append([]convCase{}, tcBackwardCases()...), haloCases...)
	for _, batch := range []int64{1, 3, 5} {
		var checks []kernelCheck
		var nodes []*ir.Node
		for i, c := range cases {
			plain := c
			plain.Masked = c.ReLU && i%2 == 1
			n := kernelcases.ConvGradWeight(t, plain)
			checks = append(checks, kernelCheck{name: plain.String(), n: n})
			nodes = append(nodes, n)
			fused := c
			fused.Opt = optimizers[i%len(optimizers)]
			checks = append(checks, kernelCheck{name: fused.String() + " step 3", n: kernelcases.ConvGradWeight(t, fused), o: reference.NodeOptions{Update: true, Step: 3}})
		}
		t.Logf("batch %d: worst relative error %.2e", batch, runKernelChecksAt(t, codegen.TF32, batch, checks))
		if batch != 3 {
			continue
		}
		for i, c := range cases {
			prog, err := codegen.GenerateNodes("T", nodes[i:i+1], codegen.Options{Batch: batch, Precision: codegen.TF32, SMs: testSMs(codegen.TF32)})
			require.NoError(t, err)
			halo := false
			for _, k := range prog.Kernels {
				halo = halo || strings.HasSuffix(k.Name, "_halo")
			}
			assert.Equal(t, c.K[0]*c.K[1] > 1, halo, "%s: the staged-region kernel", c)
		}
	}
}

// The staged-region kernels of haloCases, the forward cases and the
// realistic ones compile for sm_80 and sm_90 without spills (TF32; the
// 64-bit index variant included).
func TestPtxasConvWeightGradHalo(t *testing.T) {
	nvcc.Require(t)
	defer codegen.SetForceWgradHalo(true)()
	cases := append(append(append([]convCase{}, haloCases...), forwardCases...), realisticCases...)
	var nodes []*ir.Node
	for i, c := range cases {
		wg := c
		wg.Masked = c.ReLU && i%2 == 1
		if i%3 != 2 {
			wg.Opt = optimizers[i%len(optimizers)]
		}
		nodes = append(nodes, kernelcases.ConvGradWeight(t, wg))
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: codegen.TF32, SMs: testSMs(codegen.TF32)})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "conv_wgrad_halo.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
	halos := 0
	for _, k := range ks {
		if strings.HasSuffix(k.Name, "_halo") {
			halos++
		}
	}
	require.Positive(t, halos)
}

// The staged-region weight gradient is generated only where its partials
// are no larger than the gathering kernel's (wgradHaloChosen), so the
// faster kernel never raises the workspace the memory plan sees: on an
// H200's 132 SMs at batch 32, SimpleCNN's conv1 (a u8 image of 3
// channels) takes it with fewer partials, and its conv2 keeps the
// gathering kernel, whose partials the staged-region one would exceed.
func TestConvWeightGradHaloOnlyWhereItsPartialsFit(t *testing.T) {
	const sms, batch = 132, 32
	pool := win([2]int64{2, 2}, [2]int64{2, 2}, p0)
	conv1 := convCase{C: 3, H: 128, W: 128, U8: true, Out: 16, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: pool}
	conv2 := convCase{C: 16, H: 63, W: 63, Out: 32, K: k3, S: s1, P: p0, Bias: true, ReLU: true, Pool: pool}
	gen := func(c convCase, force bool) (halo bool, scratch int64) {
		defer codegen.SetForceWgradHalo(force)()
		n := kernelcases.ConvGradWeight(t, c)
		prog, err := codegen.GenerateNodes("T", []*ir.Node{n}, codegen.Options{Batch: batch, Precision: codegen.TF32, SMs: sms})
		require.NoError(t, err)
		for _, k := range prog.Kernels {
			halo = halo || strings.HasSuffix(k.Name, "_halo")
		}
		return halo, codegen.ScratchBytesAt(n, batch, codegen.TF32, sms)
	}
	halo1, chosen1 := gen(conv1, false)
	assert.True(t, halo1, "conv1: the staged-region kernel")
	_, forced1 := gen(conv1, true)
	assert.Equal(t, forced1, chosen1, "conv1: its own partials")
	halo2, chosen2 := gen(conv2, false)
	forcedHalo2, forced2 := gen(conv2, true)
	assert.False(t, halo2, "conv2: the gathering kernel")
	assert.True(t, forcedHalo2, "conv2: the staged-region kernel applies")
	assert.Greater(t, forced2, chosen2, "conv2: the staged-region kernel's partials are the larger")
}
