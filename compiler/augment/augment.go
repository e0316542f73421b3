// Package augment is the data block's augmentation: torchvision's
// RandomCrop, RandomResizedCrop, RandomHorizontalFlip and Normalize, done
// by the first layer's kernels while they load the raw uint8 batch.
//
// In:  the data block's `augment = [...]` list, checked (compiler's
// ParseData), as a Spec: the steps, the raw image size the loader delivers
// and the model's input size.
// Out: per sample, the Params of one step (a crop box in raw-image
// coordinates and a mirror flag) drawn from a counter-based generator
// keyed by (seed, step, sample position); and Apply, the float64
// reference of what a kernel computes from a raw image and its Params.
//
// Why here: the same draw runs in three places — this Go code (the
// reference executor, tests), the CPU kernels (runtime/native/cnnc_cpu.h)
// and the CUDA kernels — so it is defined once, in integer arithmetic and
// IEEE double operations, and every geometric step is folded into one box
// and one flag: a kernel then needs no per-step code. The package imports
// nothing of the compiler (the random words come from the caller, Philox
// in compiler/ops), so both the IR and the ops can name its types.
package augment

import (
	"fmt"
	"math"
	"strings"
)

// Kind is an augmentation step's transform.
type Kind uint8

const (
	RandomCrop        Kind = iota + 1 // torchvision RandomCrop(size, padding): zero padding, a uniform box
	RandomResizedCrop                 // RandomResizedCrop(size, scale, ratio): bilinear, antialias=False
	HFlip                             // RandomHorizontalFlip(p)
	Normalize                         // Normalize(mean, std)
)

// Names are the DSL's names of the steps.
var Names = map[string]Kind{"random_crop": RandomCrop, "random_resized_crop": RandomResizedCrop, "hflip": HFlip, "normalize": Normalize}

func (k Kind) String() string {
	for n, v := range Names {
		if v == k {
			return n
		}
	}
	return fmt.Sprintf("augment.Kind(%d)", uint8(k))
}

// Step is one transform of the list, with its arguments.
type Step struct {
	Kind      Kind
	Size      [2]int64   // crops: output H, W
	Padding   int64      // random_crop: zeros on every side
	Scale     [2]float64 // random_resized_crop: area fraction range
	Ratio     [2]float64 // random_resized_crop: aspect (w/h) range
	P         float64    // hflip: probability
	Mean, Std []float64  // normalize: per channel
}

// Spec is a checked augmentation list: its steps in order, the raw image
// the loader delivers (H, W, C) and the model's input (OutH, OutW).
type Spec struct {
	Steps      []Step
	H, W, C    int64
	OutH, OutW int64
}

// Crop returns the list's crop step, or nil.
func (s *Spec) Crop() *Step {
	for i := range s.Steps {
		if k := s.Steps[i].Kind; k == RandomCrop || k == RandomResizedCrop {
			return &s.Steps[i]
		}
	}
	return nil
}

// Norm returns the list's normalize step, or nil.
func (s *Spec) Norm() *Step {
	for i := range s.Steps {
		if s.Steps[i].Kind == Normalize {
			return &s.Steps[i]
		}
	}
	return nil
}

// Resamples reports whether training bilinearly resizes a box (random_resized_crop).
func (s *Spec) Resamples() bool {
	c := s.Crop()
	return c != nil && c.Kind == RandomResizedCrop
}

// Random reports whether the list draws anything (training differs from
// evaluation's deterministic parts).
func (s *Spec) Random() bool {
	for _, st := range s.Steps {
		if st.Kind != Normalize {
			return true
		}
	}
	return false
}

// String is a short description for kernel documentation and plans.
func (s *Spec) String() string {
	var parts []string
	for _, st := range s.Steps {
		switch st.Kind {
		case RandomCrop:
			parts = append(parts, fmt.Sprintf("random_crop %dx%d pad %d", st.Size[0], st.Size[1], st.Padding))
		case RandomResizedCrop:
			parts = append(parts, fmt.Sprintf("random_resized_crop %dx%d scale [%g,%g] ratio [%g,%g]", st.Size[0], st.Size[1], st.Scale[0], st.Scale[1], st.Ratio[0], st.Ratio[1]))
		case HFlip:
			parts = append(parts, fmt.Sprintf("hflip p=%g", st.P))
		case Normalize:
			parts = append(parts, fmt.Sprintf("normalize mean %v std %v", st.Mean, st.Std))
		}
	}
	return fmt.Sprintf("%dx%dx%d -> %dx%d: %s", s.H, s.W, s.C, s.OutH, s.OutW, strings.Join(parts, ", "))
}

// Params are one sample's draw, every geometric step folded in: output
// pixel (y, x) reads the box Top..Top+Height-1, Left..Left+Width-1 of the
// raw image (pixels outside the image are 0: random_crop's padding, a
// center crop larger than the image), at column OutW-1-x when Flip. A box
// of the output's size is read pixel for pixel; another size is resized
// bilinearly (random_resized_crop).
type Params struct {
	Top, Left, Height, Width int64
	Flip                     bool
}

// Words gives the d-th random 32-bit word of a sample's draw.
type Words func(d uint32) uint32

// WordsPerStep is how many words each step of the list may use: step k
// draws words k·WordsPerStep onwards (random_resized_crop uses up to 22:
// ten attempts of two, then two offsets), so a step's draw never depends
// on how many the one before it used.
const WordsPerStep = 24

// uniform is torchvision's uniform_(a, b) from a word: 24 random bits, as
// float32's mantissa holds, in double.
func uniform(w uint32, a, b float64) float64 {
	return a + float64(w>>8)*(1.0/16777216.0)*(b-a)
}

// below is an integer in [0, n) from a word (multiply-shift: exact in any
// language, bias below n/2^32).
func below(w uint32, n int64) int64 {
	return int64((uint64(w) * uint64(n)) >> 32)
}

// FlipThreshold is hflip's p as a fraction of 2^32: a word below it flips
// (p=1: always; p=0: never).
func FlipThreshold(p float64) uint64 { return uint64(math.Round(p * 4294967296.0)) }

// Draw returns a training sample's Params: the steps' draws (DrawSteps)
// folded into one box and flag. Given the same words the C kernels
// compute the same box (aug_box in cnnc_cpu.h, cnnc_aug_box_* of
// templates/augment.cu.tmpl): integers but for random_resized_crop, whose
// doubles follow torchvision's get_params (log of the ratio bounds is the
// spec's, computed once; sqrt is correctly rounded everywhere; exp of the
// drawn log-ratio may differ by an ulp between libm's, which moves a box
// edge only when sqrt lands within an ulp of a half-integer).
func (s *Spec) Draw(words Words) Params {
	p := Params{Height: s.H, Width: s.W}
	for k, d := range s.DrawSteps(words) {
		switch s.Steps[k].Kind {
		case RandomCrop:
			pad := s.Steps[k].Padding
			p = foldCrop(p, Params{Top: d.Top - pad, Left: d.Left - pad, Height: d.Height, Width: d.Width}, s.W)
		case RandomResizedCrop:
			p = foldCrop(p, d, s.W)
		case HFlip:
			p.Flip = p.Flip != d.Flip
		}
	}
	return p
}

// DrawSteps returns each step's own draw, as torchvision's get_params and
// RandomHorizontalFlip give them: a crop's box (i, j, h, w) in the image
// the step receives (random_crop's in the padded image), a flip's
// decision; normalize draws nothing. Step k uses words k·WordsPerStep on.
func (s *Spec) DrawSteps(words Words) []Params {
	out := make([]Params, len(s.Steps))
	for k, st := range s.Steps {
		d := uint32(k) * WordsPerStep
		next := func() uint32 { w := words(d); d++; return w }
		switch st.Kind {
		case RandomCrop:
			hp, wp := s.H+2*st.Padding, s.W+2*st.Padding
			i, j := below(next(), hp-st.Size[0]+1), below(next(), wp-st.Size[1]+1)
			out[k] = Params{Top: i, Left: j, Height: st.Size[0], Width: st.Size[1]}
		case RandomResizedCrop:
			out[k] = resizedCropBox(st, s.H, s.W, next)
		case HFlip:
			out[k].Flip = uint64(next()) < FlipThreshold(st.P)
		}
	}
	return out
}

// foldCrop applies a crop box drawn on the image as the steps so far left
// it (the raw image, mirrored when p.Flip: only a flip can come before the
// one crop) and returns the sample's params: mirrored, the box is the
// mirror image of itself in raw columns and the output stays mirrored.
func foldCrop(p, box Params, w int64) Params {
	if p.Flip {
		box.Left = w - box.Left - box.Width
	}
	box.Flip = p.Flip
	return box
}

// resizedCropBox is torchvision's RandomResizedCrop.get_params: ten
// attempts at an area fraction in scale and a log-uniform aspect ratio,
// else the whole image's central crop with the ratio clamped. Python's
// round is half to even, as math.RoundToEven and C's rint.
func resizedCropBox(st Step, h, w int64, next func() uint32) Params {
	area := float64(h * w)
	lr0, lr1 := math.Log(st.Ratio[0]), math.Log(st.Ratio[1])
	for range 10 {
		target := area * uniform(next(), st.Scale[0], st.Scale[1])
		aspect := math.Exp(uniform(next(), lr0, lr1))
		cw := int64(math.RoundToEven(math.Sqrt(target * aspect)))
		ch := int64(math.RoundToEven(math.Sqrt(target / aspect)))
		if 0 < cw && cw <= w && 0 < ch && ch <= h {
			i, j := below(next(), h-ch+1), below(next(), w-cw+1)
			return Params{Top: i, Left: j, Height: ch, Width: cw}
		}
	}
	return ResizedCropFallback(st, h, w)
}

// ResizedCropFallback is random_resized_crop's box when ten attempts fail:
// the whole image's central crop, its aspect ratio clamped to the range.
func ResizedCropFallback(st Step, h, w int64) Params {
	inRatio := float64(w) / float64(h)
	cw, ch := w, h
	switch {
	case inRatio < min(st.Ratio[0], st.Ratio[1]):
		ch = int64(math.RoundToEven(float64(cw) / min(st.Ratio[0], st.Ratio[1])))
	case inRatio > max(st.Ratio[0], st.Ratio[1]):
		cw = int64(math.RoundToEven(float64(ch) * max(st.Ratio[0], st.Ratio[1])))
	}
	return Params{Top: (h - ch) / 2, Left: (w - cw) / 2, Height: ch, Width: cw}
}

// Eval returns evaluation's Params: no flip; where the list crops, a
// center crop of the output size (torchvision's CenterCrop: offsets
// rounded half to even, zero padding around an image smaller than the
// crop); else the whole image.
func (s *Spec) Eval() Params {
	if s.Crop() == nil {
		return Params{Height: s.H, Width: s.W}
	}
	return Params{Top: centerOffset(s.H, s.OutH), Left: centerOffset(s.W, s.OutW), Height: s.OutH, Width: s.OutW}
}

// centerOffset is CenterCrop's first row (column) of a crop of n from m:
// round((m-n)/2) when the crop fits, else minus the left padding
// (n-m)//2 that CenterCrop adds first.
func centerOffset(m, n int64) int64 {
	if n > m {
		return -((n - m) / 2)
	}
	return int64(math.RoundToEven(float64(m-n) / 2))
}

// Apply is the float64 reference of the kernels: one sample's raw uint8
// HWC pixels (as values 0..255) to the model's input, CHW, with params p
// and the list's normalisation. out has C·OutH·OutW elements.
func (s *Spec) Apply(px []float64, p Params, out []float64) {
	h, w, c := s.H, s.W, s.C
	at := func(ch, y, x int64) float64 { // raw pixel of box coordinates, 0 outside the image
		y, x = p.Top+y, p.Left+x
		if y < 0 || y >= h || x < 0 || x >= w {
			return 0
		}
		return px[(y*w+x)*c+ch] / 255
	}
	norm := s.Norm()
	for ch := int64(0); ch < c; ch++ {
		for y := int64(0); y < s.OutH; y++ {
			for x := int64(0); x < s.OutW; x++ {
				xs := x
				if p.Flip {
					xs = s.OutW - 1 - x
				}
				var v float64
				if p.Height == s.OutH && p.Width == s.OutW {
					v = at(ch, y, xs)
				} else {
					y0, y1, ly := bilinearTaps(y, s.OutH, p.Height)
					x0, x1, lx := bilinearTaps(xs, s.OutW, p.Width)
					v = (1-ly)*((1-lx)*at(ch, y0, x0)+lx*at(ch, y0, x1)) + ly*((1-lx)*at(ch, y1, x0)+lx*at(ch, y1, x1))
				}
				if norm != nil {
					v = (v - norm.Mean[ch]) / norm.Std[ch]
				}
				out[(ch*s.OutH+y)*s.OutW+x] = v
			}
		}
	}
}

// bilinearTaps are torch's upsample_bilinear2d (align_corners=False)
// source taps of output index i of n from an input of m: the source
// coordinate (i+0.5)·m/n-0.5 clamped at 0, its floor, the next index
// (clamped at m-1) and the weight of the latter.
func bilinearTaps(i, n, m int64) (int64, int64, float64) {
	src := max((float64(i)+0.5)*float64(m)/float64(n)-0.5, 0)
	i0 := int64(src)
	i1 := min(i0+1, m-1)
	return i0, i1, src - float64(i0)
}
