package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/dsl"
)

// dilatedModel has a dilated convolution, which the CPU target has no kernels for yet.
const dilatedModel = "model M(image: f32[1,8,8], label: class[4]) {\n  c = conv2d(image, out=4, kernel=3)\n  d = conv2d(c, out=4, kernel=3, dilation=2)\n  r = relu(d)\n  f = linear(flatten(r), out=4)\n  loss = cross_entropy(f, label)\n}\n"

// --target cpu refuses a model with a layer the CPU target cannot generate, at the layer, and
// builds nothing.
func TestBuildTargetCPURefusesDilatedConvAtTheLayer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dilated.cnn")
	require.NoError(t, os.WriteFile(path, []byte(dilatedModel), 0o600))
	bin := filepath.Join(dir, "trainer")
	code, _, errOut := cnnc("build", "--target", "cpu", "-o", bin, path)
	assert.Equal(t, exitModel, code, errOut)
	assert.Contains(t, errOut, path+":3:7: d: the CPU target has no kernels for conv2d yet")
	assert.Contains(t, errOut, "--target emu")
	_, err := os.Stat(bin)
	assert.True(t, os.IsNotExist(err), "no trainer is built")
}

// Where --target cpu is only the default, the same layer is a warning and the build falls back
// to the emulator (cpuRefusal's severity); a model the CPU target generates has no refusal.
func TestCPURefusal(t *testing.T) {
	res, err := compiler.CompileSource("dilated.cnn", []byte(dilatedModel), compiler.Options{})
	require.NoError(t, err)
	d := cpuRefusal(res, true)
	require.NotNil(t, d)
	assert.Equal(t, dsl.SeverityWarning, d.Severity)
	assert.Equal(t, 3, d.Pos.Line)
	assert.Equal(t, dsl.SeverityError, cpuRefusal(res, false).Severity)

	for _, m := range []string{"mnist.cnn", "vgg_small.cnn"} { // vgg_small: batch norm, dropout
		src, err := os.ReadFile("../../examples/" + m)
		require.NoError(t, err)
		res, err := compiler.CompileSource(m, src, compiler.Options{})
		require.NoError(t, err)
		assert.Nil(t, cpuRefusal(res, true), m)
	}
}
