package planexec

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
)

// compileFile compiles a model (fused, every pass verified).
func compileFile(t *testing.T, path string, opts compiler.Options) *compiler.Result {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	opts.AfterPass = func(pass string, g *ir.Graph) error { return g.Verify() }
	res, err := compiler.CompileSource(path, src, opts)
	require.NoError(t, err)
	return res
}

func pixelBatch(g *ir.Graph, n int64, rng *rand.Rand) reference.Batch {
	img := g.Inputs[0].Type
	b := reference.Batch{N: int(n), Pixels: make([]uint8, n*img.SampleElems()), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.Int64N(g.Logits.Type.Dims[0]))
	}
	return b
}

// step runs the same batches through the reference (on the unplanned
// graph) and through the plan, and returns both sides' parameters and
// state after them.
type run struct {
	ref    *reference.Executor
	got    *Runner
	losses [][2]float64
}

func runBoth(t *testing.T, g *ir.Graph, p *plan.Plan, kind Kind, steps int) run {
	t.Helper()
	ref := reference.New(g, 11)
	got, err := New(p, kind, ref)
	require.NoError(t, err)
	if kind == Arena {
		require.Len(t, got.arena, int(p.ArenaBytes), "the arena is exactly the planned size")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	r := run{ref: ref, got: got}
	for s := 0; s < steps; s++ {
		b := pixelBatch(g, p.Batch, rng)
		want, err := ref.Run(b, reference.Train)
		require.NoError(t, err)
		have, err := got.Run(b)
		require.NoError(t, err)
		r.losses = append(r.losses, [2]float64{want.Loss, have.Loss})
		assert.Equal(t, want.Correct, have.Correct, "step %d correct count", s)
	}
	return r
}

// maxRelDiff is the largest |a-b| relative to the tensor's largest
// magnitude (elementwise relative error is meaningless near zero).
func maxRelDiff(a, b []float64) float64 {
	scale, worst := 1e-300, 0.0
	for i := range a {
		scale = math.Max(scale, math.Max(math.Abs(a[i]), math.Abs(b[i])))
		worst = math.Max(worst, math.Abs(a[i]-b[i]))
	}
	return worst / scale
}

func (r run) compare(t *testing.T, tol float64) {
	t.Helper()
	for i, l := range r.losses {
		assert.False(t, math.IsNaN(l[1]), "step %d loss is NaN", i)
		assert.InDelta(t, l[0], l[1], tol*math.Abs(l[0])+1e-300, "step %d loss", i)
	}
	params, state := r.got.Params(), r.got.State()
	for _, p := range r.ref.G.Buffers { // batch norm's running statistics
		got := params[p.Name]
		require.NotNil(t, got, p.Name)
		assert.LessOrEqual(t, maxRelDiff(r.ref.Params[p], got), tol, p.Name)
	}
	for _, p := range r.ref.G.Params {
		got := params[p.Name]
		require.NotNil(t, got, p.Name)
		assert.LessOrEqual(t, maxRelDiff(r.ref.Params[p], got), tol, p.Name)
		for _, s := range p.State {
			assert.LessOrEqual(t, maxRelDiff(r.ref.State[s], state[s.Name]), tol, s.Name)
		}
	}
}

func (r run) identical(t *testing.T) {
	t.Helper()
	for i, l := range r.losses {
		assert.Equal(t, math.Float64bits(l[0]), math.Float64bits(l[1]), "step %d loss %v vs %v", i, l[0], l[1])
	}
	params := r.got.Params()
	for _, p := range append(append([]*ir.Param{}, r.ref.G.Params...), r.ref.G.Buffers...) {
		assert.True(t, sameBits(r.ref.Params[p], params[p.Name]), "%s differs (max rel %g)", p.Name, maxRelDiff(r.ref.Params[p], params[p.Name]))
	}
}

type planCase struct {
	name, path string
	cfg        func(base *plan.Plan) plan.Config
	strategy   string
}

// budgets below the unconstrained peak force recomputation, then
// micro-batching; forced loops cover both loop shapes.
var planCases = []planCase{
	{"small fits", "../testdata/small.cnn", func(*plan.Plan) plan.Config { return plan.Config{} }, "fits"},
	{"small recompute", "../testdata/small.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes - 1} }, "recompute"},
	{"small trunk", "../testdata/small.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes - 4000} }, "micro-batch"},
	{"small whole step", "../testdata/small.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 3} }, "micro-batch"},
	{"deep recompute", "../testdata/deep.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes * 9 / 10} }, "recompute"},
	{"deep trunk", "../testdata/deep.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 4, Trunk: "c4"} }, "micro-batch"},
	{"dropout fits", "../testdata/dropout.cnn", func(*plan.Plan) plan.Config { return plan.Config{} }, "fits"},
	{"dropout recompute", "../testdata/dropout.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes - 1} }, "recompute"},
	{"dropout trunk", "../testdata/dropout.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 4, Trunk: "c2"} }, "micro-batch"},
	{"dropout whole step", "../testdata/dropout.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 4} }, "micro-batch"},
	{"residual fits", "../../testdata/residual.cnn", func(*plan.Plan) plan.Config { return plan.Config{} }, "fits"},
	{"dag recompute", "../testdata/dag.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes * 99 / 100} }, "recompute"},
	{"dag trunk", "../testdata/dag.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes * 9 / 10} }, "micro-batch"},
	{"residual whole step", "../../testdata/residual.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 2} }, "micro-batch"},
	{"residual trunk", "../../testdata/residual.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 2, Trunk: "sum"} }, "micro-batch"},
	{"mnist", "../../../examples/mnist.cnn", func(*plan.Plan) plan.Config { return plan.Config{Batch: 5} }, "fits"},
	// batch norm: its statistics are never recomputed (the running ones
	// would move twice) and no loop crosses it; the layers before it may
	// run in micro-batches
	{"bn fits", "../testdata/bn.cnn", func(*plan.Plan) plan.Config { return plan.Config{} }, "fits"},
	// (bn.cnn's hardswish folds into its batch norm: nothing there is worth
	// recomputing; bnact.cnn's folded activations are recomputed)
	{"bn recompute", "../testdata/bnact.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes - 1} }, "recompute"},
	{"bn trunk", "../testdata/bn.cnn", func(*plan.Plan) plan.Config { return plan.Config{MicroBatch: 2, Trunk: "c1"} }, "micro-batch"},
	// batch norm's normalisation and the activations after it recomputed
	// from the saved conv outputs and statistics, with no budget (cheap
	// recomputation) and under one
	{"bn relu fits", "../testdata/bnrelu.cnn", func(*plan.Plan) plan.Config { return plan.Config{} }, "fits"},
	{"bn relu recompute", "../testdata/bnrelu.cnn", func(p *plan.Plan) plan.Config { return plan.Config{Budget: p.ArenaBytes - 1} }, "recompute"},
}

func buildCase(t *testing.T, c planCase, opts compiler.Options) (*ir.Graph, *plan.Plan) {
	t.Helper()
	res := compileFile(t, c.path, opts)
	// budgets are set below the plan that recomputes nothing
	base, err := plan.Build(res.Graph, plan.Config{Batch: res.Train.Batch, NoRecompute: true})
	require.NoError(t, err)
	cfg := c.cfg(base)
	if cfg.Batch == 0 {
		cfg.Batch = res.Train.Batch
	}
	p, err := plan.Build(res.Graph, cfg)
	require.NoError(t, err)
	require.Equal(t, c.strategy, p.Choices.Strategy, "choices: %+v", p.Choices)
	if cfg.Budget > 0 {
		require.LessOrEqual(t, p.PeakBytes, cfg.Budget)
	}
	return res.Graph, p
}

// The arena test: the planned step runs in one byte arena of exactly
// Plan.ArenaBytes, every buffer at its planned offset, fp32 storage,
// argmax packed, each buffer poisoned when it becomes live — and matches
// the float64 reference's unplanned step within fp32 rounding. Any
// overlap of live buffers, any missing byte, any read of an unwritten
// value would show.
func TestArenaEqualsPlan(t *testing.T) {
	for _, c := range planCases {
		t.Run(c.name, func(t *testing.T) {
			g, p := buildCase(t, c, compiler.Options{})
			assert.Equal(t, p.ArenaBytes, p.PeakBytes)
			r := runBoth(t, g, p, Arena, 3)
			r.compare(t, 2e-5)
		})
	}
}

// The arena test on the unfused graph too (the planner takes any verified
// training graph: unfused updates are scheduled early, elementwise ops
// run in place).
func TestArenaEqualsPlanUnfused(t *testing.T) {
	for _, c := range []planCase{planCases[0], planCases[11], planCases[14]} {
		t.Run(c.name, func(t *testing.T) {
			g, p := buildCase(t, c, compiler.Options{Disable: []string{"fuse"}})
			r := runBoth(t, g, p, Arena, 2)
			r.compare(t, 2e-5)
		})
	}
}

// Recomputation is exact: each recomputed activation equals the forward
// pass's bit for bit (deterministic kernels; dropout masks from a
// counter-based RNG), and a plan that recomputes ends the steps with
// exactly the parameters of the unplanned reference step.
func TestRecomputeIsBitIdentical(t *testing.T) {
	for _, c := range planCases {
		if c.strategy == "micro-batch" {
			continue // a loop's updates differ from the batch's by rounding
		}
		t.Run(c.name, func(t *testing.T) {
			g, p := buildCase(t, c, compiler.Options{})
			if c.strategy != "recompute" && len(p.Choices.Recompute) == 0 {
				t.Skip("nothing recomputed")
			}
			require.NotEmpty(t, p.Choices.Recompute)
			require.Positive(t, p.ExtraFLOPs)
			r := runBoth(t, g, p, Float64, 3)
			assert.Positive(t, r.got.Recomputed)
			assert.Empty(t, r.got.Mismatches)
			r.identical(t)
		})
	}
}

// Micro-batching gives the full batch's update: the micro-batches'
// gradients (losses averaged over the whole batch) add up to the full
// batch's, on the float64 reference, for the trunk and the whole step,
// with dropout inside the loop.
func TestMicroBatchEqualsFullBatch(t *testing.T) {
	for _, c := range planCases {
		if c.strategy != "micro-batch" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			g, p := buildCase(t, c, compiler.Options{})
			require.NotEmpty(t, p.Loops)
			require.Less(t, p.Choices.MicroBatch, p.Batch)
			r := runBoth(t, g, p, Float64, 3)
			assert.Empty(t, r.got.Mismatches, "the trunk's recomputation is exact")
			r.compare(t, 1e-12)
		})
	}
}
