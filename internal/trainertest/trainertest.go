// Package trainertest gives the trainer's tests a small model on the CPU
// emulator and data for it, without a dataset on disk.
//
// In:  tiny.cnn (6x6 grayscale images, 3 classes, 239 parameters), or
// another model's source.
// Out: its trainer.Spec and backends (compiled once per test binary; the
// emulator caches the kernels across runs), in-memory datasets whose
// classes a model can learn, and ImageFolder trees of them on disk.
//
// Why here: runtime/trainer and runtime/trainer/cli are tested in their
// own packages against a real compiled model, and the model must come
// from the compiler (codegen/trainergen), which runtime/ must not import.
package trainertest

import (
	_ "embed"
	"fmt"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"image"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// TinySource is tiny.cnn.
//
//go:embed tiny.cnn
var TinySource []byte

// Model is a compiled model: its spec and the backends that run it.
type Model struct {
	Spec     *trainer.Spec
	Kernels  []byte
	Backends trainer.Backends
}

var (
	mu       sync.Mutex
	compiled = map[string]*Model{}
)

// Tiny is tiny.cnn compiled (once per test binary).
func Tiny(t testing.TB) *Model { return Compile(t, "tiny.cnn", TinySource) }

// TinyAdamDropout is tiny.cnn with dropout, trained with Adam: every step
// changes kernel arguments (Adam's step number, dropout's seed and step),
// which the Session's graph tests rely on.
func TinyAdamDropout(t testing.TB) *Model {
	src := strings.Replace(string(TinySource), "fc1   = linear(flatten(relu1), out=3)", "drop1 = dropout(relu1, p=0.25)\n    fc1   = linear(flatten(drop1), out=3)", 1)
	src = strings.Replace(src, "sgd(lr=0.05, momentum=0.9)", "adam(lr=0.01, weight_decay=0.01)", 1)
	src = strings.Replace(src, "model Tiny(", "model TinyAD(", 1)
	return Compile(t, "tiny_adam_dropout.cnn", []byte(src))
}

// Compile compiles a model's source (once per name and source) with the
// CPU backend.
func Compile(t testing.TB, name string, src []byte) *Model {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	key := name + "\x00" + string(src)
	if m, ok := compiled[key]; ok {
		return m
	}
	res, err := compiler.CompileSource(name, src, compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	m := &Model{Spec: c.Spec, Kernels: c.Kernels}
	m.Backends = trainer.Backends{"cpu": func(*trainer.Spec) (device.Device, error) {
		return cpu.New(m.Kernels, "kernels.cu", cpu.Options{})
	}}
	compiled[key] = m
	return m
}

// Session opens a session of m on the CPU emulator, closed with the test.
func (m *Model) Session(t testing.TB, seed uint64) *trainer.Session {
	t.Helper()
	dev, err := m.Backends["cpu"](m.Spec)
	require.NoError(t, err)
	s, err := trainer.NewSession(m.Spec, dev, seed)
	require.NoError(t, err)
	t.Cleanup(func() {
		s.Close()
		dev.Close()
	})
	return s
}

// Memory is an in-memory dataset.
type Memory struct {
	Images  [][]uint8
	Labels  []int32
	Size    data.Shape
	Classes int
}

var _ data.Dataset = (*Memory)(nil)

func (m *Memory) Len() int          { return len(m.Images) }
func (m *Memory) Shape() data.Shape { return m.Size }
func (m *Memory) NumClasses() int   { return m.Classes }
func (m *Memory) Label(i int) int32 { return m.Labels[i] }
func (m *Memory) Close() error      { return nil }
func (m *Memory) ReadImage(i int, dst []uint8) error {
	if len(dst) != m.Size.Size() {
		return fmt.Errorf("image %d: %d bytes, want %d", i, len(dst), m.Size.Size())
	}
	copy(dst, m.Images[i])
	return nil
}

// Data makes n images of spec's shape whose class is learnable: class c
// lights the rows c, c+classes, ... brighter, over uniform noise.
func Data(spec *trainer.Spec, n int, seed uint64) *Memory {
	rng := rand.New(rand.NewPCG(seed, 11))
	m := &Memory{Size: data.Shape{H: spec.H, W: spec.W, C: spec.C}, Classes: spec.Classes}
	for i := 0; i < n; i++ {
		c := i % spec.Classes
		img := make([]uint8, m.Size.Size())
		for y := 0; y < spec.H; y++ {
			for x := 0; x < spec.W*spec.C; x++ {
				v := rng.IntN(96)
				if y%spec.Classes == c {
					v += 150
				}
				img[y*spec.W*spec.C+x] = uint8(v)
			}
		}
		m.Images = append(m.Images, img)
		m.Labels = append(m.Labels, int32(c))
	}
	return m
}

// WriteImageFolder saves a grayscale dataset as PNGs in torchvision's
// ImageFolder layout under root: root/class<c>/<i>.png.
func WriteImageFolder(t testing.TB, root string, ds *Memory) {
	t.Helper()
	require.Equal(t, 1, ds.Size.C, "grayscale only")
	for i, px := range ds.Images {
		dir := filepath.Join(root, fmt.Sprintf("class%d", ds.Labels[i]))
		require.NoError(t, os.MkdirAll(dir, 0o755))
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%04d.png", i)))
		require.NoError(t, err)
		img := &image.Gray{Pix: px, Stride: ds.Size.W, Rect: image.Rect(0, 0, ds.Size.W, ds.Size.H)}
		require.NoError(t, png.Encode(f, img))
		require.NoError(t, f.Close())
	}
}

// RandomBatch is a batch of n samples for sp's model: uniform random
// pixels, then uniform random labels, drawn from rng in that order.
func RandomBatch(sp *trainer.Spec, n int, rng *rand.Rand) trainer.Batch {
	b := trainer.Batch{Valid: n, Pixels: make([]uint8, n*sp.H*sp.W*sp.C), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(sp.Classes))
	}
	return b
}
