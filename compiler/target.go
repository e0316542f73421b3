package compiler

import "github.com/cnnc/cnnc/dsl"

// What a generated trainer (cnnc build, cnnc gen) needs beyond the
// language: its data loaders and its Spec read images of 1 (grayscale) or
// 3 (RGB) channels, at most MaxImageSide pixels a side. The compiler and
// its tests run other models (two-channel kernels tests, say); cnnc's
// commands check these too, so that `cnnc check` refuses at the line what
// `cnnc build` would refuse.

// MaxImageSide is the largest image height or width the trainers' data
// loaders read.
const MaxImageSide = 1 << 14

// CheckTrainable reports, at the model's input, what a generated trainer
// cannot run.
func CheckTrainable(res *Result) dsl.Diagnostics {
	var ds dsl.Diagnostics
	m := res.File.Model
	for _, in := range m.Inputs {
		if in.Type != "f32" || len(in.Dims) != 3 {
			continue
		}
		var dims [3]int64 // as written: the fuse pass makes the graph's input u8 [H,W,C]
		for j, d := range in.Dims {
			dims[j] = d.Int
		}
		if c := dims[0]; c != 1 && c != 3 {
			ds = append(ds, dsl.Errorf(in.Dims[0].Pos, "input %s has %d channels; the trainers read images with 1 (grayscale) or 3 (RGB)", in.Name, c).
				Span(exprSpan(in.Dims[0])))
		}
		for j, what := range []string{"height", "width"} {
			if d := dims[1+j]; d > MaxImageSide {
				ds = append(ds, dsl.Errorf(in.Dims[1+j].Pos, "input %s: a %s of %s pixels; the trainers read images of at most %s a side", in.Name, what, Commas(d), Commas(MaxImageSide)).
					Span(exprSpan(in.Dims[1+j])))
			}
		}
	}
	return ds
}
