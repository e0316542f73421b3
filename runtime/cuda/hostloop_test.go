//go:build cuda

package cuda_test

import (
	"bufio"
	"fmt"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/examples"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// The driver calls a steady-state training step makes, counted by the
// fake driver's trace (fakecuda.TraceEnv) in a child process that trains
// examples/adam_dropout.cnn — Adam's bias correction, dropout's seed and
// step and a partial batch's valid count change every step — with graphs
// on, submitting steps without waiting for them (Session.Submit), as the
// training loop does.
//
// The least a step can cost the host is two calls, and it costs that:
//
//   - cuGraphLaunch: the step's work has to be started, and its graph holds
//     all of it — the copies of the batch and of the step's scalars in
//     (memcpy nodes: one per contiguous run of the arena, no call), every
//     kernel with arguments that never change (the scalars are read from
//     the block the graph copies in), the copy of the loss and correct
//     count out, and the record of the step's event (an event record node).
//   - cuEventSynchronize: the host writes the next batch into the
//     page-locked staging buffer that the step two back read, and must
//     know that step has finished; waiting for (or querying) its event is
//     the driver's only call that says so. The one way around a call, a
//     host-function node in the graph signalling the host, stalls the
//     GPU's stream at every step until the host runs it. The wait does not
//     idle the GPU: the step after the one waited for is already queued.
//
// Nothing else: no stream synchronisation, no kernel-node parameter
// updates, no copies or event records outside the graph. Before this
// host loop a step of this model made 7 calls (a staging memcpy into one
// buffer outside the driver, then 5 cuGraphExecKernelNodeSetParams, one
// cuGraphLaunch, one cuStreamSynchronize); BENCHMARKS.md has both counts.
func TestDriverCallsPerStep(t *testing.T) {
	if fakecuda.Dir() == "" {
		t.Skip("counts calls with the fake driver's trace (make test-fakecuda)")
	}
	nvcc.Require(t)
	trace := t.TempDir() + "/trace"
	cmd := exec.Command(os.Args[0], "-test.run=^TestDriverCallsChild$", "-test.v")
	cmd.Env = append(os.Environ(), driverCallsChild+"=1", fakecuda.TraceEnv+"="+trace)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	steps := stepsOfTrace(t, trace)
	require.Len(t, steps, driverCallsSteps, "%s", out)
	for i, calls := range steps {
		assert.Equal(t, []string{"cuEventSynchronize", "cuGraphLaunch"}, calls, "steady-state step %d", i)
	}
}

const (
	driverCallsChild = "CNNC_CUDA_TEST_DRIVER_CALLS_CHILD"
	driverCallsSteps = 8
	stepMark         = "# step"
)

// stepsOfTrace cuts a trace at the child's step marks: the calls made
// from one mark to the next (the last: to the end mark).
func stepsOfTrace(t *testing.T, path string) [][]string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var steps [][]string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, stepMark):
			steps = append(steps, []string{})
			in = true
		case line == "# end":
			in = false
		case in:
			steps[len(steps)-1] = append(steps[len(steps)-1], line)
		}
	}
	require.NoError(t, sc.Err())
	return steps
}

func TestDriverCallsChild(t *testing.T) {
	if os.Getenv(driverCallsChild) == "" {
		t.Skip("run by TestDriverCallsPerStep")
	}
	src, err := examples.Models.ReadFile("adam_dropout.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource("adam_dropout.cnn", src, compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	fb, err := trainergen.CompileFatbin(c.Kernels)
	require.NoError(t, err)
	sess, err := trainer.NewSession(c.Spec, open(t, fb), c.Spec.Seed)
	require.NoError(t, err)
	defer sess.Close()
	sess.UseGraphs = true
	trace, err := os.OpenFile(os.Getenv(fakecuda.TraceEnv), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer trace.Close()

	sp := c.Spec
	rng := rand.New(rand.NewPCG(5, 6))
	n := sp.H * sp.W * sp.C
	done := func(trainer.StepResult) error { return nil }
	// the first step runs launch by launch, the next two capture the
	// staging slots' graphs
	const warm = 3
	for s := range warm + driverCallsSteps {
		valid := sp.Batch
		if s == warm+2 {
			valid = sp.Batch - 7 // a partial batch: another valid count
		}
		b := trainer.Batch{Pixels: make([]uint8, valid*n), Labels: make([]int32, valid), Valid: valid}
		for i := range b.Pixels {
			b.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range b.Labels {
			b.Labels[i] = int32(rng.IntN(sp.Classes))
		}
		if s >= warm {
			_, err := fmt.Fprintf(trace, "%s %d\n", stepMark, s)
			require.NoError(t, err)
		}
		require.NoError(t, sess.Submit(b, done))
	}
	_, err = fmt.Fprintln(trace, "# end")
	require.NoError(t, err)
	require.NoError(t, sess.Flush())
}

// The fake driver runs a launched graph when something waits for it, as
// late as a GPU may: a graph's copy reads page-locked memory as it is
// then, and waiting for a fence the graph records runs the graphs queued
// up to it and no further. (On a GPU the first is a race; the fake makes
// the late outcome certain, so host code that rewrites a staging buffer
// too early fails its tests.) Fences record inside graphs, and time.
func TestFakeDriverRunsGraphsWhenWaitedFor(t *testing.T) {
	if fakecuda.Dir() == "" {
		t.Skip("on a GPU the outcome is a race")
	}
	d := open(t, testFatbin(t))
	const n = 64
	px, err := d.Alloc(4 * n)
	require.NoError(t, err)
	py, err := d.Alloc(4 * n)
	require.NoError(t, err)
	require.NoError(t, d.CopyIn(py, make([]byte, 4*n)))
	in, err := d.AllocHost(4 * n)
	require.NoError(t, err)
	defer d.FreeHost(in)
	out, err := d.AllocHost(4 * n)
	require.NoError(t, err)
	defer d.FreeHost(out)
	f, err := d.NewFence(true)
	require.NoError(t, err)
	defer f.Close()
	start, err := d.NewFence(true)
	require.NoError(t, err)
	defer start.Close()
	// y += x, x from in; y to out; the fence
	g, err := d.CaptureGraph(func() error {
		if err := d.CopyInAsync(px, in); err != nil {
			return err
		}
		if err := d.Launch("saxpy", device.Dim3{1, 1, 1}, device.Dim3{n, 1, 1}, 0, []uint64{f32arg(1), uint64(px), uint64(py), n}); err != nil {
			return err
		}
		if err := d.CopyOutAsync(out, py); err != nil {
			return err
		}
		return f.Record()
	})
	require.NoError(t, err)
	defer g.Close()
	fill := func(v float32) { copy(in, f32bytes(slices.Repeat([]float32{v}, n))) }

	fill(1)
	require.NoError(t, start.Record())
	require.NoError(t, g.Replay())
	fill(2) // too early: the graph has not read in yet
	require.NoError(t, f.Wait())
	assert.Equal(t, float32(2), bytesf32(out)[5], "the copy read in when the graph ran")
	el, err := f.Since(start)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, el, time.Duration(0))

	require.NoError(t, g.Replay()) // y = 2 + 3
	fill(3)
	require.NoError(t, g.Replay()) // y = 5 + 3 when both have run
	require.NoError(t, d.Sync())
	assert.Equal(t, float32(8), bytesf32(out)[5])
}
