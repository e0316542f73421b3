package augment_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/augment"
)

// words is a deterministic word source for draws: a simple hash of (salt, d).
func words(salt uint32) augment.Words {
	return func(d uint32) uint32 {
		x := uint64(salt)<<32 | uint64(d)
		x ^= x >> 33
		x *= 0xff51afd7ed558ccd
		x ^= x >> 33
		x *= 0xc4ceb9fe1a85ec53
		x ^= x >> 33
		return uint32(x)
	}
}

func constWord(w uint32) augment.Words { return func(uint32) uint32 { return w } }

// random_crop with padding: offsets cover [0, H+2p-h] uniformly-ish, the box has the crop's size
// and may start in the padding; eval is the center crop (CenterCrop's rounding).
func TestRandomCropBoxes(t *testing.T) {
	s := &augment.Spec{H: 8, W: 9, C: 1, OutH: 6, OutW: 7, Steps: []augment.Step{{Kind: augment.RandomCrop, Size: [2]int64{6, 7}, Padding: 2}}}
	seen := map[[2]int64]bool{}
	for salt := range uint32(2000) {
		p := s.Draw(words(salt))
		require.Equal(t, int64(6), p.Height)
		require.Equal(t, int64(7), p.Width)
		require.GreaterOrEqual(t, p.Top, int64(-2))
		require.LessOrEqual(t, p.Top, int64(8+2-6))
		require.GreaterOrEqual(t, p.Left, int64(-2))
		require.LessOrEqual(t, p.Left, int64(9+2-7))
		require.False(t, p.Flip)
		seen[[2]int64{p.Top, p.Left}] = true
	}
	assert.Len(t, seen, 7*7, "every offset of the padded image is drawn")
	// words 0 and max give the extreme offsets
	assert.Equal(t, augment.Params{Top: -2, Left: -2, Height: 6, Width: 7}, s.Draw(constWord(0)))
	assert.Equal(t, augment.Params{Top: 4, Left: 4, Height: 6, Width: 7}, s.Draw(constWord(math.MaxUint32)))
	// CenterCrop: round((8-6)/2) = 1, round((9-7)/2) = 1
	assert.Equal(t, augment.Params{Top: 1, Left: 1, Height: 6, Width: 7}, s.Eval())
}

// CenterCrop of an image smaller than the crop pads first: (th-H)//2 on top, (tw-W)//2 on the left;
// half-pixel offsets round to even, as Python's round.
func TestCenterCrop(t *testing.T) {
	s := &augment.Spec{H: 5, W: 10, C: 1, OutH: 8, OutW: 7, Steps: []augment.Step{{Kind: augment.RandomCrop, Size: [2]int64{8, 7}, Padding: 3}}}
	// top: the crop is 3 taller: (8-5)//2 = 1 row of padding above; left: round(3/2) = round(1.5) = 2
	assert.Equal(t, augment.Params{Top: -1, Left: 2, Height: 8, Width: 7}, s.Eval())
	s = &augment.Spec{H: 9, W: 9, C: 1, OutH: 4, OutW: 4, Steps: []augment.Step{{Kind: augment.RandomCrop, Size: [2]int64{4, 4}}}}
	assert.Equal(t, augment.Params{Top: 2, Left: 2, Height: 4, Width: 4}, s.Eval(), "round(2.5) = 2")
}

// hflip: the threshold is p·2^32; p = 0 never flips, p = 1 always; a flip before the crop mirrors
// the box, after it only the output.
func TestFlip(t *testing.T) {
	crop := augment.Step{Kind: augment.RandomCrop, Size: [2]int64{4, 3}}
	before := &augment.Spec{H: 6, W: 7, C: 1, OutH: 4, OutW: 3, Steps: []augment.Step{{Kind: augment.HFlip, P: 1}, crop}}
	after := &augment.Spec{H: 6, W: 7, C: 1, OutH: 4, OutW: 3, Steps: []augment.Step{crop, {Kind: augment.HFlip, P: 1}}}
	never := &augment.Spec{H: 6, W: 7, C: 1, OutH: 4, OutW: 3, Steps: []augment.Step{crop, {Kind: augment.HFlip, P: 0}}}
	for salt := range uint32(200) {
		w := words(salt)
		a, b, n := after.Draw(w), before.Draw(func(d uint32) uint32 {
			// before's crop is its second step: give it after's crop words
			if d >= augment.WordsPerStep {
				return w(d - augment.WordsPerStep)
			}
			return w(d)
		}), never.Draw(w)
		assert.True(t, a.Flip)
		assert.True(t, b.Flip)
		assert.False(t, n.Flip)
		assert.Equal(t, a.Top, b.Top)
		assert.Equal(t, 7-a.Left-3, b.Left, "flipping first mirrors the box")
	}
	assert.Equal(t, uint64(1<<32), augment.FlipThreshold(1))
	assert.Equal(t, uint64(0), augment.FlipThreshold(0))
}

// Apply follows the pipeline step by step: crop-then-flip read straight from a padded, flipped
// copy of the image equals Apply's folded box.
func TestApplyMatchesThePipeline(t *testing.T) {
	const h, w, c = 5, 6, 3
	px := make([]float64, h*w*c)
	for i := range px {
		px[i] = float64((i*37 + 11) % 256)
	}
	norm := augment.Step{Kind: augment.Normalize, Mean: []float64{0.1, 0.2, 0.3}, Std: []float64{0.5, 0.25, 2}}
	for _, flipFirst := range []bool{false, true} {
		steps := []augment.Step{{Kind: augment.RandomCrop, Size: [2]int64{4, 5}, Padding: 2}, {Kind: augment.HFlip, P: 0.5}, norm}
		if flipFirst {
			steps[0], steps[1] = steps[1], steps[0]
		}
		s := &augment.Spec{H: h, W: w, C: c, OutH: 4, OutW: 5, Steps: steps}
		for salt := range uint32(50) {
			words := words(salt)
			p := s.Draw(words)
			got := make([]float64, c*4*5)
			s.Apply(px, p, got)
			// the pipeline: (flip?) pad, crop at the drawn offsets, (flip?), normalize
			flip := p.Flip
			cropWords := func(d uint32) uint32 { return words(d) }
			k := 0
			if flipFirst {
				k = 1
			}
			i := int64((uint64(cropWords(uint32(k)*augment.WordsPerStep)) * uint64(h+4-4+1)) >> 32)
			j := int64((uint64(cropWords(uint32(k)*augment.WordsPerStep+1)) * uint64(w+4-5+1)) >> 32)
			for ch := range int64(c) {
				for y := range int64(4) {
					for x := range int64(5) {
						// the image the crop sees: flipped first or not
						xx := x
						if flip && !flipFirst {
							xx = 4 - x
						}
						py, pxx := i+y-2, j+xx-2 // in the (flipped) image
						if flip && flipFirst {
							pxx = w - 1 - pxx
						}
						v := 0.0
						if py >= 0 && py < h && pxx >= 0 && pxx < w {
							v = px[(py*w+pxx)*c+ch] / 255
						}
						v = (v - norm.Mean[ch]) / norm.Std[ch]
						require.InDelta(t, v, got[(ch*4+y)*5+x], 1e-12, "flipFirst %v salt %d (%d,%d,%d)", flipFirst, salt, ch, y, x)
					}
				}
			}
		}
	}
}

// random_resized_crop: boxes inside the image with area and ratio in range (up to rounding); the
// fallback when nothing fits; bilinear taps as torch's align_corners=False.
func TestResizedCrop(t *testing.T) {
	st := augment.Step{Kind: augment.RandomResizedCrop, Size: [2]int64{8, 8}, Scale: [2]float64{0.25, 0.8}, Ratio: [2]float64{0.5, 2}}
	s := &augment.Spec{H: 20, W: 30, C: 1, OutH: 8, OutW: 8, Steps: []augment.Step{st}}
	for salt := range uint32(500) {
		p := s.Draw(words(salt))
		require.True(t, p.Top >= 0 && p.Left >= 0 && p.Top+p.Height <= 20 && p.Left+p.Width <= 30, "%+v", p)
		if p == augment.ResizedCropFallback(st, 20, 30) {
			continue
		}
		area := float64(p.Height*p.Width) / 600
		assert.True(t, area > 0.25*0.8 && area < 0.8*1.25, "area %g", area)
	}
	// a ratio range no box of the image can meet: ten failures, then the clamped central crop
	wide := augment.Step{Kind: augment.RandomResizedCrop, Size: [2]int64{4, 4}, Scale: [2]float64{0.99, 1}, Ratio: [2]float64{5, 6}}
	s = &augment.Spec{H: 20, W: 10, C: 1, OutH: 4, OutW: 4, Steps: []augment.Step{wide}}
	// W/H = 0.5 < 5: w = 10, h = round(10/5) = 2, centered
	want := augment.Params{Top: 9, Left: 0, Height: 2, Width: 10}
	assert.Equal(t, want, augment.ResizedCropFallback(wide, 20, 10))
	assert.Equal(t, want, s.Draw(words(3)))
	// resizing a 2x2 box to 4x4: torch's taps (src = (i+0.5)/2 - 0.5, clamped at 0)
	s = &augment.Spec{H: 2, W: 2, C: 1, OutH: 4, OutW: 4}
	out := make([]float64, 16)
	s.Apply([]float64{0, 255, 255, 255}, augment.Params{Height: 2, Width: 2}, out)
	assert.InDelta(t, 0.0, out[0], 1e-15)         // src (0,0)
	assert.InDelta(t, 0.25, out[1], 1e-15)        // src x = 0.25
	assert.InDelta(t, 1-0.75*0.75, out[5], 1e-15) // (0.25, 0.25)
	assert.InDelta(t, 1.0, out[3], 1e-15)         // x = 1.25 clamps to the last pixel
}
