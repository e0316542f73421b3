package data

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// LoadImage gives a file's pixels exactly as an ImageFolder's sample of
// it: every format and mode writeImage makes, resized up and down, in
// grayscale and RGB.
func TestLoadImageIsTheFolderSample(t *testing.T) {
	root := t.TempDir()
	g, _ := digit(t, 3)
	writeImage(t, filepath.Join(root, "a", "gray.png"), g)
	writeImage(t, filepath.Join(root, "a", "big.jpg"), tinted(scaled(g, 61, 47), 200, 90, 30))
	writeImage(t, filepath.Join(root, "b", "palette.gif"), paletted(g))
	writeImage(t, filepath.Join(root, "b", "deep.png"), gray16(g))
	writeImage(t, filepath.Join(root, "b", "small.bmp"), scaled(g, 9, 13))
	for _, shape := range []Shape{{H: 28, W: 28, C: 1}, {H: 20, W: 33, C: 3}} {
		ds, err := OpenImageFolder(root, ImageFolderOptions{Shape: shape, NoCache: true})
		require.NoError(t, err)
		require.Equal(t, 5, ds.Len())
		want := make([]uint8, shape.Size())
		for i := range ds.Len() {
			require.NoError(t, ds.ReadImage(i, want))
			got, err := LoadImage(ds.Path(i), shape)
			require.NoError(t, err)
			assert.Equal(t, want, got, "%s at %v", ds.Path(i), shape)
		}
		require.NoError(t, ds.Close())
	}
	assert.True(t, IsImageFile("x/Y.JPEG"))
	assert.False(t, IsImageFile("notes.txt"))
}

// A file that is not an image, missing, a folder or unsupported is a
// *FileError naming it.
func TestLoadImageErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "note.png")
	require.NoError(t, os.WriteFile(text, []byte("not an image"), 0o644))
	ppm := filepath.Join(dir, "x.ppm")
	require.NoError(t, os.WriteFile(ppm, []byte("P6\n1 1\n255\n\x00\x00\x00"), 0o644))
	shape := Shape{H: 4, W: 4, C: 1}
	for path, want := range map[string]string{
		text:                              text + ": ",
		filepath.Join(dir, "missing.png"): filepath.Join(dir, "missing.png") + ": no such file",
		dir:                               dir + ": ",
		ppm:                               ppm + ": PPM/PGM images are not supported",
	} {
		_, err := LoadImage(path, shape)
		var fe *FileError
		require.True(t, errors.As(err, &fe), "%s: %v", path, err)
		assert.Equal(t, path, fe.Path)
		assert.Contains(t, err.Error(), want)
	}
}
