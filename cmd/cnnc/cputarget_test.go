package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// dilatedModel has a dilated convolution, a depthwise one and label smoothing: the direct
// convolutions and the smoothed loss, which the CPU target generates.
const dilatedModel = "model M(image: f32[2,8,8], label: class[4]) {\n  c = conv2d(image, out=4, kernel=3)\n  d = conv2d(c, out=4, kernel=3, dilation=2)\n  e = conv2d(d, out=4, kernel=3, groups=4, padding=1)\n  r = relu(e)\n  f = linear(flatten(r), out=4)\n  loss = cross_entropy(f, label, label_smoothing=0.1)\n}\n"

// Every example and a model with dilated and depthwise convs and label smoothing build for the
// CPU target: no refusal.
func TestCPURefusalNoneForTheExamples(t *testing.T) {
	res, err := compiler.CompileSource("dilated.cnn", []byte(dilatedModel), compiler.Options{})
	require.NoError(t, err)
	assert.Nil(t, cpuRefusal(res, true))
	for _, m := range []string{"mnist.cnn", "simplecnn.cnn", "lenet5.cnn", "vgg_small.cnn", "mobilenet_small.cnn", "resnet18.cnn", "adam_dropout.cnn"} {
		src, err := os.ReadFile("../../examples/" + m)
		require.NoError(t, err)
		res, err := compiler.CompileSource(m, src, compiler.Options{})
		require.NoError(t, err)
		assert.Nil(t, cpuRefusal(res, true), m)
	}
}

// A layer the CPU target cannot generate (here an optimizer cnnc_cpu.h has no update for,
// planted in a compiled graph: the DSL has none) is refused at the layer: an error where
// --target cpu was asked for, a warning (the build falls back to the emulator) where it is the
// default.
func TestCPURefusal(t *testing.T) {
	res, err := compiler.CompileSource("dilated.cnn", []byte(dilatedModel), compiler.Options{})
	require.NoError(t, err)
	planted := false
	for _, n := range res.Graph.Nodes {
		if n.Attrs.Opt != nil && n.Name == "d" {
			opt := *n.Attrs.Opt
			opt.Kind = ir.OptimizerKind(99)
			n.Attrs.Opt = &opt
			planted = true
		}
	}
	require.True(t, planted, "no update of layer d")
	d := cpuRefusal(res, true)
	require.NotNil(t, d)
	assert.Equal(t, dsl.SeverityWarning, d.Severity)
	assert.Equal(t, 3, d.Pos.Line)
	assert.Contains(t, d.Error(), "d: the CPU target has no kernels for")
	assert.Contains(t, d.Error(), "optimizer optimizer99")
	assert.Equal(t, dsl.SeverityError, cpuRefusal(res, false).Severity)
}
