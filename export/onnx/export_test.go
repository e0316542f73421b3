package onnx_test

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/export/onnx"
	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// field is one decoded protobuf field.
type field struct {
	num    int
	varint uint64
	bytes  []byte
}

// decode splits a protobuf message into its fields (varint and
// length-delimited: all the exporter writes); it fails on anything else.
func decode(t *testing.T, b []byte) []field {
	t.Helper()
	var out []field
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		require.Positive(t, n, "bad tag")
		b = b[n:]
		f := field{num: int(key >> 3)}
		switch key & 7 {
		case 0:
			f.varint, n = binary.Uvarint(b)
			require.Positive(t, n, "bad varint in field %d", f.num)
			b = b[n:]
		case 2:
			l, n := binary.Uvarint(b)
			require.Positive(t, n, "bad length in field %d", f.num)
			require.LessOrEqual(t, l, uint64(len(b)-n), "field %d overruns the message", f.num)
			f.bytes = b[n : n+int(l)]
			b = b[n+int(l):]
		default:
			t.Fatalf("field %d: wire type %d", f.num, key&7)
		}
		out = append(out, f)
	}
	return out
}

func fieldsNamed(t *testing.T, b []byte, num int) []field {
	var out []field
	for _, f := range decode(t, b) {
		if f.num == num {
			out = append(out, f)
		}
	}
	return out
}

func one(t *testing.T, b []byte, num int) field {
	t.Helper()
	fs := fieldsNamed(t, b, num)
	require.Len(t, fs, 1, "field %d", num)
	return fs[0]
}

func strs(t *testing.T, b []byte, num int) []string {
	var out []string
	for _, f := range fieldsNamed(t, b, num) {
		out = append(out, string(f.bytes))
	}
	return out
}

// shapeOf decodes a ValueInfoProto's name and dims ("batch" as -1).
func shapeOf(t *testing.T, vi []byte) (string, int, []int64) {
	t.Helper()
	tensor := one(t, one(t, vi, 2).bytes, 1).bytes // TypeProto.tensor_type
	var dims []int64
	for _, d := range fieldsNamed(t, one(t, tensor, 2).bytes, 1) {
		fs := decode(t, d.bytes)
		require.Len(t, fs, 1)
		if fs[0].num == 2 {
			assert.Equal(t, "batch", string(fs[0].bytes))
			dims = append(dims, -1)
		} else {
			dims = append(dims, int64(fs[0].varint))
		}
	}
	return string(one(t, vi, 1).bytes), int(one(t, tensor, 1).varint), dims
}

// The encoded MNIST model, read back field by field with onnx.proto's
// numbers: versions, the opset, the graph's input, output, nodes with
// their attributes, and initializers carrying the checkpoint's names and
// bytes in the model's parameter order. (ONNX's own checker and ONNX
// Runtime read it in runtime_test.go when they are installed; this test
// needs neither.)
func TestExportEncoding(t *testing.T) {
	m := models[0]
	ckPath := trainCheckpoint(t, m)
	res := forward(t, m.path)
	_, model := exportFile(t, res, ckPath, t.TempDir(), "mnist", onnx.Options{ProducerVersion: "v9", DocString: "doc", Metadata: map[string]string{"b": "2", "a": "1"}})
	b := model.Marshal()

	assert.Equal(t, uint64(7), one(t, b, 1).varint)
	assert.Equal(t, "cnnc", string(one(t, b, 2).bytes))
	assert.Equal(t, "v9", string(one(t, b, 3).bytes))
	assert.Equal(t, "doc", string(one(t, b, 6).bytes))
	opset := one(t, b, 8).bytes
	assert.Empty(t, fieldsNamed(t, opset, 1), "the default domain is left empty")
	assert.Equal(t, uint64(13), one(t, opset, 2).varint)
	var meta []string
	for _, f := range fieldsNamed(t, b, 14) {
		meta = append(meta, string(one(t, f.bytes, 1).bytes)+"="+string(one(t, f.bytes, 2).bytes))
	}
	assert.Equal(t, []string{"a=1", "b=2"}, meta)

	g := one(t, b, 7).bytes
	assert.Equal(t, "MNISTNet", string(one(t, g, 2).bytes))
	name, elem, dims := shapeOf(t, one(t, g, 11).bytes)
	assert.Equal(t, "image", name)
	assert.Equal(t, 1, elem) // FLOAT
	assert.Equal(t, []int64{-1, 1, 28, 28}, dims)
	name, elem, dims = shapeOf(t, one(t, g, 12).bytes)
	assert.Equal(t, "logits", name)
	assert.Equal(t, 1, elem)
	assert.Equal(t, []int64{-1, 10}, dims)

	var ops []string
	nodes := fieldsNamed(t, g, 1)
	for _, n := range nodes {
		ops = append(ops, string(one(t, n.bytes, 4).bytes))
	}
	assert.Equal(t, []string{"Conv", "Relu", "MaxPool", "Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Relu", "Gemm"}, ops)
	conv1 := nodes[0].bytes
	assert.Equal(t, []string{"image", "conv1.weight", "conv1.bias"}, strs(t, conv1, 1))
	assert.Equal(t, []string{"conv1"}, strs(t, conv1, 2))
	attrs := map[string][]int64{}
	for _, a := range fieldsNamed(t, conv1, 5) {
		var vals []int64
		typ := one(t, a.bytes, 20).varint
		for _, f := range decode(t, a.bytes) {
			if f.num == 3 || f.num == 8 {
				vals = append(vals, int64(f.varint))
			}
		}
		attrs[string(one(t, a.bytes, 1).bytes)] = append([]int64{int64(typ)}, vals...)
	}
	// type 7 = INTS, 2 = INT; pads are [top, left, bottom, right]
	assert.Equal(t, map[string][]int64{
		"kernel_shape": {7, 3, 3}, "strides": {7, 1, 1}, "pads": {7, 1, 1, 1, 1}, "dilations": {7, 1, 1}, "group": {2, 1},
	}, attrs)
	last := nodes[len(nodes)-1].bytes
	assert.Equal(t, []string{"relu3", "fc2.weight", "fc2.bias"}, strs(t, last, 1))
	assert.Equal(t, []string{"logits"}, strs(t, last, 2))

	ck, err := checkpoint.Read(ckPath)
	require.NoError(t, err)
	var names []string
	for i, init := range fieldsNamed(t, g, 5) {
		p := res.Graph.Params[i]
		name := string(one(t, init.bytes, 8).bytes)
		names = append(names, name)
		assert.Equal(t, uint64(1), one(t, init.bytes, 2).varint, "%s: FLOAT", name)
		var shape []int64
		for _, d := range fieldsNamed(t, init.bytes, 1) {
			shape = append(shape, int64(d.varint))
		}
		assert.Equal(t, p.Value.Type.Dims, shape, name)
		ct, ok := ck.Tensor(name)
		require.True(t, ok, name)
		assert.Equal(t, ct.Data, one(t, init.bytes, 9).bytes, "%s: raw_data is the checkpoint's bytes", name)
	}
	assert.Equal(t, []string{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}, names)

	// intermediate values carry their batched shapes
	var infos []string
	for _, vi := range fieldsNamed(t, g, 13) {
		name, _, dims := shapeOf(t, vi.bytes)
		if name == "fc1.flatten" {
			assert.Equal(t, []int64{-1, 784}, dims)
		}
		infos = append(infos, name)
	}
	assert.Equal(t, []string{"conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc1.flatten", "fc1", "relu3"}, infos)
}

// Names stay unique when the model's own names collide with the graph's
// fixed ones: an input called x and layers called image and logits (not
// the final one) get suffixes, the input is "image", the output "logits".
func TestExportNames(t *testing.T) {
	m := models[3]
	res := forward(t, m.path)
	ck, err := checkpoint.Read(trainCheckpoint(t, m))
	require.NoError(t, err)
	model, err := onnx.Export(res.Graph, onnx.FromCheckpoint(ck), onnx.Options{})
	require.NoError(t, err)
	var outs [][]string
	var ins [][]string
	for _, n := range model.Graph.Nodes {
		ins = append(ins, n.Inputs)
		outs = append(outs, n.Outputs)
	}
	assert.Equal(t, [][]string{{"image.1"}, {"logits.1"}, {"out.flatten"}, {"logits"}}, outs)
	assert.Equal(t, [][]string{{"image", "image.weight", "image.bias"}, {"image.1"}, {"logits.1"}, {"out.flatten", "out.weight", "out.bias"}}, ins)
	assert.Equal(t, "image", model.Graph.Inputs[0].Name)
	assert.Equal(t, "logits", model.Graph.Outputs[0].Name)
}

// An op without an ONNX mapping is an error at its layer's line; a graph
// after the fuse pass (uint8 image, fused blocks) is refused at the image
// input.
func TestExportErrorsArePositioned(t *testing.T) {
	m := models[0]
	res := forward(t, m.path)
	ck, err := checkpoint.Read(trainCheckpoint(t, m))
	require.NoError(t, err)
	for _, n := range res.Graph.Nodes {
		if n.Name == "relu2" {
			n.Op = ir.OpReLUGrad // no forward graph has it: stands for a future op without a mapping
		}
	}
	_, err = onnx.Export(res.Graph, onnx.FromCheckpoint(ck), onnx.Options{})
	var ds dsl.Diagnostics
	require.ErrorAs(t, err, &ds)
	require.Len(t, ds, 1)
	assert.Equal(t, "../../examples/mnist.cnn:8:13: relu2: relu_grad cannot be exported to ONNX (exportable: conv2d, relu, leaky_relu, sigmoid, tanh, gelu, silu, hardswish, maxpool2d, avgpool2d, global_avgpool, flatten, linear, dropout, add, concat, batchnorm2d, batchnorm1d)", ds[0].Error())
	for _, op := range []ir.Op{ir.OpConv2D, ir.OpReLU, ir.OpMaxPool2D, ir.OpAvgPool2D, ir.OpFlatten, ir.OpLinear, ir.OpDropout, ir.OpAdd} {
		assert.True(t, onnx.Exportable(op), "%s", op)
	}
	assert.False(t, onnx.Exportable(ir.OpCrossEntropy), "the loss is not part of the exported graph")

	src, err := os.ReadFile(m.path)
	require.NoError(t, err)
	fused, err := compiler.CompileSource(m.path, src, compiler.Options{})
	require.NoError(t, err)
	_, err = onnx.Export(fused.Graph, onnx.FromCheckpoint(ck), onnx.Options{})
	require.ErrorAs(t, err, &ds)
	assert.Contains(t, ds[0].Error(), "mnist.cnn:3:16: the image input image is u8[B,28,28,1], not f32 [C,H,W]: export takes the forward IR before the fuse pass")
}

// A checkpoint that lacks a parameter, has it with the wrong shape, or
// holds a non-finite value is an error naming the file and the tensor;
// optimizer state and parameters of layers the model does not compute are
// ignored.
func TestExportCheckpointErrors(t *testing.T) {
	m := models[2]
	res := forward(t, m.path)
	good, err := checkpoint.Read(trainCheckpoint(t, m))
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name string, edit func(ts []checkpoint.Tensor) []checkpoint.Tensor) *checkpoint.File {
		ts := edit(append([]checkpoint.Tensor(nil), good.Tensors...))
		path := filepath.Join(dir, name)
		require.NoError(t, checkpoint.Write(path, ts, nil))
		f, err := checkpoint.Read(path)
		require.NoError(t, err)
		return f
	}
	export := func(f *checkpoint.File) error {
		_, err := onnx.Export(res.Graph, onnx.FromCheckpoint(f), onnx.Options{})
		return err
	}
	without := write("without.safetensors", func(ts []checkpoint.Tensor) []checkpoint.Tensor {
		var out []checkpoint.Tensor
		for _, x := range ts {
			if x.Name != "hidden.weight" {
				out = append(out, x)
			}
		}
		return out
	})
	assert.EqualError(t, export(without), filepath.Join(dir, "without.safetensors")+`: no tensor "hidden.weight" (is this a checkpoint of another model?)`)
	reshaped := write("reshaped.safetensors", func(ts []checkpoint.Tensor) []checkpoint.Tensor {
		for i := range ts {
			if ts[i].Name == "stem.bias" {
				ts[i] = checkpoint.F32Tensor("stem.bias", []int64{2, 3}, ts[i].Float32s())
			}
		}
		return ts
	})
	assert.ErrorContains(t, export(reshaped), `tensor "stem.bias" has shape [2 3], the model needs [6]`)
	nan := write("nan.safetensors", func(ts []checkpoint.Tensor) []checkpoint.Tensor {
		for i := range ts {
			if ts[i].Name == "out.weight" {
				vals := ts[i].Float32s()
				vals[5] = float32(math.Inf(-1))
				ts[i] = checkpoint.F32Tensor(ts[i].Name, ts[i].Shape, vals)
			}
		}
		return ts
	})
	assert.EqualError(t, export(nan), filepath.Join(dir, "nan.safetensors")+`: tensor "out.weight" holds -Inf at element 5`)
	extra := write("extra.safetensors", func(ts []checkpoint.Tensor) []checkpoint.Tensor {
		return append(ts, checkpoint.F32Tensor("unused.weight", []int64{2}, []float32{1, 2}))
	})
	require.NoError(t, export(extra))
}

// Normalize needs one mean and one positive std per channel; the error
// points at the data block's setting.
func TestNormalizeErrors(t *testing.T) {
	res := forward(t, models[2].path)
	ck, err := checkpoint.Read(trainCheckpoint(t, models[2]))
	require.NoError(t, err)
	pos := dsl.Pos{File: "m.cnn", Line: 20, Col: 5}
	for _, tc := range []struct {
		norm onnx.Normalize
		want string
	}{
		{onnx.Normalize{Mean: []float64{0.5}, Std: []float64{0.5}, Pos: pos}, "m.cnn:20:5: normalize has 1 means and 1 standard deviations for 3 channels"},
		{onnx.Normalize{Mean: []float64{0, 0, 0}, Std: []float64{1, 0, 1}, Pos: pos}, "m.cnn:20:5: normalize: std[1] = 0 must be a positive float32"},
		{onnx.Normalize{Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1e-50}, Pos: pos}, "m.cnn:20:5: normalize: std[2] = 1e-50 must be a positive float32"},
	} {
		_, err := onnx.Export(res.Graph, onnx.FromCheckpoint(ck), onnx.Options{Preprocess: []onnx.Step{tc.norm}})
		var ds dsl.Diagnostics
		require.True(t, errors.As(err, &ds), "%v", err)
		assert.Equal(t, tc.want, ds[0].Error())
	}
}

// WriteFile replaces a model whole and leaves no temporary file behind.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o644))
	require.NoError(t, onnx.WriteFile(path, []byte("new model")))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "new model", string(got))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
	assert.Error(t, onnx.WriteFile(filepath.Join(dir, "missing", "m.onnx"), []byte("x")))
}
