package cpu_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/torchtest"
	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// f32Twin is an example model trained on the CPU target beside its PyTorch twin in float32: the
// batch (small: the test's time), the steps cnnc takes before the shared checkpoint (so that the
// momentum and batch norm's running statistics are not their initial values) and the steps
// compared after it.
type f32Twin struct {
	file, model          string
	batch, before, after int
}

// f32TwinLR is TestExamplesFloat32InPyTorch's learning rate (see there).
const f32TwinLR = 0.005

var f32Twins = []f32Twin{
	{"vgg_small.cnn", "vgg_small", 4, 1, 3},             // batch norm, max-pool, dropout
	{"mobilenet_small.cnn", "mobilenet_small", 4, 1, 3}, // batch norm, depthwise (grouped) convs, hardswish
	// Not resnet18: at every batch its float32 steps meet relu ties, which no rounding
	// bound covers (TestExamplesFloat32InPyTorch's last point)
}

// Float32 training on the CPU target against PyTorch's float32 training of the same model
// (scripts/torch_examples.py, dtype float32): from one checkpoint that cnnc wrote (parameters,
// batch norm's buffers, momentum), both take the same SGD steps (momentum, weight decay: the
// models' optimizers) on the same random batches, dropout keeping the elements cnnc's
// counter-based masks keep (ops.DropoutKeep, handed to the twin). Every step's loss, and after
// the last step every parameter, running mean and variance and momentum buffer, must agree
// within a bound from float32 error analysis; num_batches_tracked exactly.
//
// The bound, the same model as TestStepsMatchEmulator's (u = 2^-24, relative to each tensor's
// largest magnitude, the loss to itself):
//
//   - One float32 reduction of K terms, in whatever order and blocking (cnnc's tiles and
//     lane sums, its FMAs; PyTorch's oneDNN convolutions, MKL GEMMs, batch norm statistics
//     accumulated in double), errs by about sqrt(K)·u relative to its terms' root sum of
//     squares: the rounding errors have random sign and add as a random walk; 4 standard
//     deviations give 4·sqrt(K)·u. Two implementations differ by at most the sum of both:
//     8·sqrt(K)·u. An elementwise op (batch norm's apply, hardswish, relu, the adds, the loss's
//     exp and log, the optimizer's products) rounds a few times: K = 1, counted like a
//     reduction (PyTorch's hardswish x·relu6(x+3)/6 and cnnc's rounding in another order are
//     each within a few u).
//   - Along a step the errors of every node add, each tensor's error at most the sum over the
//     nodes before it: 8·u·S, S = Σ sqrt(K) over the step's nodes (reductionSum: K a node's
//     FLOPs over twice the elements it writes). vgg_small at batch 4: S = 739 (its longest
//     reductions conv2's weight gradient over 4·32·32 = 4,096 positions and fc1's 2,048
//     inputs), 3.5e-4 a step; mobilenet_small at batch 4: S = 583, 2.8e-4 (the test logs
//     each S).
//   - Over N steps the differences accumulate, each step's update being lr times a gradient
//     that differs by that much relative: N·8·u·S after N steps, the loss of step s (0-based)
//     within s+1 steps' worth — provided a parameter difference does not grow through the next
//     gradient, i.e. lr·|∇g| ≪ 1 (∇g the gradient's derivative). At the models' own rates
//     (0.05, 0.1) on random batches of 2-4 that fails: the loss jumps to 10-20 within two steps
//     and the runs diverge chaotically (resnet18's batch norm biases then differed by 2.7e-3
//     against a bound of 2.3e-3). So the test trains at f32TwinLR = 0.005 on both sides, where
//     the trajectories stay close. The rate only scales the updates: the momentum buffers
//     (the gradients themselves, summed) and the running statistics, compared relative to
//     their own magnitudes, keep the test's power over every backward and forward kernel.
//   - Batch norm divides by the batch's standard deviation σ: an error relative to its input's
//     magnitude grows by (|mean| + σ)/σ in its output. The bound assumes that factor is small
//     (|mean| ≲ σ, as in these two models at batch 4: their measured differences, 4.3e-6 and
//     5.4e-6, are 150-250 times under the bound).
//
// A relu, max-pool or hardswish input within that error of its kink (a tie) could route one
// gradient element differently in one of the two; at batch 4 with errors near 1e-7 relative
// that is improbable (measured errors stay far below the bound: see the log), though not
// impossible: vgg_small's third batch here, at the checkpoint's parameters, has one (bn3's
// output at [2,10,9,10]: 5.2e-7 in PyTorch's float64, -2.2e-6 in its float32; where this test
// passes, cnnc and PyTorch agree on its sign, and another machine's rounding could split
// them). A wrong kernel moves values by far more: hardswish's gradient slope made 1e-3 too
// small (v/3.003 for v/3 in cnnc_cpu.h's HardSwishF, a throwaway check) failed mobilenet_small
// at bn0.bias, 3.7e-3 against a bound of 8.3e-4.
//
// ResNet-18 is left out (issue #12; its float64 steps are TestExamplesInPyTorch's) because its
// ties are not improbable at any batch. Measured with PyTorch alone, float32 against float64
// from this test's own checkpoint and batches (seed 7, one step before) at batch 2, 4, 8, 16:
//   - Batch norm is not the trouble: (|mean| + σ)/σ, per channel in float64, is at most 5.3 over
//     its 20 batch norms (bn1, on the image conv; 1.5-2.4 typical) at every one of those
//     batches, and on other random batches at batch 2 that met no tie the momentum buffers
//     differed by only 3.6e-6 of their largest after two steps.
//   - Its 17 relus take 1.1 million inputs a step at batch 2 (4.5 million at batch 8), enough
//     that a few lie within float32's rounding of zero: one step from the same float32 state
//     flipped 1, 2, 1 and 10 relu elements. A flip drops one full-size term from the gradient
//     sums of K = samples·positions terms below it, about 1/sqrt(K) of their magnitude (K = 512
//     for l2_0's 16x16 maps at batch 2: 4.4%): the momentum buffers differed by 4.2%, 2.3%, 3.0%
//     and 8.1% of their largest after that step, against this test's bounds of 1.1e-3, 1.3e-3,
//     1.5e-3 and 1.9e-3 a step (S = 2,389, 2,742, 3,240, 3,944); and the parameters that step
//     moved apart flip up to 24 elements of each relu in the next (131 at batch 16): 28%, 19%,
//     17% and 20% after two steps.
//   - A larger batch adds ties in proportion to its inputs, while each tie's effect falls only
//     as 1/sqrt(K), so no batch is well-conditioned (16 already flips ten; by that estimate one
//     tie on layer4's 4x4 maps falls under 2e-3 only at K = 250,000, a batch of 15,600).
//     Comparing ResNet-18 in float32 needs either cnnc's relu decisions handed to the twin (as
//     its dropout masks are) or a bound that counts the inputs that may flip and what each may
//     move (scripts/f32_error_bound.py's flips, which has no batch norm or residual rules yet).
func TestExamplesFloat32InPyTorch(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two models' float32 steps on the CPU target and in PyTorch (about a minute with the kernels cached)")
	}
	torchtest.Require(t)
	for _, tw := range f32Twins {
		t.Run(tw.model, func(t *testing.T) { float32AgreesWithTwin(t, tw) })
	}
}

func float32AgreesWithTwin(t *testing.T, tw f32Twin) {
	start := time.Now()
	src, err := os.ReadFile("../../examples/" + tw.file)
	require.NoError(t, err)
	batch := int64(tw.batch)
	res, err := compiler.CompileSource(tw.file, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	const seed = 7
	perStep := 8 * math.Ldexp(1, -24) * reductionSum(res.Graph, batch)
	sess := trainerOn(t, res, driver.CPU, seed)
	sess.LR = f32TwinLR
	sp := sess.Spec
	compiled := time.Since(start)

	rng := rand.New(rand.NewPCG(seed, uint64(tw.batch)))
	randomBatch := func() trainer.Batch { return trainertest.RandomBatch(sp, tw.batch, rng) }
	for range tw.before {
		_, _, err := sess.TrainStep(randomBatch())
		require.NoError(t, err)
	}
	ck := filepath.Join(t.TempDir(), "ck.safetensors")
	require.NoError(t, sess.Save(ck, nil))

	var losses []float32
	var batches []map[string]any
	masks := map[string][][]int{}
	for range tw.after {
		b := randomBatch()
		for _, n := range dropoutNodes(res.Graph) {
			masks[n.Name] = append(masks[n.Name], dropoutMask(n, sess.Seed, sess.Step, tw.batch))
		}
		l, _, err := sess.TrainStep(b)
		require.NoError(t, err)
		losses = append(losses, l)
		labels, pixels := make([]int, len(b.Labels)), make([]int, len(b.Pixels)) // JSON numbers, not base64
		for i, v := range b.Labels {
			labels[i] = int(v)
		}
		for i, v := range b.Pixels {
			pixels[i] = int(v)
		}
		batches = append(batches, map[string]any{"pixels": pixels, "labels": labels})
	}
	cnncDone := time.Since(start)

	out := t.TempDir()
	var got struct {
		Torch       string
		TrainLosses []float64 `json:"train_losses"`
		State       []string
	}
	torchtest.Run(t, torchtest.Script("torch_examples.py"), map[string]any{
		"model": tw.model, "checkpoint": ck, "dtype": "float32", "lr": float64(sess.LR), "batches": batches, "masks": masks, "out": out,
	}, &got)
	t.Logf("%s at batch %d (torch %s): S = %.0f, a step's bound %.2e; kernels ready in %v, cnnc's steps done at %v, PyTorch's at %v",
		tw.model, tw.batch, got.Torch, perStep/(8*math.Ldexp(1, -24)), perStep, compiled.Round(time.Millisecond),
		cnncDone.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	require.Len(t, got.TrainLosses, tw.after)
	for s, l := range losses {
		d := math.Abs(float64(l)-got.TrainLosses[s]) / math.Abs(got.TrainLosses[s])
		t.Logf("%s step %d: loss %.7g (cnnc) vs %.7g (PyTorch): %.2e of bound %.2e", tw.model, s, l, got.TrainLosses[s], d, float64(s+1)*perStep)
		require.LessOrEqual(t, d, float64(s+1)*perStep, "%s step %d: loss %v (cnnc float32) vs %v (PyTorch float32)", tw.model, s, l, got.TrainLosses[s])
	}
	bound := float64(tw.after) * perStep
	worst, where := 0.0, ""
	for _, p := range append(append(append([]trainer.Tensor{}, sp.Params...), sp.Buffers...), sp.State...) {
		require.Contains(t, got.State, p.Name, "PyTorch's state after the steps")
		want := readFloat64s(t, filepath.Join(out, p.Name))
		if p.DType == trainer.DTypeI64 {
			require.Equal(t, []float64{float64(tw.before + tw.after)}, want, "%s: one count a step", p.Name)
			continue
		}
		vc, err := sess.ReadTensor(p)
		require.NoError(t, err)
		require.Len(t, vc, len(want), p.Name)
		wantF := make([]float32, len(want))
		for i, v := range want {
			wantF[i] = float32(v) // float32 values, exact
		}
		e, at := relDiff(vc, wantF)
		if e > worst {
			worst, where = e, fmt.Sprintf("%s[%d]: %v (cnnc) vs %v (PyTorch)", p.Name, at, vc[at], wantF[at])
		}
		require.LessOrEqual(t, e, bound, "%s after %d steps: %s[%d]: %v (cnnc float32) vs %v (PyTorch float32)", tw.model, tw.after, p.Name, at, vc[at], wantF[at])
	}
	t.Logf("%s: worst difference %.2e of bound %.2e (%s)", tw.model, worst, bound, where)
}

// dropoutNodes are g's forward dropout nodes.
func dropoutNodes(g *ir.Graph) []*ir.Node {
	var ns []*ir.Node
	for _, n := range g.Nodes {
		if n.Op == ir.OpDropout && n.Phase == ir.Forward {
			ns = append(ns, n)
		}
	}
	return ns
}

// dropoutMask is dropout node n's mask at a step of a session with the given seed: 1 where the
// kernels keep an element of the batch (ops.DropoutKeep, the function they compute).
func dropoutMask(n *ir.Node, seed uint64, step int64, batch int) []int {
	elems := int64(batch) * n.Ins[0].Type.SampleElems()
	mask := make([]int, elems)
	for i := range mask {
		if ops.DropoutKeep(seed, n.Attrs.Stream, step, int64(i), n.Attrs.P) {
			mask[i] = 1
		}
	}
	return mask
}

// readFloat64s reads a file of little-endian float64s.
func readFloat64s(t *testing.T, path string) []float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}
