package data

// Resizing as torchvision's Resize((H, W)) does it on a PIL image, which is
// Pillow's Image.resize((W, H), BILINEAR): a separable triangle filter whose
// support is widened by the scale factor when shrinking (antialiasing) and
// is 1 pixel when enlarging. For 8-bit images Pillow computes each pass's
// weights in double precision, turns them into 22-bit fixed point and rounds
// each pass's result to uint8 (horizontal pass first, then vertical). We do
// exactly the same, so the output equals Pillow's byte for byte; the tests
// check that against a float64 implementation of the same filter and
// against images resized by Pillow itself (testdata/pil).

import (
	"math"
	"sync"
)

// fixedBits is Pillow's PRECISION_BITS for 8-bit images: 32 bits minus 8
// for the pixel value and 2 for the sign and overflow of negative lobes.
const fixedBits = 32 - 8 - 2

// filterAxis holds one axis's filter: output pixel o reads the input pixels
// first[o] .. first[o]+count[o]-1 with weights[o*taps : o*taps+count[o]].
type filterAxis struct {
	taps   int
	first  []int
	count  []int
	weight []int32
}

// bilinearWeight is the triangle filter with support 1.
func bilinearWeight(x float64) float64 {
	if x < 0 {
		x = -x
	}
	if x < 1 {
		return 1 - x
	}
	return 0
}

// bilinearAxisFloat computes the normalised float64 weights of one axis, as
// Pillow's precompute_coeffs does for the whole image box [0, inSize).
func bilinearAxisFloat(inSize, outSize int) (taps int, first, count []int, weight []float64) {
	scale := float64(inSize) / float64(outSize)
	filterScale := max(scale, 1) // widen the kernel only when shrinking
	support := 1.0 * filterScale
	invScale := 1 / filterScale // Pillow multiplies by the reciprocal: same rounding
	taps = int(math.Ceil(support))*2 + 1
	first = make([]int, outSize)
	count = make([]int, outSize)
	weight = make([]float64, outSize*taps)
	for o := range outSize {
		center := (float64(o) + 0.5) * scale
		// Pillow rounds the window ends with a truncating +0.5 and clamps
		// them to the image.
		lo := max(int(center-support+0.5), 0)
		hi := min(int(center+support+0.5), inSize)
		w := weight[o*taps : o*taps+taps]
		sum := 0.0
		for k := range hi - lo {
			w[k] = bilinearWeight((float64(k+lo) - center + 0.5) * invScale)
			sum += w[k]
		}
		if sum != 0 {
			for k := range hi - lo {
				w[k] /= sum
			}
		}
		first[o], count[o] = lo, hi-lo
	}
	return taps, first, count, weight
}

// toFixed rounds a weight to fixed point away from zero, as Pillow does.
func toFixed(w float64) int32 {
	if w < 0 {
		return int32(-0.5 + w*(1<<fixedBits))
	}
	return int32(0.5 + w*(1<<fixedBits))
}

var axisCache sync.Map // [2]int{in, out} -> *filterAxis

// bilinearAxis returns the fixed-point filter for one axis, shared by all
// images with the same sizes (a folder usually has only a few).
func bilinearAxis(inSize, outSize int) *filterAxis {
	key := [2]int{inSize, outSize}
	if a, ok := axisCache.Load(key); ok {
		return a.(*filterAxis)
	}
	taps, first, count, wf := bilinearAxisFloat(inSize, outSize)
	a := &filterAxis{taps: taps, first: first, count: count, weight: make([]int32, len(wf))}
	for i, w := range wf {
		a.weight[i] = toFixed(w)
	}
	if len(a.weight) > maxCachedAxisWeights {
		return a // an outlandish size: not worth keeping for the next image
	}
	actual, _ := axisCache.LoadOrStore(key, a)
	return actual.(*filterAxis)
}

// maxCachedAxisWeights bounds the filters kept in axisCache (256 KiB
// each): a 4000-pixel side shrunk to 128 needs 8320 weights.
const maxCachedAxisWeights = 1 << 16

// clipFixed turns a fixed-point sum into a pixel value.
func clipFixed(v int) uint8 {
	if v <= 0 {
		return 0
	}
	if v >= 255<<fixedBits {
		return 255
	}
	return uint8(v >> fixedBits)
}

// resizeBilinear resizes an HWC image of w x h pixels with c channels to
// outW x outH like Pillow's BILINEAR resize. It returns src itself when the
// size does not change (Pillow copies).
func resizeBilinear(src []uint8, w, h, c, outW, outH int) []uint8 {
	if w == outW && h == outH {
		return src
	}
	img, rowOffset := src, 0
	var vert *filterAxis
	if h != outH {
		vert = bilinearAxis(h, outH)
	}
	if w != outW {
		horiz := bilinearAxis(w, outW)
		// Only the rows the vertical pass reads need the horizontal pass.
		y0, y1 := 0, h
		if vert != nil {
			y0 = vert.first[0]
			y1 = vert.first[outH-1] + vert.count[outH-1]
		}
		img = resizeRows(src, w, c, y0, y1, outW, horiz)
		rowOffset = y0
	}
	if vert == nil {
		return img
	}
	return resizeColumns(img, outW, c, rowOffset, outH, vert)
}

// resizeRows filters rows y0..y1-1 of src horizontally to outW pixels.
// Grayscale and RGB get their own loops: this pass is the hot one.
func resizeRows(src []uint8, w, c, y0, y1, outW int, a *filterAxis) []uint8 {
	dst := make([]uint8, (y1-y0)*outW*c)
	const half = 1 << (fixedBits - 1)
	for y := y0; y < y1; y++ {
		in := src[y*w*c : (y+1)*w*c]
		out := dst[(y-y0)*outW*c : (y-y0+1)*outW*c]
		for o := range outW {
			ws := a.weight[o*a.taps : o*a.taps+a.count[o]]
			px := in[a.first[o]*c : (a.first[o]+len(ws))*c]
			switch c {
			case 1:
				sum := half
				for k, wk := range ws {
					sum += int(px[k]) * int(wk)
				}
				out[o] = clipFixed(sum)
			case 3:
				r, g, b := half, half, half
				for k, wk := range ws {
					p := px[3*k : 3*k+3]
					r += int(p[0]) * int(wk)
					g += int(p[1]) * int(wk)
					b += int(p[2]) * int(wk)
				}
				out[3*o], out[3*o+1], out[3*o+2] = clipFixed(r), clipFixed(g), clipFixed(b)
			default:
				for ch := range c {
					sum := half
					for k, wk := range ws {
						sum += int(px[k*c+ch]) * int(wk)
					}
					out[o*c+ch] = clipFixed(sum)
				}
			}
		}
	}
	return dst
}

// resizeColumns filters an image whose first row is source row rowOffset
// vertically to outH rows.
func resizeColumns(src []uint8, w, c, rowOffset, outH int, a *filterAxis) []uint8 {
	stride := w * c
	dst := make([]uint8, outH*stride)
	half := 1 << (fixedBits - 1)
	acc := make([]int, stride)
	for o := range outH {
		for i := range acc {
			acc[i] = half
		}
		first := a.first[o] - rowOffset
		for k, wk := range a.weight[o*a.taps : o*a.taps+a.count[o]] {
			row := src[(first+k)*stride : (first+k+1)*stride]
			for i, p := range row {
				acc[i] += int(p) * int(wk)
			}
		}
		out := dst[o*stride : (o+1)*stride]
		for i, v := range acc {
			out[i] = clipFixed(v)
		}
	}
	return dst
}
