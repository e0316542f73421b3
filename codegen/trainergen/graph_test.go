package trainergen_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/runtime"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// graphDevice is the CPU device with runtime.Grapher: launches made while
// capturing are recorded, and a replay runs the recording — what CUDA
// graphs do, so the Session's graph path is tested without a GPU.
type graphDevice struct {
	*cpu.Device
	recording *[]launch
	captures  int
}

type launch struct {
	kernel      string
	grid, block runtime.Dim3
	shared      int
	params      []uint64
}

func (d *graphDevice) Launch(kernel string, grid, block runtime.Dim3, shared int, params []uint64) error {
	if d.recording != nil {
		*d.recording = append(*d.recording, launch{kernel, grid, block, shared, append([]uint64(nil), params...)})
		return nil
	}
	return d.Device.Launch(kernel, grid, block, shared, params)
}

func (d *graphDevice) CaptureGraph(run func() error) (runtime.Replayer, error) {
	var rec []launch
	d.recording = &rec
	err := run()
	d.recording = nil
	d.captures++
	return &replay{d: d, rec: rec}, err
}

type replay struct {
	d   *graphDevice
	rec []launch
}

func (r *replay) Replay() error {
	for _, l := range r.rec {
		if err := r.d.Device.Launch(l.kernel, l.grid, l.block, l.shared, l.params); err != nil {
			return err
		}
	}
	return nil
}

func (r *replay) Close() error { return nil }

// The step replayed as a graph equals the step launched kernel by kernel,
// and the graph is captured again only when a captured argument changes.
func TestSessionReplaysTheStepAsAGraph(t *testing.T) {
	const batch = 8
	c := compileExample(t, "../../examples/mnist.cnn", batch) // SGD, no dropout: no per-step argument
	cpuDev, err := cpu.New(c.Kernels, "kernels.cu", cpu.Options{})
	require.NoError(t, err)
	defer cpuDev.Close()
	gd := &graphDevice{Device: cpuDev}
	g, err := trainer.NewSession(c.Spec, gd, 2)
	require.NoError(t, err)
	defer g.Close()
	require.True(t, g.GraphsApply())
	g.UseGraphs = true
	plain := newSession(t, c, 2)

	batches := mnistBatches(t, 4, batch)
	batches[3].Valid = 5 // a partial batch: another valid count, another capture
	batches[3].Pixels = batches[3].Pixels[:5*784]
	batches[3].Labels = batches[3].Labels[:5]
	for i, b := range batches {
		lg, cg, err := g.TrainStep(b)
		require.NoError(t, err)
		lp, cp, err := plain.TrainStep(b)
		require.NoError(t, err)
		assert.Equal(t, lp, lg, "step %d", i)
		assert.Equal(t, cp, cg)
	}
	assert.Equal(t, 3, gd.captures, "captured for the first step, for the later ones, and for the partial batch")
	for _, p := range c.Spec.Params {
		a, err := g.ReadTensor(p)
		require.NoError(t, err)
		b, err := plain.ReadTensor(p)
		require.NoError(t, err)
		assert.Equal(t, b, a, p.Name)
	}
}
