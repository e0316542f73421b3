package onnx_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/export/onnx"
)

// The data block's augment list exports its deterministic part, what the trainer's evaluation
// does: a center crop (here of an image taller and narrower than the model's input: padded with
// zero rows above and below, cropped left and right) then normalize. ONNX Runtime on raw ToTensor
// images gives the reference's logits on the same images cropped and normalized in float32 as
// torchvision's CenterCrop and Normalize (exact copies, then TestNormalizeInONNXRuntime's
// arithmetic).
func TestAugmentPreprocessInONNXRuntime(t *testing.T) {
	m := models[2] // allops: 3 channels
	res := forward(t, m.path)
	g := res.Graph
	chw := g.Inputs[0].Type.Dims
	spec := &augment.Spec{H: chw[1] - 3, W: chw[2] + 4, C: chw[0], OutH: chw[1], OutW: chw[2], Steps: []augment.Step{
		{Kind: augment.RandomCrop, Size: [2]int64{chw[1], chw[2]}, Padding: 2}, {Kind: augment.HFlip, P: 0.5},
		{Kind: augment.Normalize, Mean: []float64{0.485, 0.456, 0.406}, Std: []float64{0.229, 0.224, 0.225}}}}
	steps := onnx.PreprocessFor(compiler.DataConfig{Augment: spec})
	require.Len(t, steps, 2, "center crop, normalize; hflip is training's only")
	node, mods := requireORT(t)
	dir := t.TempDir()
	ck := trainCheckpoint(t, m)
	path, model := exportFile(t, res, ck, dir, "augmented", onnx.Options{Preprocess: steps})
	var ops []string
	for _, n := range model.Graph.Nodes[:7] {
		ops = append(ops, n.OpType)
	}
	assert.Equal(t, []string{"Constant", "Pad", "Constant", "Constant", "Constant", "Slice", "Sub"}, ops)
	raw := []int64{chw[0], spec.H, spec.W}
	n := 8
	px, _ := dataset(rand.New(rand.NewPCG(7, 8)), n, raw, g.Logits.Type.Dims[0])
	x := toTensor(px) // CHW: dataset's pixels are the model input's layout
	box := spec.Eval()
	norm := spec.Norm()
	c, h, w := int(chw[0]), int(chw[1]), int(chw[2])
	prepared := make([]float64, n*c*h*w)
	for b := range n {
		for ch := range c {
			for y := range h {
				for xx := range w {
					ry, rx := int(box.Top)+y, int(box.Left)+xx
					var v float32
					if ry >= 0 && ry < int(spec.H) && rx >= 0 && rx < int(spec.W) {
						v = x[((b*c+ch)*int(spec.H)+ry)*int(spec.W)+rx]
					}
					v = (v - float32(norm.Mean[ch])) / float32(norm.Std[ch])
					prepared[((b*c+ch)*h+y)*w+xx] = float64(v)
				}
			}
		}
	}
	got := runORT(t, node, mods, path, x, n, raw)
	checkAgainstAnalysis(t, "augmented", referenceEval(t, g, ck, prepared, n), got)
}
