package onnx_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/export/onnx"
	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// model is a test model: its source and how its checkpoint is made.
type model struct {
	name, path  string
	trainBatch  int   // samples per reference training step
	steps       int   // reference training steps before the checkpoint
	evalBatches []int // batch sizes run through the exported model
}

var models = []model{
	{name: "mnist", path: "../../examples/mnist.cnn", trainBatch: 16, steps: 5, evalBatches: []int{8, 3}},
	{name: "simplecnn", path: "../../examples/simplecnn.cnn", trainBatch: 4, steps: 2, evalBatches: []int{4, 2}},
	{name: "allops", path: "testdata/allops.cnn", trainBatch: 8, steps: 10, evalBatches: []int{8, 3}},
	{name: "names", path: "testdata/names.cnn", trainBatch: 8, steps: 5, evalBatches: []int{8}},
	{name: "newops", path: "testdata/newops.cnn", trainBatch: 8, steps: 10, evalBatches: []int{8, 3}},
}

// forward compiles a model to the forward IR the exporter reads,
// verifying the IR after each pass.
func forward(t *testing.T, path string) *compiler.Result {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	return forwardSource(t, path, src)
}

func forwardSource(t *testing.T, name string, src []byte) *compiler.Result {
	t.Helper()
	res, err := compiler.CompileSource(name, src, compiler.Options{
		StopAfter: "dce",
		AfterPass: func(pass string, g *ir.Graph) error { return g.Verify() },
	})
	require.NoError(t, err)
	return res
}

// dataset makes n labelled images, [C,H,W] uint8 per sample: a random
// template per class plus noise, so that a few training steps move the
// parameters towards something and the logits spread.
func dataset(rng *rand.Rand, n int, chw []int64, classes int64) ([]uint8, []int32) {
	per := int(chw[0] * chw[1] * chw[2])
	seed := rand.New(rand.NewPCG(12345, 6789)) // templates: the same for every call
	templates := make([][]uint8, classes)
	for c := range templates {
		templates[c] = make([]uint8, per)
		for i := range templates[c] {
			templates[c][i] = uint8(seed.IntN(256))
		}
	}
	px := make([]uint8, n*per)
	labels := make([]int32, n)
	for s := 0; s < n; s++ {
		c := rng.Int64N(classes)
		labels[s] = int32(c)
		for i := 0; i < per; i++ {
			v := float64(templates[c][i]) + 40*rng.NormFloat64()
			px[s*per+i] = uint8(math.Max(0, math.Min(255, math.Round(v))))
		}
	}
	return px, labels
}

// toTensor is torchvision's ToTensor of CHW uint8 pixels: float32 x/255.
func toTensor(px []uint8) []float32 {
	x := make([]float32, len(px))
	for i, p := range px {
		x[i] = float32(p) / 255
	}
	return x
}

func float64s(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// checkpoints holds the checkpoint made for each test model, shared by the
// tests (making SimpleCNN's takes seconds), in a directory TestMain removes.
var checkpoints = struct {
	dir   string
	paths map[string]string
}{paths: map[string]string{}}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cnnc-onnx-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	checkpoints.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// trainCheckpoint trains m for a few steps with the float64 reference (its
// own unfused training graph) and writes a checkpoint as a trainer does:
// parameters under their state_dict names, optimizer state under
// "optimizer.<state>", the step in the metadata. Made once per model.
func trainCheckpoint(t *testing.T, m model) string {
	t.Helper()
	if p, ok := checkpoints.paths[m.name]; ok {
		return p
	}
	src, err := os.ReadFile(m.path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(m.path, src, compiler.Options{Disable: []string{"fuse"}, Batch: int64(m.trainBatch)})
	require.NoError(t, err)
	g := res.Graph
	e := reference.New(g, 7)
	rng := rand.New(rand.NewPCG(1, 2))
	for range m.steps {
		px, labels := dataset(rng, m.trainBatch, g.Inputs[0].Type.Dims, g.Logits.Type.Dims[0])
		_, err := e.Run(reference.Batch{N: m.trainBatch, Images: float64s(toTensor(px)), Labels: labels}, reference.Train)
		require.NoError(t, err)
	}
	var ts []checkpoint.Tensor
	for _, p := range g.Params {
		ts = append(ts, checkpoint.F32Tensor(p.Name, p.Value.Type.Dims, float32s(e.Params[p])))
	}
	for _, p := range g.Buffers { // batch norm's running statistics; its count is an int64
		if p.Value.Type.DType == ir.I64 {
			b := make([]byte, 8)
			binary.LittleEndian.PutUint64(b, uint64(int64(e.Params[p][0])))
			ts = append(ts, checkpoint.Tensor{Name: p.Name, DType: checkpoint.I64, Shape: []int64{}, Data: b})
			continue
		}
		ts = append(ts, checkpoint.F32Tensor(p.Name, p.Value.Type.Dims, float32s(e.Params[p])))
	}
	for _, s := range g.State {
		ts = append(ts, checkpoint.F32Tensor("optimizer."+s.Name, s.Type.Dims, float32s(e.State[s])))
	}
	path := filepath.Join(checkpoints.dir, m.name+".safetensors")
	require.NoError(t, checkpoint.Write(path, ts, map[string]string{"step": strconv.Itoa(m.steps), "model": g.Name}))
	checkpoints.paths[m.name] = path
	return path
}

func float32s(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

// exportFile exports res with the checkpoint's parameters to dir/NAME.onnx.
func exportFile(t *testing.T, res *compiler.Result, ckPath, dir, name string, opts onnx.Options) (string, *onnx.Model) {
	t.Helper()
	ck, err := checkpoint.Read(ckPath)
	require.NoError(t, err)
	m, err := onnx.Export(res.Graph, onnx.FromCheckpoint(ck), opts)
	require.NoError(t, err)
	path := filepath.Join(dir, name+".onnx")
	require.NoError(t, onnx.WriteFile(path, m.Marshal()))
	return path, m
}

// evaluation is the float64 reference's evaluation (dropout off) of a
// batch: every value of the forward pass.
type evaluation struct {
	g      *ir.Graph
	n      int
	values map[*ir.Value][]float64
}

func (ev *evaluation) logits() []float64 { return ev.values[ev.g.Logits] }

// referenceEval evaluates the n images x with the checkpoint's parameters.
func referenceEval(t *testing.T, g *ir.Graph, ckPath string, x []float64, n int) *evaluation {
	t.Helper()
	ck, err := checkpoint.Read(ckPath)
	require.NoError(t, err)
	e := reference.New(g, 0)
	for _, p := range append(append([]*ir.Param{}, g.Params...), g.Buffers...) {
		if p.Value.Type.DType == ir.I64 {
			continue // a count evaluation does not read
		}
		ct, err := ck.Expect(p.Name, checkpoint.F32, p.Value.Type.Dims)
		require.NoError(t, err)
		e.Params[p] = float64s(ct.Float32s())
	}
	r, err := e.Run(reference.Batch{N: n, Images: x, Labels: make([]int32, n)}, reference.Eval)
	require.NoError(t, err)
	return &evaluation{g: g, n: n, values: r.Values}
}

// f32File writes float32s little-endian.
func f32File(t *testing.T, path string, x []float32) {
	t.Helper()
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

func readF32File(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Zero(t, len(b)%4, "%s: %d bytes", path, len(b))
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}
