package data

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func decodeFile(t *testing.T, path string, channels int) []uint8 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	pix, _, _, err := decodeImage(b, channels)
	require.NoError(t, err, path)
	return pix
}

// TestDecodeMatchesPillow compares decoding and convert("RGB") with what
// Pillow 9.4 (libjpeg-turbo 2.1, libwebp 1.2) made of the same files. We
// reproduce libjpeg's and libwebp's chroma upsampling and colour
// conversion, so everything but JPEG is exact; JPEG keeps the small
// difference between Go's IDCT and libjpeg-turbo's.
func TestDecodeMatchesPillow(t *testing.T) {
	for _, tc := range []struct {
		file   string
		approx bool
	}{
		{"rgb16.png", false}, // 16-bit RGB keeps the high byte, as Pillow does
		{"lossless.webp", false},
		{"lossy.webp", false},
		{"lossy_even.webp", false},
		{"ycc.jpg", true}, // 4:2:0
		{"ycc422.jpg", true},
		{"ycc444.jpg", true},
		{"ycc_even.jpg", true},
		{"cmyk.jpg", true},
	} {
		got := decodeFile(t, "testdata/pil/"+tc.file, 3)
		want, _, _, _ := readPNG(t, "testdata/pil/decoded_"+strings.ReplaceAll(tc.file, ".", "_")+".png")
		require.Len(t, got, len(want), tc.file)
		mean, mx := pixelDiff(got, want)
		t.Logf("%-15s vs Pillow: mean |diff| %.3f, max %d", tc.file, mean, mx)
		if tc.approx {
			assert.Less(t, mean, 0.1, tc.file)
			assert.LessOrEqual(t, mx, 4, tc.file)
		} else {
			assert.Equal(t, 0, mx, tc.file)
		}
	}
	// convert("L") is exact too.
	got := decodeFile(t, "testdata/pil/src.png", 1)
	want, _, _, c := readPNG(t, "testdata/pil/l.png")
	require.Equal(t, 1, c)
	assert.Equal(t, want, got)
}

func TestGrayIsPillowsConvertL(t *testing.T) {
	assert.Equal(t, uint8(124), grayFromRGB(10, 200, 30)) // Pillow: 124 (299/587/114 truncated: 123)
	assert.Equal(t, uint8(255), grayFromRGB(255, 255, 255))
	assert.Equal(t, uint8(76), grayFromRGB(255, 0, 0))
	for v := range 256 {
		assert.Equal(t, uint8(v), grayFromRGB(uint8(v), uint8(v), uint8(v)))
	}
}

func TestConvertEveryPixelLayout(t *testing.T) {
	d, _ := digit(t, 3)
	rgbOf := func(img image.Image) []uint8 { p, _, _ := convertChannels(img, 3, ""); return p }
	grayOf := func(img image.Image) []uint8 { p, _, _ := convertChannels(img, 1, ""); return p }
	replicated := make([]uint8, 0, 3*len(d.Pix))
	for _, v := range d.Pix {
		replicated = append(replicated, v, v, v)
	}
	assert.Equal(t, d.Pix, grayOf(d))
	assert.Equal(t, replicated, rgbOf(d))
	assert.Equal(t, d.Pix, grayOf(gray16(d)), "16-bit gray: the high byte")

	// RGBA: alpha dropped, colour kept, even under transparent pixels.
	tint := tinted(d, 255, 128, 0)
	rgb := rgbOf(tint)
	for i := range d.Pix {
		assert.Equal(t, tint.Pix[4*i:4*i+3], rgb[3*i:3*i+3])
	}
	// Paletted: the palette's colour.
	pal := paletted(d)
	rgb = rgbOf(pal)
	for i, v := range d.Pix {
		c := pal.Palette[v].(color.RGBA)
		require.Equal(t, []uint8{c.R, c.G, c.B}, rgb[3*i:3*i+3])
	}
	assert.Equal(t, grayOf(pal)[100], grayFromRGB(rgb[300], rgb[301], rgb[302]))

	// Premultiplied RGBA, 8 and 16 bit: un-premultiplied.
	pre := image.NewRGBA(image.Rect(0, 0, 2, 1))
	pre.SetRGBA(0, 0, color.RGBA{100, 50, 0, 200})
	pre.SetRGBA(1, 0, color.RGBA{0, 0, 0, 0})
	assert.Equal(t, []uint8{127, 63, 0, 0, 0, 0}, rgbOf(pre))
	pre64 := image.NewRGBA64(image.Rect(0, 0, 1, 1))
	pre64.SetRGBA64(0, 0, color.RGBA64{0x8000, 0x4000, 0, 0x8000})
	assert.Equal(t, []uint8{255, 127, 0}, rgbOf(pre64))
	n64 := image.NewNRGBA64(image.Rect(0, 0, 1, 1))
	n64.SetNRGBA64(0, 0, color.NRGBA64{0x1234, 0xabcd, 0xff00, 0})
	assert.Equal(t, []uint8{0x12, 0xab, 0xff}, rgbOf(n64))

	// CMYK as Pillow converts it.
	cmyk := image.NewCMYK(image.Rect(0, 0, 3, 1))
	cmyk.SetCMYK(0, 0, color.CMYK{0, 0, 0, 0})
	cmyk.SetCMYK(1, 0, color.CMYK{255, 0, 0, 0})
	cmyk.SetCMYK(2, 0, color.CMYK{100, 50, 25, 128})
	assert.Equal(t, []uint8{255, 255, 255, 0, 255, 255, 77, 102, 115}, rgbOf(cmyk))

	// YCbCr 4:2:0 and a sub-image (non-zero bounds) via the generic path.
	ycc := image.NewYCbCr(image.Rect(0, 0, 4, 4), image.YCbCrSubsampleRatio420)
	for i := range ycc.Y {
		ycc.Y[i] = uint8(i * 16)
	}
	for i := range ycc.Cb {
		ycc.Cb[i], ycc.Cr[i] = 128, 128
	}
	assert.Equal(t, ycc.Y, grayOf(ycc))
	sub := d.SubImage(image.Rect(10, 10, 12, 11))
	assert.Equal(t, []uint8{d.Pix[10*28+10], d.Pix[10*28+11]}, grayOf(sub))
	assert.Equal(t, d.Pix[10*28+10], grayOf(&genericImage{sub})[0])
}

// genericImage hides the concrete type so the generic path runs.
type genericImage struct{ image.Image }

func TestDecodeErrors(t *testing.T) {
	_, _, _, err := decodeImage([]byte("hello, not an image"), 3)
	assert.EqualError(t, err, "not a JPEG, PNG, GIF, BMP, WebP or TIFF image")

	var b bytes.Buffer
	d, _ := digit(t, 1)
	require.NoError(t, png.Encode(&b, d))
	_, _, _, err = decodeImage(b.Bytes()[:b.Len()/2], 3)
	assert.ErrorContains(t, err, "corrupt image: png")
}
