package cpu_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// trainerOn compiles res for target and opens a trainer session of it on the target's device
// (the CPU target's kernels on runtime/native, the CUDA C on the emulator), its parameters
// initialised for seed.
func trainerOn(t *testing.T, res *compiler.Result, target driver.Target, seed uint64) *trainer.Session {
	t.Helper()
	return planSession(t, res, target, plan.Config{}, seed).sess
}

func compareSteps(t *testing.T, name string, batch int64, steps int) {
	t.Helper()
	start := time.Now()
	src, err := os.ReadFile("../../examples/" + name)
	require.NoError(t, err)
	res, err := compiler.CompileSource(name, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	const seed = 5
	perStep := 8 * math.Ldexp(1, -24) * reductionSum(res.Graph, batch)
	t.Logf("%s at batch %d: S = %.0f, a step's bound %.2e", name, batch, perStep/(8*math.Ldexp(1, -24)), perStep)
	cpuSess, emuSess := trainerOn(t, res, driver.CPU, seed), trainerOn(t, res, driver.Emu, seed)
	spec := cpuSess.Spec
	rng := rand.New(rand.NewPCG(seed, 17))
	n := spec.Batch
	b := trainer.Batch{Valid: n, Pixels: make([]uint8, n*spec.H*spec.W*spec.C), Labels: make([]int32, n)}
	for s := range steps {
		for i := range b.Pixels {
			b.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range b.Labels {
			b.Labels[i] = int32(rng.IntN(spec.Classes))
		}
		valid := n
		if s == steps-1 {
			valid = n - 1
		}
		vb := trainer.Batch{Valid: valid, Pixels: b.Pixels[:valid*spec.H*spec.W*spec.C], Labels: b.Labels[:valid]}
		lc, _, err := cpuSess.TrainStep(vb)
		require.NoError(t, err)
		le, _, err := emuSess.TrainStep(vb)
		require.NoError(t, err)
		d := math.Abs(float64(lc)-float64(le)) / math.Abs(float64(le))
		t.Logf("%s step %d: loss %.7g (cpu) vs %.7g (emulator): %.2e", name, s, lc, le, d)
		require.LessOrEqual(t, d, float64(s+1)*perStep, "%s step %d: loss %v (cpu) vs %v (emulator)", name, s, lc, le)
	}
	worst, where := 0.0, ""
	for _, p := range append(append(append([]trainer.Tensor{}, spec.Params...), spec.Buffers...), spec.State...) {
		if p.DType != "" {
			continue // batch norm's batch count: an integer, compared below
		}
		vc, err := cpuSess.ReadTensor(p)
		require.NoError(t, err)
		ve, err := emuSess.ReadTensor(p)
		require.NoError(t, err)
		e, at := relDiff(vc, ve)
		if e > worst {
			worst, where = e, fmt.Sprintf("%s[%d]: %v (cpu) vs %v (emulator)", p.Name, at, vc[at], ve[at])
		}
		require.LessOrEqual(t, e, float64(steps)*perStep, "%s after %d steps: %s[%d]: %v (cpu) vs %v (emulator)", name, steps, p.Name, at, vc[at], ve[at])
	}
	t.Logf("%s at batch %d, %d steps: worst parameter difference %.2e (%s); %v", name, batch, steps, worst, where, time.Since(start).Round(time.Millisecond))
}

// relDiff is the largest |a - b| over the largest |b|, and where it is.
func relDiff(a, b []float32) (float64, int) {
	scale := 0.0
	for _, v := range b {
		scale = max(scale, math.Abs(float64(v)))
	}
	if scale == 0 {
		scale = 1
	}
	worst, at := 0.0, 0
	for i := range a {
		d := math.Abs(float64(a[i])-float64(b[i])) / scale
		if d > worst || math.IsNaN(d) {
			worst, at = d, i
			if math.IsNaN(d) {
				return math.Inf(1), i
			}
		}
	}
	return worst, at
}

// reductionSum is S = Σ over the step's nodes of sqrt(K), K a node's reduction length: its
// FLOPs at batch over twice the elements it writes (a conv's or linear's multiply-adds per
// output; a weight gradient's samples·positions per weight; about 1 for an elementwise op, which
// rounds once). Nodes that write only parameters in place (a fused update) count the parameters.
func reductionSum(g *ir.Graph, batch int64) float64 {
	s := 0.0
	for _, n := range g.Nodes {
		var outs int64
		for _, v := range n.Outs {
			outs += v.Type.Elems(batch)
		}
		if outs == 0 {
			for _, v := range n.Ins {
				if v.Role == ir.RoleParam {
					outs += v.Type.Elems(batch)
				}
			}
		}
		if outs == 0 {
			continue
		}
		s += math.Sqrt(max(1, float64(n.FLOPs(batch))/float64(2*outs)))
	}
	return s
}

// Whole training steps of the CPU target beside the emulator's (the oracle of the CUDA kernels)
// for the same model, initial parameters and batches: SimpleCNN (examples/simplecnn.cnn, batch
// 2), examples/mobilenet_small.cnn (batch norm, depthwise convs, hardswish; batch 4) and
// examples/lenet5.cnn (the conv2d_tanh_avgpool blocks; batch 2, S = 190: 9.1e-5 a step), the
// last step a padded batch of one sample fewer. The losses of every step and every parameter, batch
// norm buffer and momentum buffer after the last step must agree within a tolerance from fp32
// error analysis:
//
//   - One fp32 reduction of K terms errs by about sqrt(K)·u relative to the terms' root sum of
//     squares (u = 2^-24; rounding errors of random sign add as a random walk; 4 standard
//     deviations: 4·sqrt(K)·u). The two targets sum in different orders (the CPU kernels split
//     and vectorise, its AVX2 ones fuse multiply-adds, batch norm sums in double), so they
//     differ by at most the sum of both: 8·sqrt(K)·u. Against the largest magnitude of a
//     tensor, as compared here, the root sum of squares is no larger for sums of terms of random
//     sign (gradients over a batch, activations of random weights).
//   - Along a step the errors of every node add (each tensor's error is at most that of all
//     the nodes before it): 8·u·S, S = Σ sqrt(K) over the step's nodes (reductionSum: SimpleCNN
//     at batch 2 has S = 506, its longest K the conv1 weight gradient's 2·126·126 = 31,752 and
//     fc1's 28,800 inputs; mobilenet_small at batch 4 S = 583, its longest K batch norm's
//     4·32·32 = 4,096 values of a channel and conv0's weight gradient over as many): 2.4e-4 and
//     2.8e-4 a step.
//   - Over N steps the parameters' differences accumulate: each step's update is lr times a
//     gradient that differs by that relative error, and a difference in the parameters changes
//     the next gradient by as little again for a learning rate this small (lr·|∇g| ≪ 1), so N
//     steps differ by at most N·8·u·S: 3 steps give 7.2e-4 for SimpleCNN, 8.3e-4 for
//     mobilenet_small. The loss of step s (0-based) is within s+1 steps' worth.
//
// (Measured: 8.1e-7 and 2.8e-6 — the bound adds every node's worst case; a wrong kernel differs
// by percents.) With the kernels cached (they are after one run: emu's and native's caches) it
// takes seconds; the first run compiles both targets' kernels of the models (a minute or two).
func TestStepsMatchEmulator(t *testing.T) {
	compareSteps(t, "simplecnn.cnn", 2, 3)
	compareSteps(t, "mobilenet_small.cnn", 4, 3)
	compareSteps(t, "lenet5.cnn", 2, 3) // conv2d_tanh_avgpool blocks: the image's recomputes tanh, conv2's saves it
}
