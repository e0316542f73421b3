package trainer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// Test doubles of a GPU on the CPU emulator, so that the Session's graph,
// staging and pipelining paths are tested exactly without one. They are
// layered like the optional interfaces a device may offer:
//
//	queued     the device.Device: work is queued, as on a GPU's stream
//	graphs     + device.Grapher
//	staged     + device.HostAllocator and device.AsyncCopier
//	pipelined  + device.Fencer
//
// Queued work does not run when it is queued but when something waits
// for it — a fence's Wait runs the queue up to that fence; Sync, a
// synchronous copy or a Free run all of it — and an asynchronous copy
// reads its host memory when it runs. So a host that rewrites a staging
// buffer before the step that reads it has run trains on the wrong batch,
// as it would on a GPU, and the comparison with the plain emulator fails.
type queued struct {
	*cpu.Device
	pending   []func() error
	recording *[]op // while capturing: what the graph will queue
	captures  int
	replays   int
	updates   int // Replayer.SetParams calls
	asyncs    int // asynchronous copies queued outside captures
	waits     int // fence waits
	failWith  error
}

// op is one queued operation: queue runs when it is queued (a fence
// counts its records), run when the device gets to it.
type op struct {
	queue func()
	run   func() error
}

func (d *queued) put(o op) {
	if d.recording != nil {
		*d.recording = append(*d.recording, o)
		return
	}
	if o.queue != nil {
		o.queue()
	}
	d.pending = append(d.pending, o.run)
}

// runOne runs the oldest queued operation.
func (d *queued) runOne() error {
	f := d.pending[0]
	d.pending = d.pending[1:]
	if err := f(); err != nil {
		d.pending = nil
		return err
	}
	return nil
}

func (d *queued) runAll() error {
	for len(d.pending) > 0 {
		if err := d.runOne(); err != nil {
			return err
		}
	}
	return nil
}

func (d *queued) Launch(kernel string, grid, block device.Dim3, shared int, params []uint64) error {
	p := append([]uint64(nil), params...) // captured by value, as the driver does
	d.put(op{run: func() error { return d.Device.Launch(kernel, grid, block, shared, p) }})
	return nil
}

func (d *queued) CopyIn(dst device.Ptr, src []byte) error {
	if err := d.runAll(); err != nil {
		return err
	}
	return d.Device.CopyIn(dst, src)
}

func (d *queued) CopyOut(dst []byte, src device.Ptr) error {
	if err := d.runAll(); err != nil {
		return err
	}
	return d.Device.CopyOut(dst, src)
}

func (d *queued) Sync() error { return d.runAll() }

func (d *queued) Free(p device.Ptr) error {
	if err := d.runAll(); err != nil {
		return err
	}
	return d.Device.Free(p)
}

type graphs struct{ *queued }

func (d *graphs) CaptureGraph(run func() error) (device.Replayer, error) {
	if d.failWith != nil {
		return nil, d.failWith
	}
	var rec []op
	d.recording = &rec
	err := run()
	d.recording = nil
	d.captures++
	return &replay{d: d.queued, rec: rec}, err
}

type replay struct {
	d   *queued
	rec []op
}

func (r *replay) Replay() error {
	r.d.replays++
	for _, o := range r.rec {
		r.d.put(o)
	}
	return nil
}

func (r *replay) SetParams(int, []uint64) error {
	r.d.updates++
	return errors.New("no graph updates are needed")
}

func (r *replay) Close() error { return nil }

type staged struct {
	*graphs
	lent, freed int
}

// AllocHost lends memory that is not zeroed, as cuMemHostAlloc's is not.
func (d *staged) AllocHost(n int) ([]byte, error) {
	d.lent++
	return bytes.Repeat([]byte{0xAB}, n), nil
}

func (d *staged) FreeHost([]byte) error {
	d.freed++
	return nil
}

func (d *staged) CopyInAsync(dst device.Ptr, src []byte) error {
	if d.recording == nil {
		d.asyncs++
	}
	d.put(op{run: func() error { return d.Device.CopyIn(dst, src) }})
	return nil
}

func (d *staged) CopyOutAsync(dst []byte, src device.Ptr) error {
	if d.recording == nil {
		d.asyncs++
	}
	d.put(op{run: func() error { return d.Device.CopyOut(dst, src) }})
	return nil
}

type pipelined struct{ *staged }

func (d *pipelined) NewFence(timing bool) (device.Fence, error) { return &fence{d: d.queued}, nil }

// fence counts its records as they are queued and as they run.
type fence struct {
	d              *queued
	queued, passed int
	at             time.Time
}

func (f *fence) Record() error {
	f.d.put(op{queue: func() { f.queued++ }, run: func() error {
		f.passed++
		f.at = time.Now()
		return nil
	}})
	return nil
}

func (f *fence) Wait() error {
	f.d.waits++
	for f.passed < f.queued {
		if err := f.d.runOne(); err != nil {
			return err
		}
	}
	return nil
}

func (f *fence) Since(earlier device.Fence) (time.Duration, error) {
	e := earlier.(*fence)
	if f.passed < f.queued || e.passed < e.queued || f.passed == 0 || e.passed == 0 {
		return 0, errors.New("a fence not passed yet")
	}
	return f.at.Sub(e.at), nil
}

func (f *fence) Close() error { return nil }

// newPipelined makes the whole double for m.
func newPipelined(t *testing.T, m *trainertest.Model) *pipelined {
	return &pipelined{&staged{graphs: &graphs{&queued{Device: cpuDevice(t, m)}}}}
}

// The double catches a host that rewrites memory an asynchronous copy has
// not read yet: the copy reads it when it runs.
func TestQueuedDeviceReadsHostMemoryLate(t *testing.T) {
	m := trainertest.Tiny(t)
	d := newPipelined(t, m)
	p, err := d.Alloc(4)
	require.NoError(t, err)
	host, err := d.AllocHost(4)
	require.NoError(t, err)
	copy(host, "good")
	require.NoError(t, d.CopyInAsync(p, host))
	copy(host, "late")
	out := make([]byte, 4)
	require.NoError(t, d.CopyOut(out, p))
	assert.Equal(t, "late", string(out))
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

// submitAlike submits every batch to got without waiting, then flushes,
// and requires got's results — in step order, each with its own batch as
// Input — to equal want's step by step. It returns how many steps late
// each result arrived (submissions after its own).
func submitAlike(t *testing.T, got, want *trainer.Session, batches []trainer.Batch) (late []int) {
	t.Helper()
	var results []trainer.StepResult
	first := got.Step
	submitting := 0 // the batch being submitted when a result arrives
	for i, b := range batches {
		submitting = i
		require.NoError(t, got.Submit(b, func(r trainer.StepResult) error {
			results = append(results, r)
			late = append(late, submitting-int(r.Step-1-first))
			assert.Equal(t, batches[r.Step-1-first].Pixels, r.Input.Pixels, "step %d's input", r.Step)
			assert.Equal(t, batches[r.Step-1-first].Labels, r.Input.Labels, "step %d's labels", r.Step)
			return nil
		}), "step %d", i)
	}
	submitting = len(batches)
	require.NoError(t, got.Flush())
	require.Len(t, results, len(batches))
	for i, b := range batches {
		lw, cw, err := want.TrainStep(b)
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, first+int64(i)+1, results[i].Step)
		assert.Equal(t, lw, results[i].Loss, "loss at step %d", i)
		assert.Equal(t, cw, results[i].Correct, "correct at step %d", i)
		assert.Equal(t, b.Valid, results[i].Valid)
	}
	return late
}

// Every kind of device gives the plain emulator's steps bit for bit, for
// SGD (tiny.cnn) and for Adam with dropout, a partial batch included: with
// graphs, each staging slot's step is captured once and replayed without
// a single argument update (what changes between steps — Adam's step,
// dropout's seed and step, the valid count — travels in the scalar block);
// with page-locked staging the graph carries the copies; and on a device
// with fences steps are queued two deep, their results arriving late but
// in order.
func TestSessionStepsOnEveryKindOfDevice(t *testing.T) {
	models := map[string]*trainertest.Model{"tiny": trainertest.Tiny(t), "adam+dropout": trainertest.TinyAdamDropout(t)}
	for name, m := range models {
		bs := someBatches(m, 7)
		bs[3] = partial(m, bs[3], 3) // another valid count
		for _, kind := range []string{"queued", "graphs", "staged", "pipelined", "pipelined without graphs"} {
			t.Run(name+"/"+kind, func(t *testing.T) {
				d := newPipelined(t, m)
				var dev device.Device
				switch kind {
				case "queued":
					dev = d.queued
				case "graphs":
					dev = d.graphs
				case "staged":
					dev = d.staged
				default:
					dev = d
				}
				s, err := trainer.NewSession(m.Spec, dev, 2)
				require.NoError(t, err)
				s.UseGraphs = kind != "pipelined without graphs" && kind != "queued"
				plain := m.Session(t, 2)
				late := submitAlike(t, s, plain, bs)
				sameState(t, plain, s)
				assert.Zero(t, d.updates, "no graph updates")
				switch kind {
				case "graphs", "staged":
					assert.Equal(t, 1, d.captures, "captured once, at the second step")
					assert.Equal(t, len(bs)-1, d.replays)
					assert.Equal(t, make([]int, len(bs)), late, "results at once")
				case "pipelined":
					assert.Equal(t, trainer.PipelineDepth, d.captures, "one graph per staging slot")
					assert.Equal(t, len(bs)-1, d.replays)
					assert.Equal(t, []int{2, 2, 2, 2, 2, 2, 1}, late, "two steps late, the last ones at the flush")
				}
				if kind == "staged" || kind == "pipelined" {
					// a step has at most 5 copies: images, labels, scalars, loss, correct
					assert.LessOrEqual(t, d.asyncs, 5, "only the first step's copies are queued outside the graphs")
				}
				if kind == "pipelined without graphs" {
					assert.Equal(t, []int{2, 2, 2, 2, 2, 2, 1}, late)
				}
				require.NoError(t, s.Close())
				if kind != "queued" && kind != "graphs" {
					assert.Equal(t, d.lent, d.freed, "staging memory freed")
				}
			})
		}
	}
}

// Batches reach the device through page-locked staging when the device
// lends it: allocated once, freed with the session; a partial batch's
// padding is zero (the lent memory is not), and the scalar block says how
// many samples are real.
func TestSessionStagesInHostMemory(t *testing.T) {
	m := trainertest.Tiny(t)
	d := newPipelined(t, m)
	s, err := trainer.NewSession(m.Spec, d.staged, 2)
	require.NoError(t, err)
	plain := m.Session(t, 2)
	bs := someBatches(m, 3)
	bs[2] = partial(m, bs[2], 3)
	stepAlike(t, s, plain, bs)
	assert.Equal(t, 1, d.lent, "one staging slot, allocated once")
	sp := m.Spec
	read := func(tn trainer.Tensor, n int) []byte {
		b := make([]byte, n)
		require.NoError(t, d.CopyOut(b, trainer.ArenaAddr(s, tn.Arena, tn.Offset)))
		return b
	}
	const size = 6 * 6
	px := read(sp.Train.Images, sp.Batch*size)
	assert.Equal(t, bs[2].Pixels, px[:3*size])
	assert.Equal(t, make([]byte, (sp.Batch-3)*size), px[3*size:], "padding pixels are zero")
	assert.Equal(t, make([]byte, 4*(sp.Batch-3)), read(sp.Train.Labels, 4*sp.Batch)[4*3:], "padding labels are zero")
	sc := read(trainer.Tensor{Offset: sp.Scalars}, device.StepScalarsBytes)
	assert.Equal(t, device.StepScalars{Step: 2, Seed: 2, Valid: 3, LR: s.LR}.Bytes(), sc)
	require.NoError(t, s.Close())
	assert.Equal(t, 1, d.freed)
}

// A graph that cannot be captured is reported once and the session goes
// on launching kernel by kernel, with the same results; with no Warnf the
// step fails instead.
func TestSessionFallsBackWhenGraphsFail(t *testing.T) {
	m := trainertest.TinyAdamDropout(t)
	bs := someBatches(m, 4)
	d := newPipelined(t, m)
	d.failWith = fmt.Errorf("no graphs today")
	g, err := trainer.NewSession(m.Spec, d, 2)
	require.NoError(t, err)
	defer g.Close()
	g.UseGraphs = true
	var warnings []string
	g.Warnf = func(format string, args ...any) { warnings = append(warnings, fmt.Sprintf(format, args...)) }
	plain := m.Session(t, 2)
	submitAlike(t, g, plain, bs)
	require.Len(t, warnings, 1)
	assert.Contains(t, warnings[0], "no graphs today; launching kernels one by one")
	assert.False(t, g.UseGraphs)

	strict, err := trainer.NewSession(m.Spec, d, 2)
	require.NoError(t, err)
	defer strict.Close()
	strict.UseGraphs = true
	_, _, err = strict.TrainStep(bs[0])
	require.NoError(t, err, "the first step runs kernel by kernel")
	_, _, err = strict.TrainStep(bs[1])
	assert.ErrorContains(t, err, "no graphs today")
}

// A done function's error comes back from the call that ran it — a later
// Submit, whose own batch is then not queued, or Flush — and the steps
// still in flight keep their results for the next Flush.
func TestSessionDoneErrors(t *testing.T) {
	m := trainertest.Tiny(t)
	s, err := trainer.NewSession(m.Spec, newPipelined(t, m), 2)
	require.NoError(t, err)
	defer s.Close()
	s.UseGraphs = true
	bs := someBatches(m, 4)
	stop := errors.New("stop")
	var seen []int64
	done := func(r trainer.StepResult) error {
		seen = append(seen, r.Step)
		if r.Step == 1 {
			return stop
		}
		return nil
	}
	require.NoError(t, s.Submit(bs[0], done))
	require.NoError(t, s.Submit(bs[1], done))
	assert.ErrorIs(t, s.Submit(bs[2], done), stop, "step 1's result arrives here")
	assert.Equal(t, int64(2), s.Step, "the third batch was not queued")
	require.NoError(t, s.Flush())
	assert.Equal(t, []int64{1, 2}, seen)
}

// With TraceGaps every step has its time, and from the second on the host
// gap before it: device time from the fences on a pipelined device, the
// host clock on the emulator.
func TestSessionTracesHostGaps(t *testing.T) {
	m := trainertest.Tiny(t)
	for _, kind := range []string{"pipelined", "emulator"} {
		t.Run(kind, func(t *testing.T) {
			var dev device.Device = cpuDevice(t, m)
			if kind == "pipelined" {
				dev = newPipelined(t, m)
			}
			s, err := trainer.NewSession(m.Spec, dev, 2)
			require.NoError(t, err)
			defer s.Close()
			s.UseGraphs, s.TraceGaps = true, true
			var rs []trainer.StepResult
			for _, b := range someBatches(m, 5) {
				require.NoError(t, s.Submit(b, func(r trainer.StepResult) error { rs = append(rs, r); return nil }))
			}
			require.NoError(t, s.Flush())
			require.Len(t, rs, 5)
			for i, r := range rs {
				assert.True(t, r.Timed, "step %d", i)
				assert.Equal(t, i > 0, r.HasGap, "step %d", i)
				assert.GreaterOrEqual(t, r.Gap, time.Duration(0), "step %d", i)
				assert.Greater(t, r.Time, time.Duration(0), "step %d", i)
			}
		})
	}
}

// The loop on a pipelined device trains as on the emulator, though its
// losses arrive late: the same losses at every step, the same parameters
// at the end, a save after each epoch, and an interrupted run resumes to
// the same end.
func TestLoopOnAPipelinedDevice(t *testing.T) {
	m := trainertest.TinyAdamDropout(t)
	ds := trainertest.Data(m.Spec, 22, 3) // 6 batches per epoch, the last partial
	run := func(sess *trainer.Session, ctx context.Context, start trainer.Position, onStep func(*trainer.StepMetrics) error) ([]float32, trainer.Result, *saves) {
		loop, sv := newLoop(sess, ds, 2)
		var losses []float32
		var last int64
		loop.Start = start
		loop.OnStep = func(s *trainer.StepMetrics) error {
			losses = append(losses, s.Loss)
			if last > 0 {
				assert.Equal(t, last+1, s.Step, "in order")
			}
			last = s.Step
			if onStep != nil {
				return onStep(s)
			}
			return nil
		}
		res, err := loop.Run(ctx)
		require.NoError(t, err)
		return losses, res, sv
	}
	plain := m.Session(t, 4)
	wantLosses, _, wantSaves := run(plain, context.Background(), trainer.Position{}, nil)

	piped, err := trainer.NewSession(m.Spec, newPipelined(t, m), 4)
	require.NoError(t, err)
	defer piped.Close()
	piped.UseGraphs = true
	gotLosses, _, gotSaves := run(piped, context.Background(), trainer.Position{}, nil)
	assert.Equal(t, wantLosses, gotLosses)
	assert.Equal(t, wantSaves.at, gotSaves.at)
	assert.Equal(t, wantSaves.steps, gotSaves.steps)
	sameState(t, plain, piped)

	// interrupted when step 2's loss arrives (while step 4 is submitted):
	// the save is where the submitted steps end
	part, err := trainer.NewSession(m.Spec, newPipelined(t, m), 4)
	require.NoError(t, err)
	defer part.Close()
	part.UseGraphs = true
	ctx, cancel := context.WithCancel(context.Background())
	_, res, sv := run(part, ctx, trainer.Position{}, func(s *trainer.StepMetrics) error {
		if s.Step == 2 {
			cancel()
		}
		return nil
	})
	assert.Equal(t, trainer.Interrupted, res.Stop)
	assert.Equal(t, int64(4), part.Step)
	require.Len(t, sv.at, 1)
	assert.Equal(t, int64(sv.at[0].Batch), part.Step, "the checkpoint's position is after every submitted step")
	run(part, context.Background(), res.At, nil)
	sameState(t, plain, part)
}

// The loop's guarantees hold with losses arriving late: an OnStep error
// stops the run after saving where the submitted steps end; an exploding
// loss, or an update that wrecks the parameters, never reaches a
// checkpoint.
func TestLoopGuaranteesOnAPipelinedDevice(t *testing.T) {
	m := trainertest.TinyAdamDropout(t)
	ds := trainertest.Data(m.Spec, 22, 3) // 6 batches per epoch
	session := func() *trainer.Session {
		s, err := trainer.NewSession(m.Spec, newPipelined(t, m), 4)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		s.UseGraphs = true
		return s
	}

	sess := session()
	loop, sv := newLoop(sess, ds, 2)
	full := errors.New("disk full")
	loop.OnStep = func(s *trainer.StepMetrics) error {
		if s.Step == 2 { // arrives while the fourth batch is submitted, which then is not
			return full
		}
		return nil
	}
	_, err := loop.Run(context.Background())
	assert.ErrorIs(t, err, full)
	assert.Equal(t, []trainer.Position{{Batch: 3}}, sv.at)
	assert.Equal(t, []int64{3}, sv.steps)

	sess = session()
	sess.LR = 50
	loop, sv = newLoop(sess, ds, 3)
	_, err = loop.Run(context.Background())
	var div *trainer.DivergedError
	require.ErrorAs(t, err, &div)
	assert.Empty(t, sv.at)

	sess = session()
	loop, sv = newLoop(sess, ds, 2)
	loop.OnStep = func(s *trainer.StepMetrics) error {
		if s.Step == 9 { // steps submitted from now on (11, 12: epoch 2's last) use it
			sess.LR = 1e30
		}
		return nil
	}
	_, err = loop.Run(context.Background())
	require.ErrorAs(t, err, &div)
	assert.Equal(t, []trainer.Position{{Epoch: 1}}, sv.at, "only epoch 1's checkpoint: %v", err)
}
