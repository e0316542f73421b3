package compiler

import (
	"math"
	"slices"
	"strings"

	"github.com/cnnc/cnnc/compiler/augment"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/dsl"
)

// The data block's augment list: `augment = [random_crop(size=[32,32],
// padding=4), hflip(p=0.5), normalize(mean=[...], std=[...])]`. Each
// call's arguments are checked like an op's; the list's rules (one crop,
// normalize last, sizes that fit the image, one mean and std per channel)
// are errors at the call or argument that breaks them.

var augmentArgs = map[augment.Kind][]argSpec{
	augment.RandomCrop: {
		{Name: "size", Kind: ops.ArgIntPair, Required: true, Min: 1, Doc: "[H, W] of the crop: the model's input"},
		{Name: "padding", Kind: ops.ArgInt, Min: 0, MaxInt: MaxImageSide, MaxWhy: "the trainers read images of at most 16,384 pixels a side", Default: "0", Doc: "zero pixels added on every side first"},
	},
	augment.RandomResizedCrop: {
		{Name: "size", Kind: ops.ArgIntPair, Required: true, Min: 1, Doc: "[H, W] the box is resized to: the model's input"},
		{Name: "scale", Kind: ops.ArgFloatPair, Default: "[0.08, 1.0]", Doc: "range of the box's area, as a fraction of the image's"},
		{Name: "ratio", Kind: ops.ArgFloatPair, Default: "[0.75, 1.3333333333333333]", Doc: "range of the box's aspect ratio w/h (drawn log-uniformly)"},
	},
	augment.HFlip: {
		{Name: "p", Kind: ops.ArgFloat, Min: 0, Default: "0.5", Doc: "probability of mirroring a sample"},
	},
	augment.Normalize: {
		{Name: "mean", Kind: ops.ArgCustom, Required: true, Doc: "one number per channel"},
		{Name: "std", Kind: ops.ArgCustom, Required: true, Doc: "one positive number per channel"},
	},
}

// augmentNames lists the steps by name, sorted, for messages.
func augmentNames() []string {
	var n []string
	for k := range augment.Names {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

// parseAugment checks the augment list against the raw image (h, w, c:
// what the training set's loader delivers) and the model's input; it
// returns nil after an error.
func parseAugment(e *dsl.Expr, raw [3]int64, image ir.Type, diags *dsl.Diagnostics) *augment.Spec {
	if e.Kind != dsl.ExprList {
		*diags = append(*diags, dsl.Errorf(e.Pos, "augment is a list of steps such as [random_crop(size=[32,32], padding=4), hflip(p=0.5)], got %s", describe(e)).Span(exprSpan(e)))
		return nil
	}
	spec := &augment.Spec{H: raw[0], W: raw[1], C: raw[2]}
	if max(spec.H, spec.W) > MaxImageSide {
		*diags = append(*diags, dsl.Errorf(e.Pos, "augment: the training images are %dx%d; the trainers read images of at most %s a side", spec.H, spec.W, Commas(MaxImageSide)).Span(exprSpan(e)))
		return nil
	}
	if image.IsKnown() && len(image.Dims) == 3 {
		spec.OutH, spec.OutW = image.Dims[1], image.Dims[2]
	}
	before := len(*diags)
	var crop, norm *dsl.Call
	flips := 0
	for _, x := range e.List {
		st, c, ok := parseAugmentStep(x, spec, diags)
		if !ok {
			continue
		}
		switch {
		case norm != nil:
			*diags = append(*diags, dsl.Errorf(c.Pos, "augment: %s after normalize (line %d): normalize must be the list's last step", c.Name, norm.Pos.Line).Span(len(c.Name)).
				Hint("torchvision's pipelines normalize last; padding and resampling work on [0,1] pixels"))
			continue
		case st.Kind == augment.RandomCrop || st.Kind == augment.RandomResizedCrop:
			if crop != nil {
				*diags = append(*diags, dsl.Errorf(c.Pos, "augment: a second crop (the first, %s, is at line %d): the list takes one", crop.Name, crop.Pos.Line).Span(len(c.Name)))
				continue
			}
			crop = c
		case st.Kind == augment.HFlip:
			if flips++; flips > 1 {
				*diags = append(*diags, dsl.Errorf(c.Pos, "augment: a second hflip: the list takes one").Span(len(c.Name)))
				continue
			}
		case st.Kind == augment.Normalize:
			norm = c
		}
		spec.Steps = append(spec.Steps, st)
	}
	if len(*diags) > before {
		return nil
	}
	if crop == nil && spec.OutH > 0 && (spec.H != spec.OutH || spec.W != spec.OutW) {
		*diags = append(*diags, dsl.Errorf(e.Pos, "augment: the images are %dx%d but the model's input is %dx%d and the list does not crop", spec.H, spec.W, spec.OutH, spec.OutW).Span(exprSpan(e)))
		return nil
	}
	if spec.OutH == 0 {
		return nil // the model's input is in error already
	}
	return spec
}

// parseAugmentStep checks one call of the list.
func parseAugmentStep(x *dsl.Expr, spec *augment.Spec, diags *dsl.Diagnostics) (augment.Step, *dsl.Call, bool) {
	if x.Kind != dsl.ExprCall {
		*diags = append(*diags, dsl.Errorf(x.Pos, "augment: a step is a call such as hflip(p=0.5), got %s", describe(x)).Span(exprSpan(x)))
		return augment.Step{}, nil, false
	}
	c := x.Call
	kind, ok := augment.Names[c.Name]
	if !ok {
		d := dsl.Errorf(c.Pos, "augment: unknown step %s", c.Name).Span(len(c.Name))
		if s := suggest(c.Name, augmentNames()); s != "" {
			d.Hint("did you mean %s?", s)
		} else {
			d.Hint("steps: %s", strings.Join(augmentNames(), ", "))
		}
		*diags = append(*diags, d)
		return augment.Step{}, c, false
	}
	if p := c.Positional(); len(p) > 0 {
		*diags = append(*diags, dsl.Errorf(p[0].Pos, "%s takes keyword arguments only", c.Name))
		return augment.Step{}, c, false
	}
	before := len(*diags)
	a := checkArgs(c.Name, c, augmentArgs[kind], diags)
	if len(*diags) > before {
		return augment.Step{}, c, false
	}
	st := augment.Step{Kind: kind}
	bad := func(e *dsl.Expr, format string, args ...any) (augment.Step, *dsl.Call, bool) {
		*diags = append(*diags, dsl.Errorf(e.Pos, format, args...).Span(exprSpan(e)))
		return augment.Step{}, c, false
	}
	switch kind {
	case augment.RandomCrop, augment.RandomResizedCrop:
		st.Size = a.Pair("size", 0)
		size := a["size"]
		if spec.OutH > 0 && st.Size != [2]int64{spec.OutH, spec.OutW} {
			return bad(size, "%s: size %dx%d is not the model's input %dx%d", c.Name, st.Size[0], st.Size[1], spec.OutH, spec.OutW)
		}
		if kind == augment.RandomCrop {
			st.Padding = a.Int("padding", 0)
			if hp, wp := spec.H+2*st.Padding, spec.W+2*st.Padding; st.Size[0] > hp || st.Size[1] > wp {
				return bad(size, "random_crop: size %dx%d is larger than the %dx%d images (%dx%d with padding %d)", st.Size[0], st.Size[1], spec.H, spec.W, hp, wp, st.Padding)
			}
			if p := a["padding"]; p != nil && st.Padding > max(spec.H, spec.W) {
				return bad(p, "random_crop: padding %d is more than the %dx%d images' side: a crop could hold no pixel", st.Padding, spec.H, spec.W)
			}
			break
		}
		st.Scale = floatPair(a, "scale", [2]float64{0.08, 1})
		st.Ratio = floatPair(a, "ratio", [2]float64{3.0 / 4, 4.0 / 3})
		if e := a["scale"]; e != nil && !(0 < st.Scale[0] && st.Scale[0] <= st.Scale[1] && st.Scale[1] <= 1) {
			return bad(e, "random_resized_crop: scale must be [lo, hi] with 0 < lo <= hi <= 1, got [%g, %g]", st.Scale[0], st.Scale[1])
		}
		if e := a["ratio"]; e != nil && !(0 < st.Ratio[0] && st.Ratio[0] <= st.Ratio[1]) {
			return bad(e, "random_resized_crop: ratio must be [lo, hi] with 0 < lo <= hi, got [%g, %g]", st.Ratio[0], st.Ratio[1])
		}
	case augment.HFlip:
		st.P = a.Float("p", 0.5)
		if e := a["p"]; e != nil && !(st.P >= 0 && st.P <= 1) {
			return bad(e, "hflip: p must be in [0, 1], got %s", e.Text)
		}
	case augment.Normalize:
		var ok bool
		if st.Mean, ok = channelList(a["mean"], "mean", spec.C, diags); !ok {
			return augment.Step{}, c, false
		}
		if st.Std, ok = channelList(a["std"], "std", spec.C, diags); !ok {
			return augment.Step{}, c, false
		}
		for i, s := range st.Std {
			if !(s > 0) || float32(s) == 0 {
				return bad(a["std"].List[i], "normalize: std of channel %d must be positive, got %s (it divides)", i, a["std"].List[i].Text)
			}
		}
	}
	return st, c, true
}

func floatPair(a args, k string, def [2]float64) [2]float64 {
	if e := a[k]; e != nil {
		return [2]float64{ops.Number(e.List[0]), ops.Number(e.List[1])}
	}
	return def
}

// channelList reads normalize's mean or std: one finite number per channel.
func channelList(e *dsl.Expr, name string, channels int64, diags *dsl.Diagnostics) ([]float64, bool) {
	if e.Kind != dsl.ExprList {
		*diags = append(*diags, dsl.Errorf(e.Pos, "normalize: %s must be a list of numbers, one per channel, got %s", name, describe(e)).Span(exprSpan(e)))
		return nil, false
	}
	if int64(len(e.List)) != channels {
		*diags = append(*diags, dsl.Errorf(e.Pos, "normalize: %s has %d values but the images have %d channel(s)", name, len(e.List), channels).Span(exprSpan(e)))
		return nil, false
	}
	var out []float64
	for _, x := range e.List {
		if x.Kind != dsl.ExprInt && x.Kind != dsl.ExprFloat {
			*diags = append(*diags, dsl.Errorf(x.Pos, "normalize: %s must be numbers, got %s", name, describe(x)).Span(exprSpan(x)))
			return nil, false
		}
		v := ops.Number(x)
		if math.IsInf(v, 0) || math.IsNaN(v) || math.Abs(v) > math.MaxFloat32 {
			*diags = append(*diags, dsl.Errorf(x.Pos, "normalize: %s %s is beyond float32's range", name, x.Text).Span(exprSpan(x)))
			return nil, false
		}
		out = append(out, v)
	}
	return out, true
}
