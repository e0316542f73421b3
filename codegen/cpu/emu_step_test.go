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
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// trainerOn compiles res for target and opens a trainer session of it on the target's device
// (the CPU target's kernels on runtime/native, the CUDA C on the emulator), its parameters
// initialised for seed.
func trainerOn(t *testing.T, res *compiler.Result, target driver.Target, seed uint64) *trainer.Session {
	t.Helper()
	c, err := driver.Compile(res, plan.Config{}, target)
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
	return sess
}

// stepTolerance bounds how far the two targets' losses and parameters may drift apart (relative
// to each tensor's largest magnitude) — see TestStepsMatchEmulator.
type stepTolerance struct {
	loss, params float64
}

// compareSteps trains the model of src at batch on the CPU target and on the emulator from the
// same initial parameters on the same random batches, steps times, and requires the losses and
// finally every parameter (and buffer: batch norm's running statistics) to agree within tol.
func compareSteps(t *testing.T, name string, batch int64, steps int, tol stepTolerance) {
	t.Helper()
	start := time.Now()
	src, err := os.ReadFile("../../examples/" + name)
	require.NoError(t, err)
	res, err := compiler.CompileSource(name, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	const seed = 5
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
		lc, _, err := cpuSess.TrainStep(b)
		require.NoError(t, err)
		le, _, err := emuSess.TrainStep(b)
		require.NoError(t, err)
		d := math.Abs(float64(lc)-float64(le)) / math.Abs(float64(le))
		t.Logf("%s step %d: loss %.7g (cpu) vs %.7g (emulator): %.2e", name, s, lc, le, d)
		require.LessOrEqual(t, d, tol.loss, "%s step %d: loss %v (cpu) vs %v (emulator)", name, s, lc, le)
	}
	worst, where := 0.0, ""
	for _, p := range append(append([]trainer.Tensor{}, spec.Params...), spec.Buffers...) {
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
		require.LessOrEqual(t, e, tol.params, "%s after %d steps: %s[%d]: %v (cpu) vs %v (emulator)", name, steps, p.Name, at, vc[at], ve[at])
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

func TestStepsMatchEmulator(t *testing.T) {
	tol := stepTolerance{loss: 1e-4, params: 1e-4}
	compareSteps(t, "simplecnn.cnn", 2, 3, tol)
	compareSteps(t, "mobilenet_small.cnn", 4, 3, tol)
}
