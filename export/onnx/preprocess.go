package onnx

import (
	"encoding/binary"
	"math"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/dsl"
)

// Step is one deterministic transform the data pipeline applies to a [0,1]
// CHW image after ToTensor and before the first layer (what the test set
// gets: normalize, a center crop); the exported graph applies the same
// transform to its input, so that its users feed it ToTensor's output.
type Step interface {
	// inputShape is the per-sample [C,H,W] the step takes to give out
	// (the graph's input shape is found walking the steps backwards from
	// the model's image input).
	inputShape(out []int64) ([]int64, error)
	// emit appends the step's nodes and initializers reading tensor in of
	// per-sample shape chw, and returns its output's name and shape.
	emit(b *builder, in string, chw []int64) (string, []int64, error)
}

// PreprocessFor lists the Steps of a model's data block: the deterministic
// part of its augment list, as the test set gets it — a center crop where
// the list crops (the graph's input is then the loader's image size), then
// normalize — so that the exported graph takes ToTensor's output of the
// images the trainer loads.
func PreprocessFor(d compiler.DataConfig) []Step {
	s := d.Augment
	if s == nil {
		return nil
	}
	var steps []Step
	if s.Crop() != nil {
		ev := s.Eval()
		steps = append(steps, CenterCrop{H: s.H, W: s.W, OutH: s.OutH, OutW: s.OutW, Top: ev.Top, Left: ev.Left, Pos: d.AugmentPos})
	}
	if n := s.Norm(); n != nil {
		steps = append(steps, Normalize{Mean: n.Mean, Std: n.Std, Pos: d.AugmentPos})
	}
	return steps
}

// CenterCrop is torchvision's transforms.CenterCrop of an H x W image to
// the model's input: rows Top.. and columns Left.. (augment.Spec.Eval's
// box; negative where the image is smaller than the crop and CenterCrop
// pads it with zeros first) — ONNX's Pad, where it pads, then Slice.
type CenterCrop struct {
	H, W, OutH, OutW, Top, Left int64
	Pos                         dsl.Pos
}

func (c CenterCrop) inputShape(out []int64) ([]int64, error) {
	if out[1] != c.OutH || out[2] != c.OutW {
		return nil, dsl.Diagnostics{dsl.Errorf(c.Pos, "the center crop gives %dx%d but the model's input is %dx%d", c.OutH, c.OutW, out[1], out[2])}
	}
	return []int64{out[0], c.H, c.W}, nil
}

func (c CenterCrop) emit(b *builder, in string, chw []int64) (string, []int64, error) {
	doc := "center crop at " + c.Pos.String()
	oh, ow := c.OutH, c.OutW
	pt, pl := max(0, -c.Top), max(0, -c.Left)
	pb, pr := max(0, c.Top+oh-c.H), max(0, c.Left+ow-c.W)
	x, h, w := in, c.H, c.W
	if pt+pl+pb+pr > 0 {
		pads := b.int64Const("center_crop.pads", []int64{0, 0, pt, pl, 0, 0, pb, pr})
		x = b.names.unique("center_crop.padded")
		h, w = h+pt+pb, w+pl+pr
		b.valueInfo(x, []int64{chw[0], h, w})
		b.node(Node{Name: x, OpType: "Pad", Inputs: []string{in, pads}, Outputs: []string{x}, DocString: doc})
	}
	top, left := c.Top+pt, c.Left+pl
	starts := b.int64Const("center_crop.starts", []int64{top, left})
	ends := b.int64Const("center_crop.ends", []int64{top + oh, left + ow})
	axes := b.int64Const("center_crop.axes", []int64{2, 3})
	out := b.names.unique("center_crop")
	dims := []int64{chw[0], oh, ow}
	b.valueInfo(out, dims)
	b.node(Node{Name: out, OpType: "Slice", Inputs: []string{x, starts, ends, axes}, Outputs: []string{out}, DocString: doc})
	return out, dims, nil
}

// inputShape walks the steps backwards from the model's image shape.
func inputShape(model []int64, steps []Step) ([]int64, error) {
	chw := model
	for i := len(steps) - 1; i >= 0; i-- {
		var err error
		if chw, err = steps[i].inputShape(chw); err != nil {
			return nil, err
		}
	}
	return chw, nil
}

// Normalize is torchvision's transforms.Normalize: per channel,
// (x - mean) / std, computed in float32 with mean and std rounded to
// float32 (as torchvision converts them to the image's dtype) — ONNX's Sub
// then Div, element for element.
type Normalize struct {
	Mean, Std []float64
	Pos       dsl.Pos // the data block setting, for errors
}

func (n Normalize) inputShape(out []int64) ([]int64, error) {
	c := out[0]
	if int64(len(n.Mean)) != c || int64(len(n.Std)) != c {
		return nil, dsl.Diagnostics{dsl.Errorf(n.Pos, "normalize has %d means and %d standard deviations for %d channels", len(n.Mean), len(n.Std), c)}
	}
	for i, s := range n.Std {
		if !(s > 0) || math.IsInf(s, 0) || float32(s) == 0 {
			return nil, dsl.Diagnostics{dsl.Errorf(n.Pos, "normalize: std[%d] = %g must be a positive float32", i, s)}
		}
	}
	return out, nil
}

func (n Normalize) emit(b *builder, in string, chw []int64) (string, []int64, error) {
	dims := []int64{1, chw[0], 1, 1} // broadcasts over batch, height, width
	mean := b.names.unique("normalize.mean")
	b.initializer(mean, dims, float32Bytes(n.Mean))
	std := b.names.unique("normalize.std")
	b.initializer(std, dims, float32Bytes(n.Std))
	centred := b.names.unique("normalize.centred")
	b.valueInfo(centred, chw)
	b.node(Node{Name: centred, OpType: "Sub", Inputs: []string{in, mean}, Outputs: []string{centred}, DocString: "normalize at " + n.Pos.String()})
	out := b.names.unique("normalize")
	b.valueInfo(out, chw)
	b.node(Node{Name: out, OpType: "Div", Inputs: []string{centred, std}, Outputs: []string{out}, DocString: "normalize at " + n.Pos.String()})
	return out, chw, nil
}

// float32Bytes rounds values to float32, little-endian.
func float32Bytes(vals []float64) []byte {
	out := make([]byte, 0, 4*len(vals))
	for _, v := range vals {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(float32(v)))
	}
	return out
}
