package data

import (
	"fmt"
	"image"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// referenceResize is an independent float64 implementation of Pillow's
// BILINEAR resize: every input pixel whose centre lies within the
// (scale-widened, when shrinking) triangle's support contributes with the
// normalised triangle weight; horizontal pass, then vertical. With
// roundBetween the horizontal pass is rounded to uint8, as Pillow stores
// it; without, it is the ideal separable filter.
func referenceResize(src []uint8, w, h, c, outW, outH int, roundBetween bool) []uint8 {
	weights := func(in, out int) [][]float64 {
		scale := float64(in) / float64(out)
		fs := math.Max(scale, 1)
		ws := make([][]float64, out)
		for o := range ws {
			center := (float64(o) + 0.5) * scale
			ws[o] = make([]float64, in)
			sum := 0.0
			for x := range in {
				d := math.Abs(float64(x)+0.5-center) / fs
				if d < 1 {
					ws[o][x] = 1 - d
					sum += 1 - d
				}
			}
			for x := range in {
				ws[o][x] /= sum
			}
		}
		return ws
	}
	round := func(v float64) float64 { return math.Min(255, math.Max(0, math.Floor(v+0.5))) }
	tmp := make([]float64, h*outW*c)
	if outW == w {
		for i, v := range src {
			tmp[i] = float64(v)
		}
	} else {
		wx := weights(w, outW)
		for y := range h {
			for o := range outW {
				for ch := range c {
					s := 0.0
					for x, wt := range wx[o] {
						s += wt * float64(src[(y*w+x)*c+ch])
					}
					if roundBetween {
						s = round(s)
					}
					tmp[(y*outW+o)*c+ch] = s
				}
			}
		}
	}
	out := make([]uint8, outH*outW*c)
	if outH == h {
		for i, v := range tmp {
			out[i] = uint8(round(v))
		}
		return out
	}
	wy := weights(h, outH)
	for o := range outH {
		for i := range outW * c {
			s := 0.0
			for y, wt := range wy[o] {
				s += wt * tmp[y*outW*c+i]
			}
			out[o*outW*c+i] = uint8(round(s))
		}
	}
	return out
}

// resizeCases are shrinking, enlarging and mixed resizes, grayscale and RGB.
var resizeCases = []struct{ w, h, c, outW, outH int }{
	{28, 28, 1, 128, 128}, {128, 128, 3, 28, 28}, {97, 61, 3, 28, 20}, {40, 30, 1, 64, 16},
	{300, 200, 3, 128, 128}, {17, 123, 1, 128, 9}, {64, 64, 3, 64, 32}, {5, 7, 3, 3, 11},
	{256, 256, 1, 7, 5}, {33, 33, 3, 32, 34},
}

// TestResizeAgainstFloatReference measures the fixed-point resize against
// the float64 one: exactly Pillow's rounding (uint8 between the passes)
// and the ideal filter.
func TestResizeAgainstFloatReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	type stats struct {
		sum, n float64
		max    int
	}
	var samePipeline, ideal stats
	for _, tc := range resizeCases {
		for _, kind := range []string{"noise", "smooth", "digit"} {
			src := make([]uint8, tc.w*tc.h*tc.c)
			switch kind {
			case "noise":
				for i := range src {
					src[i] = uint8(rng.IntN(256))
				}
			case "smooth":
				for y := range tc.h {
					for x := range tc.w {
						for ch := range tc.c {
							src[(y*tc.w+x)*tc.c+ch] = uint8(127.5 + 127.5*math.Sin(float64(x)*0.3+float64(y)*0.17+float64(ch)))
						}
					}
				}
			case "digit":
				d, _ := digit(t, uint8(tc.w%10))
				s := scaled(d, tc.w, tc.h)
				for i, v := range s.Pix {
					for ch := range tc.c {
						src[i*tc.c+ch] = v
					}
				}
			}
			got := resizeBilinear(src, tc.w, tc.h, tc.c, tc.outW, tc.outH)
			require.Len(t, got, tc.outW*tc.outH*tc.c)
			for _, ref := range []struct {
				s            *stats
				roundBetween bool
			}{{&samePipeline, true}, {&ideal, false}} {
				want := referenceResize(src, tc.w, tc.h, tc.c, tc.outW, tc.outH, ref.roundBetween)
				mean, mx := pixelDiff(got, want)
				ref.s.sum += mean * float64(len(got))
				ref.s.n += float64(len(got))
				ref.s.max = max(ref.s.max, mx)
				assert.LessOrEqual(t, mx, 1, "%s %dx%dx%d -> %dx%d", kind, tc.w, tc.h, tc.c, tc.outW, tc.outH)
			}
		}
	}
	t.Logf("vs float64 with Pillow's uint8 intermediate: mean |diff| %.5f, max %d over %.0f pixels", samePipeline.sum/samePipeline.n, samePipeline.max, samePipeline.n)
	t.Logf("vs ideal float64 separable filter: mean |diff| %.5f, max %d", ideal.sum/ideal.n, ideal.max)
	// Only 22-bit fixed-point weights separate them: a value within ~1e-4 of
	// a .5 tie (common with integer scale factors) may round the other way.
	assert.Less(t, samePipeline.sum/samePipeline.n, 0.005)
	assert.Less(t, ideal.sum/ideal.n, 0.2)
}

// TestResizeMatchesPillow compares with images that Pillow 9.4 resized
// (testdata/pil/make.py): byte for byte, RGB and L, up and down.
func TestResizeMatchesPillow(t *testing.T) {
	src, w, h, _ := readPNG(t, "testdata/pil/src.png")
	for _, mode := range []string{"rgb", "l"} {
		c := 3
		if mode == "l" {
			c = 1
		}
		img, _, _ := convertChannels(&image.NRGBA{Pix: rgbToNRGBA(src), Stride: 4 * w, Rect: image.Rect(0, 0, w, h)}, c, "")
		files, err := filepath.Glob(fmt.Sprintf("testdata/pil/resize_%s_*.png", mode))
		require.NoError(t, err)
		require.NotEmpty(t, files)
		for _, f := range files {
			want, ow, oh, wc := readPNG(t, f)
			require.Equal(t, c, wc, f)
			got := resizeBilinear(img, w, h, c, ow, oh)
			mean, mx := pixelDiff(got, want)
			assert.Equal(t, 0, mx, "%s: mean |diff| %.4f", f, mean)
		}
	}
}

func rgbToNRGBA(rgb []uint8) []uint8 {
	out := make([]uint8, 0, len(rgb)/3*4)
	for i := 0; i < len(rgb); i += 3 {
		out = append(out, rgb[i], rgb[i+1], rgb[i+2], 255)
	}
	return out
}

// TestResizeRoundTripKeepsTheDigit: a digit enlarged to 128x128 and shrunk
// back still looks like itself.
func TestResizeRoundTripKeepsTheDigit(t *testing.T) {
	for label := range uint8(10) {
		d, _ := digit(t, label)
		up := resizeBilinear(d.Pix, 28, 28, 1, 128, 128)
		back := resizeBilinear(up, 128, 128, 1, 28, 28)
		assert.Greater(t, correlation(d.Pix, back), 0.97, "digit %d", label)
		// and it is not just any digit: another digit correlates less
		other, _ := digit(t, (label+1)%10)
		assert.Less(t, correlation(other.Pix, back), correlation(d.Pix, back))
	}
}

func correlation(a, b []uint8) float64 {
	var ma, mb float64
	for i := range a {
		ma += float64(a[i])
		mb += float64(b[i])
	}
	ma /= float64(len(a))
	mb /= float64(len(b))
	var sab, saa, sbb float64
	for i := range a {
		da, db := float64(a[i])-ma, float64(b[i])-mb
		sab += da * db
		saa += da * da
		sbb += db * db
	}
	return sab / math.Sqrt(saa*sbb)
}

func TestResizeSameSizeIsACopy(t *testing.T) {
	src := []uint8{1, 2, 3, 4, 5, 6}
	assert.Equal(t, src, resizeBilinear(src, 2, 3, 1, 2, 3))
}
