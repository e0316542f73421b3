package codegen

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/runtime/kernelarg"
)

// The data block's augmentation in the CUDA kernels: the nodes that read the raw u8 image (conv
// blocks and their weight gradients, to_tensor) carry the list (Attrs.Aug), and their templates
// render templates/augment.cu.tmpl's device functions for it — the sample's box (a Philox draw
// in training, keyed by the step's seed and step and the sample's position in the batch;
// evaluation's constant center box) and the augmented pixel — and call them in their loads.
// Training's kernels take two more parameters: the step's scalars and the first sample of the
// micro-batch they cover (placeLaunch sets it).

// augData is what augment.cu.tmpl reads.
type augData struct {
	ID, Doc                  string
	Train                    bool
	RH, RW, C, OH, OW        int64
	OHF, OWF                 string // OH, OW as float literals
	RawElems                 int64  // bytes of one raw sample
	ETop, ELeft, EH, EW      int64  // evaluation's box
	Crop, CropWord, Pad      int64  // 0 none, 1 random_crop, 2 random_resized_crop
	CropRows, CropCols       int64  // random_crop: offsets drawn below these
	Area                     string // random_resized_crop: the image's area, scale and log-ratio bounds
	Scale0, Scale1, LR0, LR1 string
	FTop, FLeft, FH, FW      int64 // its fallback box
	FlipK, FlipWord          int64
	FlipT                    uint64
	FlipFolds                bool // the flip comes before the crop
	Norm                     bool
	Mean, Std                [3]string
}

// newAugData is the template data of list s for training or evaluation (nil without a list).
func newAugData(s *augment.Spec, eval bool) *augData {
	if s == nil {
		return nil
	}
	ev := s.Eval()
	d := &augData{Train: !eval && s.Random(), RH: s.H, RW: s.W, C: s.C, OH: s.OutH, OW: s.OutW,
		OHF: cFloat(float64(s.OutH)), OWF: cFloat(float64(s.OutW)), RawElems: s.H * s.W * s.C,
		ETop: ev.Top, ELeft: ev.Left, EH: ev.Height, EW: ev.Width, FlipK: -1, Doc: s.String()}
	d.Mean, d.Std = [3]string{"0.0f", "0.0f", "0.0f"}, [3]string{"1.0f", "1.0f", "1.0f"}
	cropK := int64(-1)
	for k, st := range s.Steps {
		w := int64(k) * augment.WordsPerStep
		switch st.Kind {
		case augment.RandomCrop:
			d.Crop, cropK, d.CropWord, d.Pad = 1, int64(k), w, st.Padding
			d.CropRows, d.CropCols = s.H+2*st.Padding-s.OutH+1, s.W+2*st.Padding-s.OutW+1
		case augment.RandomResizedCrop:
			d.Crop, cropK, d.CropWord = 2, int64(k), w
			d.Area = cDouble(float64(s.H * s.W))
			d.Scale0, d.Scale1 = cDouble(st.Scale[0]), cDouble(st.Scale[1])
			d.LR0, d.LR1 = cDouble(math.Log(st.Ratio[0])), cDouble(math.Log(st.Ratio[1]))
			fb := augment.ResizedCropFallback(st, s.H, s.W)
			d.FTop, d.FLeft, d.FH, d.FW = fb.Top, fb.Left, fb.Height, fb.Width
		case augment.HFlip:
			d.FlipK, d.FlipWord, d.FlipT = int64(k), w, augment.FlipThreshold(st.P)
		case augment.Normalize:
			d.Norm = true
			for c := range st.Mean {
				d.Mean[c], d.Std[c] = cFloat(float64(float32(st.Mean[c]))), cFloat(float64(float32(st.Std[c])))
			}
		}
	}
	d.FlipFolds = d.Crop != 0 && d.FlipK >= 0 && d.FlipK < cropK
	h := sha256.Sum256(fmt.Appendf(nil, "%+v", *d))
	d.ID = hex.EncodeToString(h[:6])
	return d
}

// augParams appends a training kernel's augmentation parameters and arguments.
func augParams(a *augData, params []string, args []Arg) ([]string, []Arg) {
	if a == nil || !a.Train {
		return params, args
	}
	return append(params, scalarsParam, "long long first"), append(args, scalarsArg, Arg{Kind: kernelarg.Int})
}

// augName marks a kernel that augments, for its name.
func augName(a *augData) string {
	if a == nil {
		return ""
	}
	return "_aug" + a.ID
}
