package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func cnnc(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCheckSimpleCNN(t *testing.T) {
	code, out, errOut := cnnc("check", "../../examples/simplecnn.cnn")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "total params:        3,692,906")
	assert.Contains(t, out, "[32,32,30,30]")
	assert.Contains(t, out, "conv2d")
	assert.Empty(t, errOut)
}

func TestCheckSeedModelFailsAtTheLine(t *testing.T) {
	code, out, errOut := cnnc("check", "../../examples/seed_simplecnn.cnn")
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "../../examples/seed_simplecnn.cnn:11:13: fc1: linear expects 28800 input features (32x30x30) but flatten gives 492032 (32x124x124)")
	assert.Contains(t, errOut, "a 2x2 max-pool after each conv gives exactly 32x30x30")
	assert.NotContains(t, errOut, "goroutine", "never a Go stack trace")
}

func TestFlagsBeforeOrAfterTheFile(t *testing.T) {
	c1, out1, _ := cnnc("check", "--batch", "8", "../../examples/mnist.cnn")
	c2, out2, _ := cnnc("check", "../../examples/mnist.cnn", "--batch=8")
	require.Equal(t, 0, c1)
	require.Equal(t, 0, c2)
	assert.Equal(t, out1, out2)
	assert.Contains(t, out1, "batch 8")
}

func TestDumpAfter(t *testing.T) {
	code, out, errOut := cnnc("check", "../../examples/mnist.cnn", "--dump-after", "shapes")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "# IR after shapes\ngraph MNISTNet\n")
	assert.NotContains(t, out, "backward:")
	code, out, _ = cnnc("check", "--dump-after=all", "../../examples/mnist.cnn")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "# IR after autodiff")
	assert.Contains(t, out, "update:\n  sgd_update(")
	code, _, errOut = cnnc("check", "--dump-after=bogus", "../../examples/mnist.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `unknown pass "bogus" (passes: shapes, dce, autodiff, fuse)`)
}

func TestBadCommandLines(t *testing.T) {
	code, _, errOut := cnnc("check")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "check takes one model file")
	code, _, errOut = cnnc("check", "does/not/exist.cnn")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "does/not/exist.cnn")
	code, _, errOut = cnnc("frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "unknown command")
	code, _, errOut = cnnc("check", "--batch=-3", "../../examples/mnist.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--batch must be positive")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.cnn")
	require.NoError(t, os.WriteFile(bad, []byte("model M(image: f32[1,4,4], label: class[2]) {\n  x = relu(imag)\n}\n"), 0o644))
	code, _, errOut = cnnc("check", bad)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, bad+":2:12: unknown name imag\n      x = relu(imag)\n               ^~~~\n    did you mean image?\n")
}

func TestHelpForEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"check", "-h"}, {"passes", "-h"}} {
		code, out, _ := cnnc(args...)
		assert.Equal(t, 0, code, args)
		assert.Contains(t, out, "Usage:", args)
	}
	_, out, _ := cnnc("check", "-h")
	assert.Contains(t, out, "--dump-after")
	assert.Contains(t, out, "--batch")
}

func TestPassesLists(t *testing.T) {
	code, out, _ := cnnc("passes")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "shapes     required")
	assert.Contains(t, out, "dce        optional")
}
