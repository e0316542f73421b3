package trainer_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// graphDevice is the CPU device with device.Grapher: launches made while
// capturing are recorded, and a replay runs the recording — what CUDA
// graphs do, so the Session's graph path is tested without a GPU.
type graphDevice struct {
	*cpu.Device
	recording *[]op
	captures  int
	updates   int   // SetParams calls
	failWith  error // when set, captures or updates fail with it
	failIn    string
}

// op is a recorded launch, or a copy from or to host memory (read and
// written when the graph runs, as a memcpy node does).
type op struct {
	kernel      string
	grid, block device.Dim3
	shared      int
	params      []uint64
	copyIn      bool
	copyOut     bool
	dev         device.Ptr
	host        []byte
}

func (d *graphDevice) Launch(kernel string, grid, block device.Dim3, shared int, params []uint64) error {
	if d.recording != nil {
		*d.recording = append(*d.recording, op{kernel: kernel, grid: grid, block: block, shared: shared, params: append([]uint64(nil), params...)})
		return nil
	}
	return d.Device.Launch(kernel, grid, block, shared, params)
}

func (d *graphDevice) CaptureGraph(run func() error) (device.Replayer, error) {
	if d.failIn == "capture" {
		return nil, d.failWith
	}
	var rec []op
	d.recording = &rec
	err := run()
	d.recording = nil
	d.captures++
	r := &replay{d: d, rec: rec}
	for i, o := range rec {
		if !o.copyIn && !o.copyOut {
			r.launches = append(r.launches, i)
		}
	}
	return r, err
}

// stagedGraphDevice adds page-locked host memory and asynchronous copies,
// recorded into graphs like the CUDA backend's.
type stagedGraphDevice struct {
	*graphDevice
	asyncCopies int
}

func (d *stagedGraphDevice) AllocHost(n int) ([]byte, error) {
	return bytes.Repeat([]byte{0xAB}, n), nil
}
func (d *stagedGraphDevice) FreeHost([]byte) error { return nil }

func (d *stagedGraphDevice) CopyInAsync(dst device.Ptr, src []byte) error {
	d.asyncCopies++
	if d.recording != nil {
		*d.recording = append(*d.recording, op{copyIn: true, dev: dst, host: src})
		return nil
	}
	return d.Device.CopyIn(dst, src)
}

func (d *stagedGraphDevice) CopyOutAsync(dst []byte, src device.Ptr) error {
	d.asyncCopies++
	if d.recording != nil {
		*d.recording = append(*d.recording, op{copyOut: true, dev: src, host: dst})
		return nil
	}
	return d.Device.CopyOut(dst, src)
}

type replay struct {
	d        *graphDevice
	rec      []op
	launches []int // indices in rec of the launches, in order
}

func (r *replay) Replay() error {
	for _, o := range r.rec {
		var err error
		switch {
		case o.copyIn:
			err = r.d.Device.CopyIn(o.dev, o.host)
		case o.copyOut:
			err = r.d.Device.CopyOut(o.host, o.dev)
		default:
			err = r.d.Device.Launch(o.kernel, o.grid, o.block, o.shared, o.params)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *replay) SetParams(i int, params []uint64) error {
	if r.d.failIn == "update" {
		return r.d.failWith
	}
	l := &r.rec[r.launches[i]]
	if len(params) != len(l.params) {
		return fmt.Errorf("launch %d (%s): %d parameters, captured %d", i, l.kernel, len(params), len(l.params))
	}
	copy(l.params, params)
	r.d.updates++
	return nil
}

func (r *replay) Close() error { return nil }

// The step replayed as a graph equals the step launched kernel by kernel
// for SGD (tiny.cnn) and for Adam with dropout, partial batches included:
// one capture serves every step, and only the launches whose arguments
// changed are updated before a replay.
func TestSessionReplaysTheStepAsAGraph(t *testing.T) {
	models := map[string]*trainertest.Model{"tiny": trainertest.Tiny(t), "adam+dropout": trainertest.TinyAdamDropout(t)}
	for _, staged := range []bool{false, true} {
		for name, m := range models {
			t.Run(fmt.Sprintf("%s/staged=%v", name, staged), func(t *testing.T) {
				replaysTheStep(t, m, staged)
			})
		}
	}
}

// cpuDevice opens m's kernels on the CPU emulator, closed with the test.
func cpuDevice(t *testing.T, m *trainertest.Model) *cpu.Device {
	d, err := cpu.New(m.Kernels, "kernels.cu", cpu.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// someBatches are n full batches of m's compiled size.
func someBatches(m *trainertest.Model, n int) []trainer.Batch {
	return batches(m, trainertest.Data(m.Spec, n*m.Spec.Batch, 9))
}

func replaysTheStep(t *testing.T, m *trainertest.Model, staged bool) {
	gd := &graphDevice{Device: cpuDevice(t, m)}
	var dev device.Device = gd
	sd := &stagedGraphDevice{graphDevice: gd}
	if staged {
		dev = sd
	}
	g, err := trainer.NewSession(m.Spec, dev, 2)
	require.NoError(t, err)
	defer g.Close()
	g.UseGraphs = true
	plain := m.Session(t, 2)

	bs := someBatches(m, 6)
	bs[3] = partial(m, bs[3], 3) // another valid count
	stepAlike(t, g, plain, bs)
	assert.Equal(t, 1, gd.captures, "captured once, at the second step")
	assert.Greater(t, gd.updates, 0, "the valid count (and Adam's step) changed")
	if staged {
		assert.Equal(t, 4, sd.asyncCopies, "the graph carries the batch in and the results out")
	}
	sameState(t, plain, g)
}

// hostDevice is the CPU device with device.HostAllocator: it records the
// host buffers it lends and which copies read from them.
type hostDevice struct {
	*cpu.Device
	lent    [][]byte
	freed   int
	uploads [][]byte // what each copy from lent memory carried
}

// AllocHost lends memory that is not zeroed, as cuMemHostAlloc's is not.
func (d *hostDevice) AllocHost(n int) ([]byte, error) {
	b := bytes.Repeat([]byte{0xAB}, n)
	d.lent = append(d.lent, b)
	return b, nil
}

func (d *hostDevice) FreeHost(b []byte) error {
	for _, l := range d.lent {
		if &l[0] == &b[0] {
			d.freed++
			return nil
		}
	}
	return fmt.Errorf("FreeHost of memory not lent")
}

func (d *hostDevice) CopyIn(dst device.Ptr, src []byte) error {
	for _, l := range d.lent {
		if len(src) > 0 && &l[0] == &src[0] {
			d.uploads = append(d.uploads, bytes.Clone(src))
		}
	}
	return d.Device.CopyIn(dst, src)
}

// Batches reach the device through page-locked staging buffers when the
// device lends them, allocated once and freed with the session; padding
// of a partial batch is zero as before.
func TestSessionStagesUploadsInHostMemory(t *testing.T) {
	m := trainertest.Tiny(t)
	hd := &hostDevice{Device: cpuDevice(t, m)}
	s, err := trainer.NewSession(m.Spec, hd, 2)
	require.NoError(t, err)
	plain := m.Session(t, 2)
	bs := someBatches(m, 3)
	bs[2] = partial(m, bs[2], 3)
	stepAlike(t, s, plain, bs)
	assert.Len(t, hd.lent, 2, "pixels and labels, allocated once")
	require.Len(t, hd.uploads, 6, "both uploads of every step")
	px, lb := hd.uploads[4], hd.uploads[5] // the partial batch's
	const size = 6 * 6
	assert.Equal(t, bs[2].Pixels, px[:3*size])
	assert.Equal(t, make([]byte, 1*size), px[3*size:], "padding pixels are zero")
	assert.Equal(t, make([]byte, 4*1), lb[4*3:], "padding labels are zero")
	require.NoError(t, s.Close())
	assert.Equal(t, 2, hd.freed)
}

// A graph that cannot be captured or updated is reported once and the
// session goes on launching kernel by kernel, with the same results; with
// no Warnf the step fails instead.
func TestSessionFallsBackWhenGraphsFail(t *testing.T) {
	m := trainertest.TinyAdamDropout(t)
	bs := someBatches(m, 4)
	for _, where := range []string{"capture", "update"} {
		t.Run(where, func(t *testing.T) {
			cpuDev := cpuDevice(t, m)
			gd := &graphDevice{Device: cpuDev, failWith: fmt.Errorf("no graphs today"), failIn: where}
			g, err := trainer.NewSession(m.Spec, gd, 2)
			require.NoError(t, err)
			defer g.Close()
			g.UseGraphs = true
			var warnings []string
			g.Warnf = func(format string, args ...any) { warnings = append(warnings, fmt.Sprintf(format, args...)) }
			plain := m.Session(t, 2)
			stepAlike(t, g, plain, bs)
			require.Len(t, warnings, 1)
			assert.Contains(t, warnings[0], "no graphs today; launching kernels one by one")
			assert.False(t, g.UseGraphs)

			strict, err := trainer.NewSession(m.Spec, gd, 2)
			require.NoError(t, err)
			defer strict.Close()
			strict.UseGraphs = true
			_, _, err = strict.TrainStep(bs[0])
			require.NoError(t, err, "the first step runs kernel by kernel")
			for _, b := range bs[1:3] { // captured at the second step, updated at the third
				if _, _, err = strict.TrainStep(b); err != nil {
					break
				}
			}
			assert.ErrorContains(t, err, "no graphs today")
		})
	}
}

// partial keeps the first n samples of a batch.
func partial(m *trainertest.Model, b trainer.Batch, n int) trainer.Batch {
	size := m.Spec.H * m.Spec.W * m.Spec.C
	return trainer.Batch{Valid: n, Pixels: b.Pixels[:n*size], Labels: b.Labels[:n]}
}

// stepAlike trains both sessions on batches and requires the same loss and
// correct count at every step.
func stepAlike(t *testing.T, got, want *trainer.Session, batches []trainer.Batch) {
	t.Helper()
	for i, b := range batches {
		lg, cg, err := got.TrainStep(b)
		require.NoError(t, err, "step %d", i)
		lw, cw, err := want.TrainStep(b)
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, lw, lg, "loss at step %d", i)
		assert.Equal(t, cw, cg, "correct at step %d", i)
	}
}
