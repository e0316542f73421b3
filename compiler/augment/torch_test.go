package augment_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/internal/torchtest"
)

// torchStep is a step as scripts/torch_augment.py reads it.
type torchStep struct {
	Kind    string    `json:"kind"`
	Size    [2]int64  `json:"size"`
	Padding int64     `json:"padding"`
	Mean    []float64 `json:"mean,omitempty"`
	Std     []float64 `json:"std,omitempty"`
}

type torchDraw struct {
	Top    int64 `json:"top"`
	Left   int64 `json:"left"`
	Height int64 `json:"height"`
	Width  int64 `json:"width"`
	Flip   bool  `json:"flip"`
}

type torchCase struct {
	H      int64       `json:"h"`
	W      int64       `json:"w"`
	C      int64       `json:"c"`
	Pixels []int       `json:"pixels"`
	Steps  []torchStep `json:"steps"`
	Eval   bool        `json:"eval"`
	Draws  []torchDraw `json:"draws"`
}

// Apply, on the box Draw folds from the steps' draws, against torchvision's transforms applied
// step by step with the same draws (scripts/torch_augment.py): random_crop with padding, hflip
// before and after the crop, random_resized_crop (bilinear, antialias=False) on odd sizes,
// normalize, and evaluation's center crop (an image smaller than the crop included).
//
// Tolerance: torchvision computes in float32. ToTensor's x/255 and Normalize's (x-m)/s are within
// 2 ulps of the exact values (|x| <= 1, |m| <= 1, so (x-m) carries at most 2·2^-24 absolute, /s
// adds an ulp of the result); interpolate's source coordinate and weights carry a few float32
// roundings of coordinates below 40 (about 2^-18 absolute), which moves a bilinear value by that
// times the largest pixel difference (1): so before normalisation the values agree within about
// 1e-5, after it within 1e-5/min(std) = 5e-5 (std >= 0.2 here). 1e-4 is checked; the measured
// worst is logged.
func TestAgainstTorchvision(t *testing.T) {
	torchtest.RequireVision(t)
	norm3 := augment.Step{Kind: augment.Normalize, Mean: []float64{0.485, 0.456, 0.406}, Std: []float64{0.229, 0.224, 0.225}}
	norm1 := augment.Step{Kind: augment.Normalize, Mean: []float64{0.1307}, Std: []float64{0.3081}}
	rc := func(h, w, p int64) augment.Step {
		return augment.Step{Kind: augment.RandomCrop, Size: [2]int64{h, w}, Padding: p}
	}
	rrc := func(h, w int64, scale, ratio [2]float64) augment.Step {
		return augment.Step{Kind: augment.RandomResizedCrop, Size: [2]int64{h, w}, Scale: scale, Ratio: ratio}
	}
	flip := augment.Step{Kind: augment.HFlip, P: 0.5}
	specs := []*augment.Spec{
		{H: 13, W: 11, C: 3, OutH: 13, OutW: 11, Steps: []augment.Step{rc(13, 11, 4), flip, norm3}},
		{H: 9, W: 12, C: 1, OutH: 7, OutW: 10, Steps: []augment.Step{flip, rc(7, 10, 1), norm1}},
		{H: 17, W: 23, C: 3, OutH: 8, OutW: 9, Steps: []augment.Step{rrc(8, 9, [2]float64{0.08, 1}, [2]float64{3.0 / 4, 4.0 / 3}), flip, norm3}},
		{H: 11, W: 15, C: 1, OutH: 14, OutW: 13, Steps: []augment.Step{flip, rrc(14, 13, [2]float64{0.3, 0.9}, [2]float64{0.5, 2})}},
		{H: 6, W: 5, C: 3, OutH: 9, OutW: 8, Steps: []augment.Step{rc(9, 8, 2), norm3}}, // evaluation pads: a crop larger than the image
		{H: 10, W: 10, C: 3, OutH: 10, OutW: 10, Steps: []augment.Step{norm3}},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var cases []torchCase
	var want [][]float64
	for si, s := range specs {
		for k := range 8 {
			eval := k == 7
			px := make([]int, s.H*s.W*s.C)
			pf := make([]float64, len(px))
			for i := range px {
				px[i] = rng.IntN(256)
				pf[i] = float64(px[i])
			}
			words := words(uint32(si*100 + k))
			tc := torchCase{H: s.H, W: s.W, C: s.C, Pixels: px, Eval: eval}
			for i, d := range s.DrawSteps(words) {
				st := s.Steps[i]
				ts := torchStep{Kind: st.Kind.String(), Size: st.Size, Padding: st.Padding, Mean: st.Mean, Std: st.Std}
				tc.Steps = append(tc.Steps, ts)
				tc.Draws = append(tc.Draws, torchDraw{d.Top, d.Left, d.Height, d.Width, d.Flip})
			}
			p := s.Draw(words)
			if eval {
				p = s.Eval()
			}
			out := make([]float64, s.C*s.OutH*s.OutW)
			s.Apply(pf, p, out)
			cases = append(cases, tc)
			want = append(want, out)
		}
	}
	var got struct {
		Torchvision string      `json:"torchvision"`
		Outs        [][]float64 `json:"outs"`
	}
	torchtest.Run(t, "../../scripts/torch_augment.py", map[string]any{"cases": cases}, &got)
	require.Len(t, got.Outs, len(want))
	worst := 0.0
	for i := range want {
		require.Len(t, got.Outs[i], len(want[i]), "case %d", i)
		for j := range want[i] {
			d := math.Abs(got.Outs[i][j] - want[i][j])
			worst = max(worst, d)
			require.LessOrEqual(t, d, 1e-4, "case %d (spec %d) element %d: torchvision %g, cnnc %g", i, i/8, j, got.Outs[i][j], want[i][j])
		}
	}
	t.Logf("torchvision %s: %d cases, worst difference %.2e", got.Torchvision, len(want), worst)
}
