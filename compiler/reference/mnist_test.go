package reference

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
)

// 20 SGD steps of examples/mnist.cnn on real MNIST digits: the loss falls.
func TestMNISTTwentyStepsLossFalls(t *testing.T) {
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	train, err := data.LoadMNIST(dir, "train")
	require.NoError(t, err)
	require.Equal(t, 60000, train.Images.N)

	src, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("examples/mnist.cnn", src, compiler.Options{
		Disable:   []string{"fuse"},
		AfterPass: func(pass string, g *ir.Graph) error { return g.Verify() },
	})
	require.NoError(t, err)
	e := New(res.Graph, res.Train.Seed)

	const batch, steps = 32, 20
	batchAt := func(step int) Batch {
		b := Batch{N: batch, Images: make([]float64, 0, batch*784), Labels: make([]int32, batch)}
		for i := 0; i < batch; i++ {
			k := (step*batch + i) % train.Images.N
			for _, px := range train.Images.Image(k) {
				b.Images = append(b.Images, float64(px)/255) // ToTensor
			}
			b.Labels[i] = int32(train.Labels[k])
		}
		return b
	}
	var losses []float64
	for s := 0; s < steps; s++ {
		r, err := e.Run(batchAt(s), Train)
		require.NoError(t, err)
		losses = append(losses, r.Loss)
	}
	t.Logf("losses: %.3f", losses)
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	first, last := mean(losses[:5]), mean(losses[steps-5:])
	// PyTorch's default init starts a ReLU CNN slowly (small logits), so 20
	// steps move the loss by a few percent, as in PyTorch's own MNIST example.
	assert.InDelta(t, 2.30, losses[0], 0.05, "an untrained 10-class model starts near ln(10)")
	assert.Less(t, last, first-0.04, "loss must fall over 20 steps")
	assert.Less(t, losses[steps-1], losses[0])

	// and the model beats chance on digits it has not seen
	test, err := data.LoadMNIST(dir, "t10k")
	require.NoError(t, err)
	b := Batch{N: 500, Labels: make([]int32, 500)}
	for i := 0; i < 500; i++ {
		for _, px := range test.Images.Image(i) {
			b.Images = append(b.Images, float64(px)/255)
		}
		b.Labels[i] = int32(test.Labels[i])
	}
	r, err := e.Run(b, Eval)
	require.NoError(t, err)
	t.Logf("test accuracy after %d steps: %d/500", steps, r.Correct)
	assert.Greater(t, r.Correct, 100, "twice chance")
}
