package cpu_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// The plan without a budget recomputes batch norm's normalisation and the
// activations after it in the backward pass, from the saved conv outputs
// and batch statistics (compiler/plan/cheap.go), instead of saving them.
// On the generated kernels of both targets (the CPU target, and the CUDA C
// on the emulator) that changes nothing but memory: three training steps
// — the last a padded batch — give the same losses and the same bits of
// every parameter, optimizer state and running statistic as the plan that
// recomputes nothing.
func TestRecomputedBatchNormTrainsBitForBit(t *testing.T) {
	src, err := os.ReadFile("../../compiler/plan/testdata/bnrelu.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("bnrelu.cnn", src, compiler.Options{})
	require.NoError(t, err)
	for _, target := range []driver.Target{driver.CPU, driver.Emu} {
		t.Run(string(target), func(t *testing.T) {
			recomputing, saving := planSession(t, res, target, plan.Config{}, 3), planSession(t, res, target, plan.Config{NoRecompute: true}, 3)
			require.NotEmpty(t, recomputing.plan.Choices.Recompute)
			require.Empty(t, saving.plan.Choices.Recompute)
			require.Less(t, recomputing.plan.ArenaBytes, saving.plan.ArenaBytes)
			assertTrainsBitForBit(t, recomputing, saving, 3)
		})
	}
}

// assertTrainsBitForBit runs steps training steps of random batches (the
// last padded) in both sessions: the same losses and correct counts, and
// the same bits of every parameter, buffer and optimizer state.
func assertTrainsBitForBit(t *testing.T, recomputing, saving plannedSession, steps int) {
	t.Helper()
	spec := recomputing.sess.Spec
	rng := rand.New(rand.NewPCG(7, 11))
	n := spec.Batch
	for s := range steps {
		valid := n
		if s == steps-1 {
			valid = n - 2
		}
		b := trainer.Batch{Valid: valid, Pixels: make([]uint8, valid*spec.H*spec.W*spec.C), Labels: make([]int32, valid)}
		for i := range b.Pixels {
			b.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range b.Labels {
			b.Labels[i] = int32(rng.IntN(spec.Classes))
		}
		lr, cr, err := recomputing.sess.TrainStep(b)
		require.NoError(t, err)
		ls, cs, err := saving.sess.TrainStep(b)
		require.NoError(t, err)
		require.Equal(t, ls, lr, "step %d loss", s)
		require.Equal(t, cs, cr, "step %d correct", s)
	}
	for _, p := range append(append(append([]trainer.Tensor{}, spec.Params...), spec.Buffers...), spec.State...) {
		got, err := recomputing.sess.ReadTensor(p)
		require.NoError(t, err)
		want, err := saving.sess.ReadTensor(p)
		require.NoError(t, err)
		assert.Equal(t, bits(want), bits(got), p.Name)
	}
}

// A residual net's plan (compiler/plan/testdata/resblocks.cnn, ResNet-18's
// blocks) recomputes the stem conv and the first block's normalisations,
// and runs the backward steps ready before a recomputation (an input
// gradient, the residual gradient sum) first (compiler/plan's
// readyBeforeRecomputes). On both targets' kernels three steps train bit
// for bit like the plan that recomputes nothing.
func TestReorderedResidualRecomputeTrainsBitForBit(t *testing.T) {
	src, err := os.ReadFile("../../compiler/plan/testdata/resblocks.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("resblocks.cnn", src, compiler.Options{})
	require.NoError(t, err)
	for _, target := range []driver.Target{driver.CPU, driver.Emu} {
		t.Run(string(target), func(t *testing.T) {
			recomputing, saving := planSession(t, res, target, plan.Config{}, 3), planSession(t, res, target, plan.Config{NoRecompute: true}, 3)
			require.Contains(t, recomputing.plan.Choices.Recompute, "conv1")
			require.Empty(t, saving.plan.Choices.Recompute)
			at := map[string]int{}
			for _, s := range recomputing.plan.Steps {
				key := fmt.Sprintf("%v %s %s", s.Recompute, s.Kernel, s.Layer)
				if _, ok := at[key]; !ok {
					at[key] = s.Index
				}
			}
			sum, ok := at["false add a_out"]
			require.True(t, ok)
			rc, ok := at["true conv2d_block conv1"]
			require.True(t, ok)
			require.Less(t, sum, rc, "the residual sum runs before conv1 is recomputed")
			assertTrainsBitForBit(t, recomputing, saving, 3)
		})
	}
}

// bits are the values' float32 bits (the batch count's low word for an
// int64 buffer): equal bits, not merely equal values.
func bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

type plannedSession struct {
	plan *plan.Plan
	sess *trainer.Session
}

// planSession compiles res for target with the planner's cfg and opens a
// training session on its device: the CPU target's kernels, or the CUDA C
// on the emulator.
func planSession(t *testing.T, res *compiler.Result, target driver.Target, cfg plan.Config, seed uint64) plannedSession {
	t.Helper()
	c, err := driver.Compile(res, cfg, target)
	require.NoError(t, err)
	var dev device.Device
	if target == driver.CPU {
		dev, err = native.New(c.Kernels, res.Graph.Name+".cc", native.Options{})
	} else {
		dev, err = cpu.New(c.Kernels, res.Graph.Name+".cu", cpu.Options{})
	}
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	sess, err := trainer.NewSession(c.Spec, dev, seed)
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })
	return plannedSession{c.Plan, sess}
}
