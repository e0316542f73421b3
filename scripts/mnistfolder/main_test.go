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

// The PNGs are the digits centred on 32x32, gray level v as (v, 255-v, v/2), under their
// label's class folder, as a trainer's ImageFolder reads them (data.LoadImage, RGB).
func TestFolderHoldsTheDigits(t *testing.T) {
	src, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, writeSplit(src, "t10k", dir, 3))
	ds, err := data.LoadMNIST(src, "t10k")
	require.NoError(t, err)
	for i := range 3 {
		pix, err := data.LoadImage(filepath.Join(dir, fmt.Sprintf("class%d", ds.Labels[i]), fmt.Sprintf("%05d.png", i)), data.Shape{H: 32, W: 32, C: 3})
		require.NoError(t, err)
		gray := ds.Images.Image(i)
		for y := range 32 {
			for x := range 32 {
				var v byte
				if y >= 2 && y < 30 && x >= 2 && x < 30 {
					v = gray[(y-2)*28+x-2]
				}
				at := (y*32 + x) * 3
				require.Equal(t, []byte{v, 255 - v, v / 2}, pix[at:at+3], "digit %d at (%d, %d)", i, y, x)
			}
		}
	}
	assert.ErrorContains(t, writeSplit(src, "t10k", dir, 10001), "t10k has 10000 digits, not 10001")
}
