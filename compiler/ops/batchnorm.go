package ops

import (
	"fmt"
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// batchnorm2d(x, momentum=0.1, eps=1e-5, affine=true) over maps [C,H,W]
// and batchnorm1d over features [F]: PyTorch's nn.BatchNorm2d and
// nn.BatchNorm1d, with their state_dict — NAME.weight and NAME.bias
// (affine), buffers NAME.running_mean, NAME.running_var and
// NAME.num_batches_tracked (int64).
//
// A call lowers to two nodes (DSL.Expand):
//
//	mean, invstd = batchnorm_stats(x, running_mean, running_var, num_batches_tracked)
//	y            = batchnorm2d(x, mean, invstd, weight?, bias?)   y = (x-mean)·invstd·weight + bias
//
// In training, batchnorm_stats computes the batch's per-channel mean and
// biased variance, invstd = 1/sqrt(var+eps), and updates the running
// statistics in place — running = (1-momentum)·running + momentum·batch,
// the variance unbiased, n/(n-1), n the values per channel — and counts the
// batch; in evaluation its outputs are the running statistics and nothing
// changes. The statistics node writes buffers, so the planner never
// recomputes it (ir.OpInfo.Mutates): a recomputed normalisation reuses the
// saved batch statistics and is bit-identical. Both it and the gradient
// read the whole batch (BatchCoupled): the planner never puts them in a
// micro-batch loop. The gradient (batchnorm_grad) differentiates through
// the statistics as PyTorch's does:
//
//	dx = invstd·(g - mean(g) - x̂·mean(g·x̂)),  g = dy·weight, x̂ = (x-mean)·invstd
//	dweight = Σ dy·x̂,  dbias = Σ dy
//
// The fuse pass folds a ReLU that is the normalisation's only reader into
// it (Attrs.ReLU, printed relu=true): y = max((x-mean)·invstd·weight +
// bias, 0) in one elementwise kernel, the output named after the ReLU. Its
// gradient is the standalone ReLU's: the mask y > 0, applied by the
// reader's input-gradient epilogue (maskout) when it can take it, else by
// a relu_grad kernel before batchnorm_grad.
//
// It folds any other pointwise activation f (activation.go: leaky_relu,
// sigmoid, tanh, gelu, silu, hardswish) the same way (Attrs.Act, printed
// act=NAME, with slope=... for leaky_relu): y = f(z), z = (x-mean)·invstd·
// weight + bias, in the one kernel, the activation's own formula. Its
// gradient saves nothing more than batch norm's: batchnorm_grad (act=NAME;
// it reads bias too when affine) recomputes z from x, the statistics,
// weight and bias, takes dz = dy·f'(z) — the activation's gradient formula,
// through f(z) where that reads the output — and differentiates batch norm
// with dz. Unfused, z (or f(z)) would be saved for the activation's
// gradient beside x.
//
// A max-pool after a batchnorm2d (and its folded activation), its only
// reader, folds in too (Attrs.Pool, printed pool=max(...), as the conv
// block's: compiler/fuse.go): y is the pool of f(z) — the same maxima and
// first-maximum ties as the conv block's (maxpoolArgmax) — and a training
// graph's normalisation also writes the packed argmax (ir.ArgmaxType; no
// argmax in forward-only graphs: printed argmax=false). The
// full-resolution normalised values never exist: saved are x, the
// statistics, the pooled y and the argmax. batchnorm_grad (pool=...) then
// reads the pooled dy and the argmax (its last input) and routes dy to
// full resolution as it loads it — a position's is the sum of the pooled
// dy of the windows whose argmax names it, overlapping windows included —
// before f'(z) and batch norm's own backward. A folded ReLU's mask is the
// pooled y > 0 (max and ReLU commute: the ReLU's derivative at each
// argmax), applied to the pooled dy by the reader's maskout epilogue or a
// relu_grad on the pooled values, as unpooled.
//
// The fuse pass has a conv block whose output only a batch norm reads (in
// training) write the statistics' partials in its epilogue (Attrs.BNStats,
// printed bnstats=true): per tile p of the block (at most BNChunk outputs:
// BNChunk consecutive batch-major values, or an output region of one or
// several samples — BNTiling; the target picks it) and channel c, the
// tile's valid values' (samples below the step's valid count) mean and M2 (sum of squared deviations: no sum of squares cancels)
// at part[(p·C + c)·2 + {0, 1}] (BNPartialsType; tiles with no valid value
// hold zeros). batchnorm_stats then takes them as a fifth input and merges
// the cells in order with Chan's update, each with its tile's count
// (BNTiling.Count: the tiling and the valid samples give it, so no stored
// count is trusted and the merge's work is data-independent), instead of
// reading x again (x stays its first input: its
// shape, and the normalisation reads it next anyway). The reference
// computes the statistics from x either way, and the conv block's
// partials flat-tiled unless RefEnv.BNTiles names the target's tiling
// (BNMergePartials is the merge's float64 form, for the kernels' tests);
// a block the planner puts in a micro-batch
// loop writes no partials, and the targets' statistics then read x. An
// unfused conv2d (grouped, depthwise or dilated: the direct kernels)
// whose output only a batch norm reads does the same (conv2d.go; its
// CUDA kernel's cells are flat chunks).
//
// A padded last batch (fewer valid samples than the compiled batch) is
// normalised over the valid samples only, and its padding gets no
// gradient. Unlike PyTorch, which refuses a batch of one value per channel
// in training, such a batch (a last batch of one sample through
// batchnorm1d) updates the running variance with the biased variance, 0.

var (
	attrEps      = ir.AttrSpec{Name: "eps", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Eps) }}
	attrMomentum = ir.AttrSpec{Name: "momentum", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Momentum) }}
	// affine is the blocks' Bias flag: batch norm learns weight and bias
	attrAffine = ir.AttrSpec{Name: "affine", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Bias) }}
	// relu: the fuse pass folded the ReLU after the normalisation into it
	attrFusedReLU = ir.AttrSpec{Name: "relu", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.ReLU) },
		Default: func(a *ir.Attrs) bool { return !a.ReLU }}
	// act: the fuse pass folded this pointwise activation after the
	// normalisation into it; slope is leaky_relu's
	attrFusedAct = ir.AttrSpec{Name: "act", Text: func(a *ir.Attrs) string { return a.Act.String() },
		Default: func(a *ir.Attrs) bool { return a.Act == 0 }}
	attrFusedSlope = ir.AttrSpec{Name: "slope", Text: func(a *ir.Attrs) string { return fmt.Sprint(a.Alpha) },
		Default: func(a *ir.Attrs) bool { return a.Act != LeakyReLU }}
	// pool: the fuse pass folded the max-pool after the normalisation (and
	// its activation) into it; printed only then
	attrFusedPool = ir.AttrSpec{Name: "pool", Text: ir.AttrPool.Text, Default: func(a *ir.Attrs) bool { return a.Pool == nil }}
)

var BatchNormStats = New(&Def{
	OpInfo: ir.OpInfo{
		Name: "batchnorm_stats", Attrs: []ir.AttrSpec{attrEps, attrMomentum}, Infer: inferBNStats, FLOPs: flopsBNStats,
		ParamTypes: bnParamTypes, BatchCoupled: true, Mutates: func(*ir.Node) []int { return []int{1, 2, 3} },
	},
	Doc:    "a batch norm's per-channel statistics (the batch's in training, updating the running ones; the running ones in evaluation)",
	NoGrad: "differentiated by batchnorm_grad, which the batch norm reading the statistics emits",
	Ref:    refBNStats,
	Kernel: Kernel{Custom: "batchnorm"},
	// evaluation's statistics are the running ones, which the exported
	// BatchNormalization reads itself: nothing to emit
	ONNX: &ONNX{Emit: func(ONNXEmitter, *ir.Node) error { return nil }},
})

var BatchNorm2D = New(bnDef("batchnorm2d", 3, 90, "nn.BatchNorm2d", "`[C,H,W]` -> same shape, normalised per channel over the batch and the map"))

var BatchNorm1D = New(bnDef("batchnorm1d", 1, 91, "nn.BatchNorm1d", "`[F]` -> same shape, normalised per feature over the batch"))

var BatchNormGrad = New(&Def{
	OpInfo: ir.OpInfo{
		Name: "batchnorm_grad", Attrs: []ir.AttrSpec{attrAffine, attrFusedAct, attrFusedSlope, attrFusedPool}, Infer: inferBNGrad, FLOPs: flopsBNGrad,
		BatchCoupled: true,
	},
	Doc:    "a batch norm's input, weight and bias gradients, through the batch statistics",
	NoGrad: "a gradient op",
	Ref:    refBNGrad,
	Kernel: Kernel{Custom: "batchnorm"},
})

// bnDef is the definition of batchnorm2d or batchnorm1d: the normalisation
// node a call lowers to, after its statistics.
func bnDef(name string, rank, order int, torch, shape string) *Def {
	features := rank == 1
	examples := []string{name + "(x)", name + "(x, momentum=0.3, eps=0.001)", name + "(x, affine=false)"}
	tc := []string{
		"F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.1, eps=1e-5)",
		"F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.3, eps=0.001)",
		"F.batch_norm(x, running_mean, running_var, None, None, training=True, momentum=0.1, eps=1e-5)",
	}
	kernel := BNApplyKernel
	if !features {
		// the pooled normalisation (Attrs.Pool) is codegen's batchnorm
		// family; the plain one its elementwise kernel (BNApplyKernel)
		kernel = Kernel{Custom: "batchnorm"}
	}
	return &Def{
		OpInfo: ir.OpInfo{
			Name: name, Attrs: []ir.AttrSpec{attrFusedReLU, attrFusedAct, attrFusedSlope, attrFusedPool, ir.AttrArgmax}, Infer: inferBN(rank), FLOPs: flopsBNApply, ParamTypes: bnParamTypes, InPlace: bnInPlace,
		},
		Doc: "batch normalisation",
		DSL: &DSL{
			Name: name, Order: order, Tensors: 1, Features: features,
			Args: []ArgSpec{
				{Name: "momentum", Kind: ArgFloat, Min: 0, Default: "0.1", Note: "at most 1; PyTorch's momentum=None (a cumulative average) is not offered", Doc: "weight of the batch in the running statistics"},
				{Name: "eps", Kind: ArgFloat, Positive: true, Default: "1e-5", Doc: "added to the variance"},
				{Name: "affine", Kind: ArgBool, Default: "true", Doc: "learn a per-channel weight and bias"},
			},
			Attrs: func(a Args) (ir.Attrs, error) {
				at := ir.Attrs{Momentum: a.Float("momentum", 0.1), Eps: a.Float("eps", 1e-5), Bias: a.Bool("affine", true)}
				if at.Momentum > 1 {
					return at, &ArgError{Arg: "momentum", Msg: fmt.Sprintf("momentum must be at most 1 (the batch's weight in the running statistics), got %g", at.Momentum)}
				}
				return at, nil
			},
			Params: func(a Args) []ParamSpec {
				if !a.Bool("affine", true) {
					return nil
				}
				return []ParamSpec{{Suffix: "weight", Init: ir.InitOnes}, {Suffix: "bias", Init: ir.InitZeros}}
			},
			Buffers: func(Args) []ParamSpec {
				return []ParamSpec{{Suffix: "running_mean", Init: ir.InitZeros}, {Suffix: "running_var", Init: ir.InitOnes},
					{Suffix: "num_batches_tracked", Init: ir.InitZeros}}
			},
			Expand:   expandBN,
			Shape:    shape,
			ParamDoc: "`weight [C]`, `bias [C]` (affine); buffers `running_mean [C]`, `running_var [C]`, `num_batches_tracked` (int64)",
			PyTorch:  torch,
			Examples: examples,
			Torch:    tc,
		},
		Grad:   bnGrad,
		Ref:    refBNApply,
		Kernel: kernel,
		ONNX:   &ONNX{Emit: emitBN},
	}
}

// BNApplyKernel is the unpooled normalisation's elementwise kernel
// (batchnorm1d's binding; codegen's batchnorm2d rule uses it when the node
// has no pool).
var BNApplyKernel = Kernel{Elementwise: "batchnorm_apply", Data: func(n *ir.Node) map[string]any {
	c, s := bnGeom(n.Ins[0].Type)
	return map[string]any{"C": c, "S": s, "Affine": len(n.Ins) == 5, "ReLU": n.Attrs.ReLU, "Act": BNActKernel(&n.Attrs)}
}, Consts: BNActConsts, Suffix: func(n *ir.Node) string {
	s := "plain"
	if len(n.Ins) == 5 {
		s = "affine"
	}
	if n.Attrs.ReLU {
		s += "_relu"
	}
	if a := BNActKernel(&n.Attrs); a != "" {
		s += "_" + a
	}
	return s
}}

// bnInPlace: the unpooled normalisation may overwrite x; a pooled one
// writes a smaller output other threads' windows still read x under.
func bnInPlace(n *ir.Node) []int {
	if n.Attrs.Pool != nil {
		return nil
	}
	return inPlace0(n)
}

// expandBN puts the statistics node before the normalisation node n, whose
// inputs lowering gave as x, weight?, bias?, running_mean, running_var,
// num_batches_tracked.
func expandBN(n *ir.Node, g *ir.Graph) []*ir.Node {
	k := len(n.Ins) - 3
	x, params, buffers := n.Ins[0], n.Ins[1:k], n.Ins[k:]
	name := n.Out().Name
	stats := g.NewNode(BatchNormStats, n.Name, ir.Forward, n.Pos, append([]*ir.Value{x}, buffers...),
		[]string{name + ".mean", name + ".invstd"}, ir.RoleActivation)
	stats.Attrs = n.Attrs
	n.Ins = append([]*ir.Value{x, stats.Outs[0], stats.Outs[1]}, params...)
	return []*ir.Node{stats, n}
}

// BNActKernel is the kernel family of the activation folded into a batch
// norm or its gradient (Attrs.Act; "" for none): the targets' formulas are
// that family's.
func BNActKernel(a *ir.Attrs) string {
	if p := PointwiseOf(a.Act); p != nil {
		return p.Fwd.Kernel.Elementwise
	}
	return ""
}

// BNActConsts are the folded activation's kernel constants (leaky_relu's
// slope), as its own kernels take them.
func BNActConsts(a *ir.Attrs) []Const {
	if p := PointwiseOf(a.Act); p != nil && p.Fwd.Kernel.Consts != nil {
		return p.Fwd.Kernel.Consts(a)
	}
	return nil
}

// bnGrad emits batchnorm_grad: dx (always), and the parameters' gradients.
// The statistics get none: this rule differentiates through them. A
// folded ReLU's mask comes first, as the standalone ReLU's rule applies it;
// a folded activation's derivative is batchnorm_grad's own (act), from z
// recomputed — it reads the bias for that. With a folded pool, dy is the
// pooled output's gradient (the ReLU mask, pooled y > 0, is the mask at
// each argmax: max and ReLU commute) and batchnorm_grad also reads the
// argmax (its last input), routing dy to full resolution as it loads it.
func bnGrad(b GradBuilder, n *ir.Node, dy *ir.Value, _ []bool) []*ir.Value {
	x := n.Ins[0]
	if n.Attrs.ReLU && !b.Marked(maskedKey, n.Out()) {
		// the normalised values' gradient, named as the unfused graph names it
		dy = b.Node(ir.OpReLUGrad, n, ir.Attrs{}, []*ir.Value{dy, n.Out()}, []string{n.Name + ".grad"}, ir.RoleActGrad).Out()
	}
	affine := len(n.Ins) == 5
	ins := []*ir.Value{dy, x, n.Ins[1], n.Ins[2]}
	outs := []string{x.Name + ".grad"}
	if affine {
		ins = append(ins, n.Ins[3])
		outs = append(outs, n.Ins[3].Name+".grad", n.Ins[4].Name+".grad")
	}
	ga := ir.Attrs{Bias: affine, Act: n.Attrs.Act, Alpha: n.Attrs.Alpha, Pool: n.Attrs.Pool}
	if ga.Act != 0 && affine {
		ins = append(ins, n.Ins[4])
	}
	if ga.Pool != nil {
		ins = append(ins, n.Outs[1]) // the argmax: dy is the pooled output's gradient
	}
	gn := b.Node(BatchNormGrad, n, ga, ins, outs, ir.RoleActGrad)
	gs := make([]*ir.Value, len(n.Ins))
	gs[0] = gn.Outs[0]
	if affine {
		for i, p := range n.Ins[3:5] {
			v := gn.Outs[1+i]
			v.Role, v.Param = ir.RoleGrad, p.Param
			gs[3+i] = v
		}
	}
	return gs
}

// bnGeom: a [C,...] type's channels and values per channel per sample.
func bnGeom(t ir.Type) (c, s int64) {
	return t.Dims[0], t.SampleElems() / t.Dims[0]
}

func channelType(x ir.Type) ir.Type { return ir.F32Fixed(x.Dims[0]) }

func bnParamTypes(n *ir.Node) (map[string]ir.Type, int64, bool) {
	x := n.Ins[0].Type
	if x.DType != ir.F32 || len(x.Dims) == 0 {
		return nil, 0, false
	}
	c := channelType(x)
	return map[string]ir.Type{"weight": c, "bias": c, "running_mean": c, "running_var": c,
		"num_batches_tracked": {DType: ir.I64}}, 0, true
}

func inferBNStats(n *ir.Node) ([]ir.Type, error) {
	x := in(n, 0)
	if x.DType != ir.F32 || !x.Batched || (len(x.Dims) != 3 && len(x.Dims) != 1) {
		return nil, fmt.Errorf("batchnorm_stats needs [B,C,H,W] or [B,F], but %s is %s", n.Ins[0].Name, x)
	}
	c := channelType(x)
	if (len(n.Ins) != 4 && len(n.Ins) != 5) || !in(n, 1).Equal(c) || !in(n, 2).Equal(c) || !in(n, 3).Equal(ir.Type{DType: ir.I64}) {
		return nil, fmt.Errorf("batchnorm_stats takes x, running_mean and running_var %s, num_batches_tracked i64[], and optionally x's partials", c)
	}
	if len(n.Ins) == 5 && (len(x.Dims) != 3 || !in(n, 4).Equal(BNPartialsType(x))) {
		return nil, fmt.Errorf("batchnorm_stats: partials %s are %s, want %s", n.Ins[4].Name, in(n, 4), BNPartialsType(x))
	}
	return []ir.Type{c, c}, nil
}

// BNChunk is the values of a channel one statistics partial covers at
// most: the conv forward kernels' column tile (codegen's tileFor and
// regionTile), so that a tile's epilogue writes its own cell.
const BNChunk = 64

// BNCell is the floats of one statistics partial: (mean, M2); its count
// follows from its tile (BNTiling.Count), so no reader trusts a stored one.
const BNCell = 2

// BNTiling is how a conv block's tiles cover its output, which decides the
// cells of its statistics partials: one cell a tile and channel. Flat
// (RH = 0): tile p holds positions p·BNChunk.. of the channel's
// batch-major B·S values. Regions: tile p holds the RH x RW output region
// p mod TilesPerSample (row-major over TilesW regions a row) of each of
// the NS samples from ⌊p / TilesPerSample⌋·NS. Tiles(batch) cells a
// channel.
type BNTiling struct {
	RH, RW, NS, TilesW, TilesPerSample int64
}

// Tiles is the tiles a batch of samples of [C,H,W] outputs (s = H·W
// values a channel) takes.
func (t BNTiling) Tiles(batch, s int64) int64 {
	if t.RH == 0 {
		return (batch*s + BNChunk - 1) / BNChunk
	}
	return (batch + t.NS - 1) / t.NS * t.TilesPerSample
}

// Count is the valid values of tile p of an [h,w] map's channel when the
// first valid samples count: what the tile's cell merges.
func (t BNTiling) Count(p, valid, h, w int64) int64 {
	if t.RH == 0 {
		return max(0, min(BNChunk, valid*h*w-p*BNChunk))
	}
	b0, r := p/t.TilesPerSample*t.NS, p%t.TilesPerSample
	y0, x0 := r/t.TilesW*t.RH, r%t.TilesW*t.RW
	return max(0, min(t.NS, valid-b0)) * (min(y0+t.RH, h) - y0) * (min(x0+t.RW, w) - x0)
}

// BNCellsPerSample bounds the cells a sample of an [h,w] map (s = h·w
// values) can take over any tiling the conv kernels use: flat chunks take
// at most ⌈s/BNChunk⌉ a sample, regions at most those of full-width bands
// of ⌊BNChunk/w⌋ rows, which codegen's regionTile never exceeds (it picks
// the fewest tiles, and the bands are one of its candidates); codegen
// checks the bound and writes no partials where it fails.
func BNCellsPerSample(h, w int64) int64 {
	rw := min(w, BNChunk)
	return max((h*w+BNChunk-1)/BNChunk, (h+BNChunk/rw-1)/(BNChunk/rw)*((w+rw-1)/rw))
}

// BNPartialsType is the type of the statistics' partials of a [B,C,H,W]
// value x: BNCellsPerSample·C cells of (mean, M2) a sample, so that at any
// batch the buffer holds every tile's cells, tile-major:
// part[(p·C + c)·2 + {0, 1}]; the floats past the tiles' are zero.
func BNPartialsType(x ir.Type) ir.Type {
	c := x.Dims[0]
	return ir.F32Batched(c, BNCellsPerSample(x.Dims[1], x.Dims[2]), BNCell)
}

// BNPartials is the float64 reference of the partials of x ([batch,C,H,W],
// of which the first valid samples count) tiled as t: per tile and channel
// the mean and M2 (two-pass) of the tile's valid values, in
// BNPartialsType's layout (elems floats; a tile without a valid value
// holds (0, 0)).
func BNPartials(x []float64, batch, valid int, c, h, w int64, t BNTiling, elems int) []float64 {
	s := h * w
	part := make([]float64, elems)
	tiles := t.Tiles(int64(batch), s)
	for p := int64(0); p < tiles; p++ {
		var at []int64 // the tile's valid values, as offsets of channel 0's
		if t.RH == 0 {
			for j := p * BNChunk; j < min((p+1)*BNChunk, int64(valid)*s); j++ {
				at = append(at, (j/s*c)*s+j%s)
			}
		} else {
			b0, r := p/t.TilesPerSample*t.NS, p%t.TilesPerSample
			y0, x0 := r/t.TilesW*t.RH, r%t.TilesW*t.RW
			for b := b0; b < min(b0+t.NS, int64(valid)); b++ {
				for oy := y0; oy < min(y0+t.RH, h); oy++ {
					for ox := x0; ox < min(x0+t.RW, w); ox++ {
						at = append(at, b*c*s+oy*w+ox)
					}
				}
			}
		}
		if len(at) == 0 {
			continue
		}
		for ch := int64(0); ch < c; ch++ {
			sum := 0.0
			for _, i := range at {
				sum += x[i+ch*s]
			}
			mu, m2 := sum/float64(len(at)), 0.0
			for _, i := range at {
				m2 += (x[i+ch*s] - mu) * (x[i+ch*s] - mu)
			}
			cell := (p*c + ch) * BNCell
			part[cell], part[cell+1] = mu, m2
		}
	}
	return part
}

// BNMergePartials merges channel ch's cells of part (BNPartials' layout,
// tiled as t over a batch of [c,h,w] maps of which valid count) in order
// with Chan's update, each cell's count from its tile: the mean and
// biased variance of the valid values.
func BNMergePartials(part []float64, t BNTiling, batch, valid, c, h, w, ch int64) (mean, variance float64) {
	var n, mu, q float64
	for p := int64(0); p < t.Tiles(batch, h*w); p++ {
		nb := float64(t.Count(p, valid, h, w))
		if nb == 0 {
			continue
		}
		cell := (p*c + ch) * BNCell
		mb, qb := part[cell], part[cell+1]
		tn := n + nb
		d := mb - mu
		mu += d * nb / tn
		q += qb + d*d*n*nb/tn
		n = tn
	}
	return mu, q / n
}

func inferBN(rank int) func(n *ir.Node) ([]ir.Type, error) {
	layout := "[B,C,H,W]"
	if rank == 1 {
		layout = "[B,features]"
	}
	return func(n *ir.Node) ([]ir.Type, error) {
		x := in(n, 0)
		if err := needRank(n, 0, x, rank, layout); err != nil {
			if rank == 1 && x.DType == ir.F32 && x.Batched && len(x.Dims) == 3 {
				return nil, fmt.Errorf("batchnorm1d normalises features [B,F], but %s is %s: batchnorm2d normalises maps", n.Ins[0].Name, x)
			}
			if rank == 3 && x.DType == ir.F32 && x.Batched && len(x.Dims) == 1 {
				return nil, fmt.Errorf("batchnorm2d normalises maps [B,C,H,W], but %s is %s: batchnorm1d normalises features", n.Ins[0].Name, x)
			}
			return nil, err
		}
		c := channelType(x)
		if len(n.Ins) != 3 && len(n.Ins) != 5 {
			return nil, fmt.Errorf("%s takes x, mean, invstd and optionally weight and bias, got %d inputs", n.Op, len(n.Ins))
		}
		for _, v := range n.Ins[1:] {
			if !v.Type.Equal(c) {
				return nil, fmt.Errorf("%s: %s is %s, want %s", n.Op, v.Name, v.Type, c)
			}
		}
		if n.Attrs.Pool == nil {
			return []ir.Type{x}, nil
		}
		if rank != 3 {
			return nil, fmt.Errorf("%s: only batchnorm2d pools", n.Op)
		}
		y, am, err := bnPoolTypes(n.Attrs.Pool, x)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", n.Op, err)
		}
		if n.Attrs.NoArgmax {
			return []ir.Type{y}, nil // a forward-only graph: no backward reads the argmax
		}
		return []ir.Type{y, am}, nil
	}
}

// bnPoolTypes are the pooled output and argmax types of a batch norm of
// the [B,C,H,W] value x with the max-pool pw folded in.
func bnPoolTypes(pw *ir.Window, x ir.Type) (y, argmax ir.Type, err error) {
	pool := &ir.Node{Op: ir.OpMaxPool2D, Attrs: ir.Attrs{Kernel: pw.Kernel, Stride: pw.Stride, Pad: pw.Pad}, Ins: []*ir.Value{stub("x", x)}}
	ps, err := inferPool(pool)
	if err != nil {
		return ir.Type{}, ir.Type{}, err
	}
	return ps[0], ir.ArgmaxType(pw.Kernel[0]*pw.Kernel[1], ps[0].Dims...), nil
}

func inferBNGrad(n *ir.Node) ([]ir.Type, error) {
	want := 4
	if n.Attrs.Bias {
		want = 5
		if n.Attrs.Act != 0 {
			want = 6 // the bias, for z
		}
	}
	if n.Attrs.Pool != nil {
		want++ // the argmax
	}
	if len(n.Ins) != want {
		return nil, fmt.Errorf("batchnorm_grad takes %d inputs, got %d", want, len(n.Ins))
	}
	dy, x := in(n, 0), in(n, 1)
	params := n.Ins[2:]
	wantDy := x
	if pw := n.Attrs.Pool; pw != nil {
		if x.DType != ir.F32 || !x.Batched || len(x.Dims) != 3 {
			return nil, fmt.Errorf("batchnorm_grad: a pooled batch norm's input %s is %s, want [B,C,H,W]", n.Ins[1].Name, x)
		}
		y, am, err := bnPoolTypes(pw, x)
		if err != nil {
			return nil, fmt.Errorf("batchnorm_grad: %v", err)
		}
		if !in(n, len(n.Ins)-1).Equal(am) {
			return nil, fmt.Errorf("batchnorm_grad: argmax %s is %s, want %s", n.Ins[len(n.Ins)-1].Name, in(n, len(n.Ins)-1), am)
		}
		wantDy, params = y, n.Ins[2:len(n.Ins)-1]
	}
	if !dy.Equal(wantDy) || x.DType != ir.F32 || !x.Batched || len(x.Dims) == 0 {
		return nil, fmt.Errorf("batchnorm_grad: gradient %s is %s but the input %s is %s", n.Ins[0].Name, dy, n.Ins[1].Name, x)
	}
	c := channelType(x)
	for _, v := range params {
		if !v.Type.Equal(c) {
			return nil, fmt.Errorf("batchnorm_grad: %s is %s, want %s", v.Name, v.Type, c)
		}
	}
	if n.Attrs.Bias {
		return []ir.Type{x, c, c}, nil
	}
	return []ir.Type{x}, nil
}

// flopsBNStats: the mean (a sum), the variance (difference, square, sum),
// per element.
func flopsBNStats(n *ir.Node) int64 { return ir.MulSat(4, n.Ins[0].Type.SampleElems()) }

// flopsBNApply: subtract, two multiplies and an add per normalised value,
// and the folded ReLU's max or the folded activation's own count; a folded
// pool compares its window per pooled output (the conv block's count).
func flopsBNApply(n *ir.Node) int64 {
	k := int64(4)
	if n.Attrs.ReLU {
		k++
	}
	x := n.Ins[0].Type
	f := ir.MulSat(k, x.SampleElems())
	if p := PointwiseOf(n.Attrs.Act); p != nil {
		full := n
		if n.Attrs.Pool != nil { // the activation runs at full resolution
			full = &ir.Node{Op: n.Op, Attrs: n.Attrs, Ins: n.Ins, Outs: []*ir.Value{stub("z", x)}}
		}
		f += p.Fwd.FLOPs(full)
	}
	if pw := n.Attrs.Pool; pw != nil {
		f = ir.AddSat(f, ir.MulSat(n.Outs[0].Type.SampleElems(), pw.Kernel[0], pw.Kernel[1]))
	}
	return f
}

// flopsBNGrad: batch norm's ten per input value; with a folded activation,
// z again (four), its f where the derivative reads the output, and the
// activation's gradient.
func flopsBNGrad(n *ir.Node) int64 {
	f := ir.MulSat(10, n.Ins[1].Type.SampleElems()) // per value of x (dy is pooled with a folded pool)
	if p := PointwiseOf(n.Attrs.Act); p != nil {
		f += ir.MulSat(4, n.Ins[1].Type.SampleElems()) + p.Grad.FLOPs(n)
		if p.SaveOutput {
			f += p.Fwd.FLOPs(n)
		}
	}
	return f
}

func flopsPerInput0(k int64) func(*ir.Node) int64 {
	return func(n *ir.Node) int64 { return ir.MulSat(k, n.Ins[0].Type.SampleElems()) }
}

// bnValues visits channel c's values of a [B,C,S] tensor in order.
func bnValues(b, c, s int, ch int, visit func(i int)) {
	for k := 0; k < b; k++ {
		for j := 0; j < s; j++ {
			visit((k*c+ch)*s + j)
		}
	}
}

func refBNStats(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	x, rm, rv, nbt := ins[0], ins[1], ins[2], ins[3]
	c64, s64 := bnGeom(n.Ins[0].Type)
	c, s := int(c64), int(s64)
	mean, invstd := make([]float64, c), make([]float64, c)
	eps, m := n.Attrs.Eps, n.Attrs.Momentum
	if !env.Training {
		for ch := range mean {
			mean[ch], invstd[ch] = rm[ch], 1/math.Sqrt(rv[ch]+eps)
		}
		return [][]float64{mean, invstd}
	}
	count := float64(env.Batch * s)
	for ch := 0; ch < c; ch++ {
		// from x also with a conv block's partials (a fifth input): they
		// are the same statistics, and x is the truth the kernels' merge
		// is checked against (a block in a micro-batch loop writes none)
		sum := 0.0
		bnValues(env.Batch, c, s, ch, func(i int) { sum += x[i] })
		mu := sum / count
		sq := 0.0
		bnValues(env.Batch, c, s, ch, func(i int) { sq += (x[i] - mu) * (x[i] - mu) })
		v := sq / count
		mean[ch], invstd[ch] = mu, 1/math.Sqrt(v+eps)
		if env.Update {
			unbiased := v
			if count > 1 {
				unbiased = v * count / (count - 1)
			}
			rm[ch] = (1-m)*rm[ch] + m*mu
			rv[ch] = (1-m)*rv[ch] + m*unbiased
		}
	}
	if env.Update {
		nbt[0]++
	}
	return [][]float64{mean, invstd}
}

func refBNApply(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	x, mean, invstd := ins[0], ins[1], ins[2]
	c64, s64 := bnGeom(n.Ins[0].Type)
	c, s := int(c64), int(s64)
	y := make([]float64, len(x))
	for i, v := range x {
		ch := (i / s) % c
		y[i] = (v - mean[ch]) * invstd[ch]
		if len(ins) == 5 {
			y[i] = y[i]*ins[3][ch] + ins[4][ch]
		}
		if n.Attrs.ReLU {
			y[i] = math.Max(y[i], 0)
		}
	}
	if p := PointwiseOf(n.Attrs.Act); p != nil {
		y = p.F(env, n, y)
	}
	if pw := n.Attrs.Pool; pw != nil {
		// the conv block's pool: the same maxima and first-maximum ties
		pooled, argmax, _ := maxpoolArgmax(env, pw, n.Ins[0].Type, y)
		if n.Attrs.NoArgmax {
			return [][]float64{pooled}
		}
		return [][]float64{pooled, argmax}
	}
	return [][]float64{y}
}

// bnZ is the normalised x before a folded activation: (x-mean)·invstd,
// then ·weight + bias when wb holds them.
func bnZ(x, mean, invstd []float64, wb [][]float64, c, s int) []float64 {
	z := make([]float64, len(x))
	for i, v := range x {
		ch := (i / s) % c
		z[i] = (v - mean[ch]) * invstd[ch]
		if len(wb) == 2 {
			z[i] = z[i]*wb[0][ch] + wb[1][ch]
		}
	}
	return z
}

func refBNGrad(env *RefEnv, n *ir.Node, ins [][]float64) [][]float64 {
	dy, x, mean, invstd := ins[0], ins[1], ins[2], ins[3]
	c64, s64 := bnGeom(n.Ins[1].Type)
	c, s := int(c64), int(s64)
	affine := n.Attrs.Bias
	wb := ins[4:]
	if pw := n.Attrs.Pool; pw != nil {
		// the pooled dy to full resolution through the argmax (the last input)
		wb = ins[4 : len(ins)-1]
		dy = unpoolArgmax(env, pw, n.Ins[1].Type, dy, ins[len(ins)-1])
	}
	if p := PointwiseOf(n.Attrs.Act); p != nil {
		dy = p.DX(env, n, dy, bnZ(x, mean, invstd, wb, c, s))
	}
	dx, dw, db := make([]float64, len(x)), make([]float64, c), make([]float64, c)
	count := float64(env.Batch * s)
	for ch := 0; ch < c; ch++ {
		w := 1.0
		if affine {
			w = ins[4][ch]
		}
		xhat := func(i int) float64 { return (x[i] - mean[ch]) * invstd[ch] }
		var sg, sgx float64
		bnValues(env.Batch, c, s, ch, func(i int) {
			sg += dy[i] * w
			sgx += dy[i] * w * xhat(i)
			dw[ch] += dy[i] * xhat(i)
			db[ch] += dy[i]
		})
		bnValues(env.Batch, c, s, ch, func(i int) {
			if env.Training {
				dx[i] = invstd[ch] * (dy[i]*w - sg/count - xhat(i)*sgx/count)
			} else {
				dx[i] = dy[i] * w * invstd[ch] // the statistics are constants
			}
		})
	}
	if affine {
		return [][]float64{dx, dw, db}
	}
	return [][]float64{dx}
}

// emitBN exports evaluation: BatchNormalization(x, scale, bias, running
// mean, running variance) with the statistics node's buffers (scale 1 and
// bias 0 as constants without affine); the statistics node itself emits
// nothing.
func emitBN(e ONNXEmitter, n *ir.Node) error {
	stats := n.Ins[1].Def
	if stats == nil || stats.Op != BatchNormStats {
		return fmt.Errorf("%s reads statistics no batchnorm_stats computed", n.Op)
	}
	c := n.Ins[0].Type.Dims[0]
	var scale, bias string
	if len(n.Ins) == 5 {
		scale, bias = e.Name(n.Ins[3]), e.Name(n.Ins[4])
	} else {
		ones, zeros := make([]float32, c), make([]float32, c)
		for i := range ones {
			ones[i] = 1
		}
		scale, bias = e.Const(n.Name+".scale", []int64{c}, ones), e.Const(n.Name+".shift", []int64{c}, zeros)
	}
	ins := []string{e.Name(n.Ins[0]), scale, bias, e.Name(stats.Ins[1]), e.Name(stats.Ins[2])}
	e.Node("BatchNormalization", ins, []string{e.Output(n.Out())}, FloatAttr("epsilon", stats.Attrs.Eps))
	return nil
}
