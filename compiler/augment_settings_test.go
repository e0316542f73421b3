package compiler

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/dsl"
)

// augModel is a 3x32x32 model whose data block holds data (a `data { ... }` body).
func augModel(data string) string {
	return header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = imagefolder(\"d\", resize=[36,36])\n" + data + "}\n"
}

// Every misuse of the augment list is an error at its call or argument (line 7 holds the list).
func TestAugmentErrors(t *testing.T) {
	for _, c := range []struct{ name, list, want string }{
		{"not a list", `hflip()`, "m.cnn:7:13: augment is a list of steps"},
		{"not a call", `[hflip, 3]`, "m.cnn:7:14: augment: a step is a call such as hflip(p=0.5), got the name hflip"},
		{"unknown step", `[hflop()]`, "m.cnn:7:14: augment: unknown step hflop"},
		{"suggestion", `[hflop()]`, "did you mean hflip?"},
		{"unknown argument", `[hflip(q=0.5)]`, "m.cnn:7:20: hflip has no argument \"q\""},
		{"positional", `[hflip(0.5)]`, "m.cnn:7:20: hflip takes keyword arguments only"},
		{"p above 1", `[hflip(p=1.5)]`, "m.cnn:7:22: hflip: p must be in [0, 1], got 1.5"},
		{"p negative", `[hflip(p=-0.1)]`, "m.cnn:7:22: hflip: p must be at least 0"},
		{"crop not the model's input", `[random_crop(size=[30,30])]`, "m.cnn:7:31: random_crop: size 30x30 is not the model's input 32x32"},
		{"crop beyond padding", `[random_crop(size=[32,32], padding=-1)]`, "m.cnn:7:48: random_crop: padding must be at least 0, got -1"},
		{"crop size missing", `[random_crop(padding=4)]`, "m.cnn:7:14: random_crop needs size=..."},
		{"two crops", `[random_crop(size=32), random_resized_crop(size=32)]`, "m.cnn:7:36: augment: a second crop (the first, random_crop, is at line 7)"},
		{"two flips", `[hflip(), hflip()]`, "m.cnn:7:23: augment: a second hflip"},
		{"normalize not last", `[random_crop(size=32), normalize(mean=[0,0,0], std=[1,1,1]), hflip()]`, "m.cnn:7:74: augment: hflip after normalize (line 7): normalize must be the list's last step"},
		{"mean length", `[random_crop(size=32), normalize(mean=[0.5], std=[1,1,1])]`, "m.cnn:7:51: normalize: mean has 1 values but the images have 3 channel(s)"},
		{"std length", `[random_crop(size=32), normalize(mean=[0,0,0], std=[1,1])]`, "m.cnn:7:64: normalize: std has 2 values but the images have 3 channel(s)"},
		{"std zero", `[random_crop(size=32), normalize(mean=[0,0,0], std=[1,0,1])]`, "m.cnn:7:67: normalize: std of channel 1 must be positive, got 0 (it divides)"},
		{"std negative", `[random_crop(size=32), normalize(mean=[0,0,0], std=[1,1,-2])]`, "m.cnn:7:69: normalize: std of channel 2 must be positive, got -2"},
		{"mean not numbers", `[random_crop(size=32), normalize(mean=["a",0,0], std=[1,1,1])]`, "m.cnn:7:52: normalize: mean must be numbers, got a string"},
		{"scale range", `[random_resized_crop(size=32, scale=[0.9, 0.5])]`, "m.cnn:7:49: random_resized_crop: scale must be [lo, hi] with 0 < lo <= hi <= 1, got [0.9, 0.5]"},
		{"scale above 1", `[random_resized_crop(size=32, scale=[0.5, 1.5])]`, "scale must be [lo, hi] with 0 < lo <= hi <= 1"},
		{"ratio", `[random_resized_crop(size=32, ratio=[0, 1])]`, "m.cnn:7:49: random_resized_crop: ratio must be [lo, hi] with 0 < lo <= hi, got [0, 1]"},
		{"no crop, other size", `[hflip()]`, "m.cnn:6:35: imagefolder resizes to 36x36 but the model's input is 32x32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := augModel("  augment = " + c.list + "\n")
			_, err := CompileSource("m.cnn", []byte(src), Options{})
			require.Error(t, err)
			var ds dsl.Diagnostics
			require.ErrorAs(t, err, &ds)
			assert.Contains(t, ds.RenderAll(map[string][]byte{"m.cnn": []byte(src)}), c.want)
		})
	}
}

// A crop larger than the padded image (torchvision: "Required crop size is larger than input
// image size") and test images of another size than the training images.
func TestAugmentSizeErrors(t *testing.T) {
	small := header + "  f = linear(flatten(image), out=10)\n  loss = cross_entropy(f, label)\n}\ndata {\n  train = imagefolder(\"d\", resize=[28,30])\n  test = imagefolder(\"t\", resize=[36,36])\n  augment = [random_crop(size=[32,32], padding=1)]\n}\n"
	_, err := CompileSource("m.cnn", []byte(small), Options{})
	require.Error(t, err)
	out := err.(dsl.Diagnostics).RenderAll(map[string][]byte{"m.cnn": []byte(small)})
	assert.Contains(t, out, "m.cnn:8:31: random_crop: size 32x32 is larger than the 28x30 images (30x32 with padding 1)")
	assert.Contains(t, out, "m.cnn:7:10: the test images are 36x36 but the training images 28x30")
}

// The list as the compiler hands it on: steps, raw and output sizes; the fuse pass gives it to
// the image's readers and loads the image at the raw size.
func TestAugmentSpec(t *testing.T) {
	src := augModel("  augment = [random_crop(size=[32,32], padding=4), hflip(), normalize(mean=[0.485,0.456,0.406], std=[0.229,0.224,0.225])]\n")
	src = src[:len(src)-len("}\n")] + "  test = imagefolder(\"t\", resize=[36,36])\n}\n"
	res, err := CompileSource("m.cnn", []byte(src), Options{})
	require.NoError(t, err)
	s := res.Data.Augment
	require.NotNil(t, s)
	assert.Equal(t, [5]int64{36, 36, 3, 32, 32}, [5]int64{s.H, s.W, s.C, s.OutH, s.OutW})
	require.Len(t, s.Steps, 3)
	assert.Equal(t, augment.Step{Kind: augment.RandomCrop, Size: [2]int64{32, 32}, Padding: 4}, s.Steps[0])
	assert.Equal(t, 0.5, s.Steps[1].P)
	assert.Equal(t, []float64{0.229, 0.224, 0.225}, s.Steps[2].Std)
	assert.Equal(t, []int64{36, 36, 3}, res.Graph.Inputs[0].Type.Dims, "the loader delivers the crop's input")
	readers := 0
	for _, n := range res.Graph.Nodes {
		if n.Attrs.Aug != nil {
			readers++
			assert.Same(t, s, n.Attrs.Aug)
		}
	}
	assert.Equal(t, 1, readers, "to_tensor, for the linear layer")
	// random_resized_crop's defaults are torchvision's
	res, err = CompileSource("m.cnn", []byte(augModel("  augment = [random_resized_crop(size=32)]\n")), Options{})
	require.NoError(t, err)
	assert.Equal(t, [2]float64{0.08, 1}, res.Data.Augment.Steps[0].Scale)
	assert.Equal(t, [2]float64{3.0 / 4, 4.0 / 3}, res.Data.Augment.Steps[0].Ratio)
}
