package compiler

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/units"
)

// Limits that depend on the batch. Every count a training step reaches —
// the elements of a tensor, the bytes of all its tensors, its FLOPs, the
// blocks of a kernel's grid — must stay within what the planner's int64
// sums and CUDA's grids hold, so a batch that breaks one is an error at
// the layer that breaks it (not a wrapped, negative size later).
// BatchLimit gives the largest batch a graph allows; the planner's
// largest-batch search stays within it.

const (
	// MaxStepBytes bounds the bytes of all of a step's tensors together
	// (1.13 PB): no device comes near, and every sum the planner forms
	// stays far from overflowing.
	MaxStepBytes = 1 << 50
	// MaxStepFLOPs bounds one training step's FLOPs (1.15e18: hours of a
	// whole GPU for a single step).
	MaxStepFLOPs = 1 << 60
	// maxGridBlocks is CUDA's limit on a grid's x dimension; conv kernels
	// launch a block per tile of an image plane for each sample.
	maxGridBlocks = 1<<31 - 1
)

// batchBound is one limit: the largest batch it allows, where it comes
// from, and what it says at a batch above that.
type batchBound struct {
	max  int64
	pos  dsl.Pos
	span int
	what func(batch int64) string
}

// batchBounds lists g's limits. g is a typed graph (after the shapes
// pass); the autodiff graph holds every tensor and FLOP of a step.
func batchBounds(g *ir.Graph) []batchBound {
	bounds := []batchBound{{max: MaxBatch, what: func(b int64) string {
		return fmt.Sprintf("batch %s is more than cnnc compiles for (%s)", Commas(b), Commas(MaxBatch))
	}}}
	var biggest *ir.Value // the batched tensor with the most elements per sample
	var perSampleBytes, fixedBytes int64
	values := append([]*ir.Value{}, g.Inputs...)
	for _, p := range g.Params {
		values = append(values, p.Value)
	}
	values = append(values, g.State...)
	for _, n := range g.Nodes {
		values = append(values, n.Outs...)
	}
	for _, v := range values {
		if !v.Type.IsKnown() {
			continue
		}
		if !v.Type.Batched {
			fixedBytes = ir.AddSat(fixedBytes, v.Type.Bytes(1))
			continue
		}
		perSampleBytes = ir.AddSat(perSampleBytes, v.Type.Bytes(1))
		if biggest == nil || v.Type.SampleElems() > biggest.Type.SampleElems() {
			biggest = v
		}
	}
	if biggest != nil {
		v := biggest
		bounds = append(bounds, batchBound{max: ir.MaxElems / max(v.Type.SampleElems(), 1), pos: v.Pos, span: len(v.Name), what: func(b int64) string {
			return fmt.Sprintf("at batch %s, %s would be %s: more than 2^40 elements (%s as f32), which no GPU holds",
				Commas(b), v.Name, v.Type.ShapeStringAt(b), units.FormatBytes(ir.MulSat(4, ir.MaxElems)))
		}})
		bounds = append(bounds, batchBound{max: max(MaxStepBytes-fixedBytes, 0) / max(perSampleBytes, 1), pos: v.Pos, span: len(v.Name), what: func(b int64) string {
			return fmt.Sprintf("at batch %s, one training step's tensors add up to %s, more than cnnc plans for (%s); %s is the largest",
				Commas(b), units.FormatBytes(ir.AddSat(fixedBytes, ir.MulSat(perSampleBytes, b))), units.FormatBytes(MaxStepBytes), v.Name)
		}})
	}
	var perSampleFLOPs, fixedFLOPs int64
	var costliest *ir.Node
	for _, n := range g.Nodes {
		f := n.FLOPs(1)
		if !n.IsBatched() {
			fixedFLOPs = ir.AddSat(fixedFLOPs, f)
			continue
		}
		perSampleFLOPs = ir.AddSat(perSampleFLOPs, f)
		if costliest == nil || f > costliest.FLOPs(1) {
			costliest = n
		}
	}
	if costliest != nil {
		n := costliest
		bounds = append(bounds, batchBound{max: max(MaxStepFLOPs-fixedFLOPs, 0) / max(perSampleFLOPs, 1), pos: n.Pos, span: len(n.Op.String()), what: func(b int64) string {
			return fmt.Sprintf("at batch %s, one training step needs %s FLOPs, more than cnnc counts (2^60 = %.3g); %s needs the most",
				Commas(b), humanCount(ir.AddSat(fixedFLOPs, ir.MulSat(perSampleFLOPs, b))), float64(MaxStepFLOPs), n.Name)
		}})
	}
	for _, n := range g.Nodes {
		if n.Op != ir.OpConv2D || !n.Ins[0].Type.IsKnown() || !n.Out().Type.IsKnown() {
			continue
		}
		x, y, s := n.Ins[0].Type.Dims, n.Out().Type.Dims, n.Attrs.Stride
		// the forward kernels tile the output planes, the input gradient's
		// the input's in stride phases: at most a block per pixel of either
		planes := max(ir.MulSat(y[1], y[2]), ir.MulSat(x[1]+s[0]-1, x[2]+s[1]-1))
		bounds = append(bounds, batchBound{max: maxGridBlocks / max(planes, 1), pos: n.Pos, span: len(n.Op.String()), what: func(b int64) string {
			return fmt.Sprintf("at batch %s, %s's kernels could launch up to %s blocks in one grid dimension, more than CUDA allows (%s)",
				Commas(b), n.Name, Commas(ir.MulSat(b, planes)), Commas(maxGridBlocks))
		}})
	}
	return bounds
}

// BatchLimit is the largest batch g's training step may have (at most
// MaxBatch).
func BatchLimit(g *ir.Graph) int64 {
	limit := int64(math.MaxInt64)
	for _, b := range batchBounds(g) {
		limit = min(limit, b.max)
	}
	return max(limit, 0)
}

// checkBatch reports the tightest limit batch breaks, at its layer, and
// where the batch was set.
func checkBatch(g *ir.Graph, batch int64, train TrainConfig, source string, model dsl.Pos) *dsl.Diagnostic {
	var tight *batchBound
	limit := int64(math.MaxInt64)
	for _, b := range batchBounds(g) {
		limit = min(limit, b.max)
		if batch > b.max && (tight == nil || b.max < tight.max) {
			tight = &b
		}
	}
	if tight == nil {
		return nil
	}
	pos, span := tight.pos, tight.span
	if !pos.IsValid() {
		pos, span = model, len("model")
	}
	d := dsl.Errorf(pos, "%s", tight.what(batch)).Span(span)
	switch {
	case source != "":
		d.Hint("the batch comes from %s", source)
	case train.Pos["batch"].IsValid():
		d.Hint("the batch is set at %s", train.Pos["batch"])
	default:
		d.Hint("the batch is the default, %d", DefaultBatch)
	}
	if limit >= 1 {
		d.Hint("the largest batch this model allows is %s", Commas(limit))
	} else {
		d.Hint("not even one sample fits these limits: shrink the model")
	}
	return d
}

// humanCount prints a large count with an SI prefix: 1.23e+18 -> "1.23E".
func humanCount(n int64) string {
	x := float64(n)
	for _, p := range []struct {
		v float64
		s string
	}{{1e18, "E"}, {1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}} {
		if x >= p.v {
			return fmt.Sprintf("%.2f%s", x/p.v, p.s)
		}
	}
	return fmt.Sprint(n)
}
