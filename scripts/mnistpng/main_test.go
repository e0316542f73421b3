package main

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
)

// The PNGs hold the test digits' pixels exactly, as a trainer's predict
// reads them (data.LoadImage), under names that say their label.
func TestDigitsAreTheTestSet(t *testing.T) {
	src, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, writeDigits(src, dir, 3))
	ds, err := data.LoadMNIST(src, "t10k")
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		pix, err := data.LoadImage(filepath.Join(dir, fmt.Sprintf("%04d_is_%d.png", i, ds.Labels[i])), data.Shape{H: 28, W: 28, C: 1})
		require.NoError(t, err)
		assert.Equal(t, ds.Images.Image(i), pix)
	}
	assert.ErrorContains(t, writeDigits(src, dir, 10001), "the test set has 10000 digits")
}
