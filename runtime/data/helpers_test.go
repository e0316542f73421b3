package data

import (
	"bytes"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/image/bmp"

	"github.com/cnnc/cnnc/internal/datasets"
)

var (
	mnistOnce  sync.Once
	mnistTest  *MNIST
	mnistError error
)

// testMNIST is MNIST's t10k split from the GoMNIST module.
func testMNIST(t testing.TB) *MNIST {
	mnistOnce.Do(func() {
		dir, err := datasets.MNISTDir()
		if err != nil {
			mnistError = err
			return
		}
		mnistTest, mnistError = LoadMNIST(dir, "t10k")
	})
	require.NoError(t, mnistError)
	return mnistTest
}

// digit returns the first t10k digit with the given label (28x28 gray) and
// its index.
func digit(t testing.TB, label uint8) (*image.Gray, int) {
	m := testMNIST(t)
	for i, l := range m.Labels {
		if l == label {
			return &image.Gray{Pix: append([]uint8(nil), m.Images.Image(i)...), Stride: 28, Rect: image.Rect(0, 0, 28, 28)}, i
		}
	}
	t.Fatalf("no digit %d", label)
	return nil, 0
}

// scaled enlarges a gray digit to w x h by nearest neighbour: an image of a
// different size with the same content.
func scaled(g *image.Gray, w, h int) *image.Gray {
	out := image.NewGray(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			out.Pix[y*w+x] = g.Pix[(y*28/h)*28+x*28/w]
		}
	}
	return out
}

// tinted colours a gray digit: ink in (r,g,b), paper black, alpha varying
// by column (so that dropping alpha, not compositing, can be checked).
func tinted(g *image.Gray, r, gr, b uint8) *image.NRGBA {
	bnd := g.Bounds()
	out := image.NewNRGBA(bnd)
	for y := bnd.Min.Y; y < bnd.Max.Y; y++ {
		for x := bnd.Min.X; x < bnd.Max.X; x++ {
			v := uint16(g.GrayAt(x, y).Y)
			out.SetNRGBA(x, y, color.NRGBA{uint8(uint16(r) * v / 255), uint8(uint16(gr) * v / 255), uint8(uint16(b) * v / 255), uint8(255 - 8*x%256)})
		}
	}
	return out
}

func gray16(g *image.Gray) *image.Gray16 {
	out := image.NewGray16(g.Bounds())
	for i, v := range g.Pix {
		// the high byte is the digit; the low byte must be dropped
		out.Pix[2*i], out.Pix[2*i+1] = v, uint8(i*37)
	}
	return out
}

func paletted(g *image.Gray) *image.Paletted {
	pal := make(color.Palette, 256)
	for i := range pal {
		pal[i] = color.RGBA{uint8(i), uint8(255 - i), uint8(i / 2), 255}
	}
	out := image.NewPaletted(g.Bounds(), pal)
	copy(out.Pix, g.Pix)
	return out
}

// writeImage encodes img by the file's extension (".png", ".jpg", ".gif",
// ".bmp").
func writeImage(t testing.TB, path string, img image.Image) {
	t.Helper()
	var b bytes.Buffer
	var err error
	switch strings.ToLower(filepath.Ext(path)) {
	case ".png":
		err = png.Encode(&b, img)
	case ".jpg", ".jpeg":
		err = jpeg.Encode(&b, img, &jpeg.Options{Quality: 95})
	case ".gif":
		err = gif.Encode(&b, img, nil)
	case ".bmp":
		err = bmp.Encode(&b, img)
	default:
		t.Fatalf("no encoder for %s", path)
	}
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
}

// readPNG decodes a PNG into HWC pixels with its channel count (1 or 3).
func readPNG(t testing.TB, path string) (pix []uint8, w, h, c int) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	img, err := png.Decode(bytes.NewReader(b))
	require.NoError(t, err)
	c = 3
	if _, ok := img.(*image.Gray); ok {
		c = 1
	}
	pix, w, h = convertChannels(img, c, "")
	return pix, w, h, c
}

// pixelDiff is the mean and maximum absolute difference of two images.
func pixelDiff(a, b []uint8) (mean float64, maxDiff int) {
	sum := 0
	for i := range a {
		d := int(a[i]) - int(b[i])
		if d < 0 {
			d = -d
		}
		sum += d
		maxDiff = max(maxDiff, d)
	}
	return float64(sum) / float64(len(a)), maxDiff
}

func crc32Castagnoli(b []byte) uint32 { return crc32.Checksum(b, crc32c) }

func mnistDir(t testing.TB) string {
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	return dir
}

// notBlocking runs fn and fails the test if it has not returned within 10
// seconds (reading a FIFO without a writer, or /dev/zero, would not).
func notBlocking(t testing.TB, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("blocked for 10 s")
		return nil
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// testCacheDir stands for os.UserCacheDir in this package's tests, so
// that they never write into the real one.
var testCacheDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cnnc-data-test-cache-")
	if err != nil {
		panic(err)
	}
	testCacheDir = dir
	userCacheDir = func() (string, error) { return testCacheDir, nil }
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cacheFileOf is where the cache of root's images of shape is kept.
func cacheFileOf(t testing.TB, root string, shape Shape) string {
	t.Helper()
	resolved, err := filepath.EvalSymlinks(root)
	require.NoError(t, err)
	abs, err := filepath.Abs(resolved)
	require.NoError(t, err)
	return filepath.Join(testCacheDir, "cnnc", "imagefolder", cacheName(abs, shape))
}

// assertOnlyImagesIn checks that a test folder holds only what the test
// wrote: no cache or temporary file of ours.
func assertOnlyImagesIn(t testing.TB, root string) {
	t.Helper()
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		assert.False(t, strings.Contains(d.Name(), "cnnc"), "%s in the data folder", p)
		return nil
	})
}
