package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// paramCheckpoint writes a checkpoint holding model's parameters (a
// constant pattern) and optimizer state, as a trainer's has.
func paramCheckpoint(t *testing.T, model, path string) {
	t.Helper()
	src, err := os.ReadFile(model)
	require.NoError(t, err)
	res, err := compiler.CompileSource(model, src, compiler.Options{StopAfter: "dce"})
	require.NoError(t, err)
	var ts []checkpoint.Tensor
	for _, p := range res.Graph.Params {
		vals := make([]float32, p.Value.Type.SampleElems())
		for i := range vals {
			vals[i] = float32(i%5) / 50
		}
		ts = append(ts, checkpoint.F32Tensor(p.Name, p.Value.Type.Dims, vals))
		ts = append(ts, checkpoint.F32Tensor("optimizer."+p.Name+".momentum_buffer", p.Value.Type.Dims, vals))
	}
	require.NoError(t, checkpoint.Write(path, ts, map[string]string{"step": "42"}))
}

// cnnc export writes the ONNX model and says what it holds; the export
// package's tests run such files in ONNX Runtime.
func TestExportCommand(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "mnist.safetensors")
	paramCheckpoint(t, "../../examples/mnist.cnn", ck)
	out := filepath.Join(dir, "mnist.onnx")
	code, stdout, stderr := cnnc("export", "--onnx", out, "--checkpoint", ck, "../../examples/mnist.cnn")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, stderr)
	info, err := os.Stat(out)
	require.NoError(t, err)
	// MNISTNet's 52,138 parameters are 4 bytes each, the graph around them is small
	assert.Greater(t, info.Size(), int64(4*52138))
	assert.Less(t, info.Size(), int64(4*52138+4096))
	assert.Contains(t, stdout, "wrote "+out+" (")
	assert.Contains(t, stdout, "MNISTNet, 10 ONNX nodes, 8 initializers, opset 13; input image float32[batch,1,28,28] in [0,1], output logits float32[batch,10]")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 2, "no temporary file left behind")

	code, stdout, _ = cnnc("export", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, stdout, "--checkpoint")
	assert.Contains(t, stdout, `output "logits"`)
}

func TestExportCommandErrors(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "mnist.safetensors")
	paramCheckpoint(t, "../../examples/mnist.cnn", ck)
	out := filepath.Join(dir, "m.onnx")

	code, _, stderr := cnnc("export", "--checkpoint", ck, "../../examples/mnist.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--onnx OUT.onnx and --checkpoint CK are required")
	code, _, stderr = cnnc("export", "--onnx", out, "../../examples/mnist.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "--checkpoint CK are required")
	code, _, stderr = cnnc("export", "--onnx", out, "--checkpoint", ck)
	assert.Equal(t, 2, code)
	assert.Contains(t, stderr, "export takes one model file")

	code, _, stderr = cnnc("export", "--onnx", out, "--checkpoint", filepath.Join(dir, "missing.safetensors"), "../../examples/mnist.cnn")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "cnnc export: --checkpoint: stat "+filepath.Join(dir, "missing.safetensors")+": no such file or directory")
	// a checkpoint of another model names the tensor it lacks
	code, _, stderr = cnnc("export", "--onnx", out, "--checkpoint", ck, "../../examples/simplecnn.cnn")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `tensor "conv1.weight" has shape [8 1 3 3], the model needs [16 3 3 3]`)
	// a model error is positioned as in every command
	code, _, stderr = cnnc("export", "--onnx", out, "--checkpoint", ck, "../../examples/seed_simplecnn.cnn")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "seed_simplecnn.cnn:11:13: fc1: linear expects 28800 input features")
	code, _, stderr = cnnc("export", "--onnx", filepath.Join(dir, "no", "such", "dir", "m.onnx"), "--checkpoint", ck, "../../examples/mnist.cnn")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "cnnc export: --onnx: ")
	_, err := os.Stat(out)
	assert.True(t, os.IsNotExist(err), "no model written on errors")
}
