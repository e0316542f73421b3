package trainergen_test

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// writeDigitFolder saves real MNIST digits as 28x28 grayscale PNGs in
// torchvision's ImageFolder layout: root/<digit>/<n>.png.
func writeDigitFolder(t *testing.T, perClass int) string {
	t.Helper()
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	ds, err := data.LoadMNIST(dir, "train")
	require.NoError(t, err)
	root := t.TempDir()
	count := map[uint8]int{}
	for i := 0; i < ds.Len() && len(count) < 10 || func() bool {
		for _, n := range count {
			if n < perClass {
				return true
			}
		}
		return false
	}(); i++ {
		l := ds.Labels[i]
		if count[l] >= perClass {
			continue
		}
		img := &image.Gray{Pix: append([]uint8(nil), ds.Images.Image(i)...), Stride: 28, Rect: image.Rect(0, 0, 28, 28)}
		cls := filepath.Join(root, fmt.Sprintf("digit%d", l))
		require.NoError(t, os.MkdirAll(cls, 0o755))
		f, err := os.Create(filepath.Join(cls, fmt.Sprintf("%05d.png", i)))
		require.NoError(t, err)
		require.NoError(t, png.Encode(f, img))
		require.NoError(t, f.Close())
		count[l]++
	}
	return root
}

// examples/simplecnn.cnn trains on the CPU on an ImageFolder of PNGs: the
// loader resizes the 28x28 grayscale digits to 128x128 RGB, and the loss
// falls.
func TestSimpleCNNTrainsOnAnImageFolder(t *testing.T) {
	if testing.Short() {
		t.Skip("trains SimpleCNN at 128x128")
	}
	const batch = 8
	root := writeDigitFolder(t, 4)
	c := compileTrainerExample(t, "../../examples/simplecnn.cnn", batch)
	ds, err := data.OpenImageFolder(root, data.ImageFolderOptions{Shape: data.Shape{H: 128, W: 128, C: 3}, CacheDir: t.TempDir()})
	require.NoError(t, err)
	defer ds.Close()
	require.Equal(t, 40, ds.Len())
	require.Equal(t, 10, ds.NumClasses())
	loader, err := data.NewLoader(ds, data.LoaderOptions{BatchSize: batch, Seed: 1})
	require.NoError(t, err)
	sess := newSession(t, c, 1)
	var losses []float32
	for epoch := 0; epoch < 3; epoch++ {
		for b, err := range loader.Epoch(context.Background(), epoch, 0) {
			require.NoError(t, err)
			loss, _, err := sess.TrainStep(trainer.Batch{Pixels: b.Pixels, Labels: b.Labels, Valid: b.Size()})
			require.NoError(t, err)
			losses = append(losses, loss)
		}
	}
	t.Logf("losses %.3f", losses)
	mean := func(xs []float32) float32 {
		var s float32
		for _, x := range xs {
			s += x
		}
		return s / float32(len(xs))
	}
	assert.Less(t, mean(losses[len(losses)-5:]), mean(losses[:5]), "the loss falls")
}
