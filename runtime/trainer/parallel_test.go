package trainer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A spec's data-parallel side that does not fit its step is refused before
// anything runs; a session of a one-device spec cannot become a rank.
// (The rank's step itself: TestDataParallelRanksEqualAccumulate in
// codegen/trainergen and TestBuiltDataParallelTrainer in cmd/cnnc.)
func TestSpecChecksTheDataParallelSide(t *testing.T) {
	m := trainertest.Tiny(t)
	intArg := -1
	for i, a := range m.Spec.Train.Launches[0].Args {
		if a.Kind != kernelarg.Int {
			intArg = i
		}
	}
	good := trainer.DataParallel{Ranks: 2, GlobalBatch: 2 * m.Spec.Batch, ReduceAfter: 1,
		Buckets: []trainer.Bucket{{Offset: m.Spec.Params[0].Offset, Bytes: 8, ReadyAfter: 1, NeededAt: 1}}}
	sp := *m.Spec
	sp.DataParallel = &good
	require.NoError(t, sp.Validate())
	one := trainer.DataParallel{Ranks: 1, GlobalBatch: m.Spec.Batch, ReduceAfter: 1, Buckets: good.Buckets}
	sp.DataParallel = &one // cnnc build --gpus 1 --data-parallel
	require.NoError(t, sp.Validate())
	for name, c := range map[string]struct {
		edit func(*trainer.DataParallel)
		want string
	}{
		"no rank":                    {func(d *trainer.DataParallel) { d.Ranks = 0 }, "do not make the global batch"},
		"one rank of the batch 2B":   {func(d *trainer.DataParallel) { d.Ranks = 1 }, "do not make the global batch"},
		"global batch":               {func(d *trainer.DataParallel) { d.GlobalBatch++ }, "do not make the global batch"},
		"reduce after":               {func(d *trainer.DataParallel) { d.ReduceAfter = len(m.Spec.Train.Launches) + 1 }, "the all-reduce after launch"},
		"bucket outside":             {func(d *trainer.DataParallel) { d.Buckets[0].Offset = m.Spec.ArenaBytes - 4 }, "is not float32 values inside the arena"},
		"bucket of 6 bytes":          {func(d *trainer.DataParallel) { d.Buckets[0].Bytes = 6 }, "is not float32 values inside the arena"},
		"bucket read before written": {func(d *trainer.DataParallel) { d.Buckets[0].NeededAt = 0 }, "is written by launch 0 and read by launch 0"},
		"bucket never written":       {func(d *trainer.DataParallel) { d.Buckets[0].ReadyAfter = 0 }, "is written by launch -1"},
		"buckets out of order": {func(d *trainer.DataParallel) {
			d.Buckets = append(d.Buckets, trainer.Bucket{Offset: d.Buckets[0].Offset, Bytes: 4, ReadyAfter: 0, NeededAt: 1})
		}, "bucket 1 is complete before bucket 0"},
		"first argument": {func(d *trainer.DataParallel) {
			d.FirstArgs = []trainer.FirstArg{{Launch: 0, Arg: intArg, PerSample: 1}}
		}, "is no integer argument"},
	} {
		d := good
		d.Buckets = append([]trainer.Bucket{}, good.Buckets...)
		c.edit(&d)
		sp.DataParallel = &d
		assert.ErrorContains(t, sp.Validate(), c.want, name)
	}

	s := m.Session(t, 1)
	assert.ErrorContains(t, s.SetParallel(0, nilReducer{}), "was not compiled for data-parallel ranks")
}

type nilReducer struct{}

func (nilReducer) AllReduce(device.Ptr, int) error { return nil }

// On a device with a second stream and a reducer that queues on it, a
// rank's step queues each bucket's all-reduce there right after the
// launch that completes the bucket, behind the device's work so far, and
// marks it; the device's stream waits for the mark right before the
// bucket's first reader, or at the step's end when only the host reads
// it. Without a stream-queuing reducer the buckets are summed from the
// host after the backward pass, as on the CPU target. (The same order in
// the CUDA driver's calls: TestDataParallelOnDevices in runtime/cuda.)
func TestOverlappedStepOrder(t *testing.T) {
	m := trainertest.Tiny(t)
	n := len(m.Spec.Train.Launches)
	require.GreaterOrEqual(t, n, 3)
	sp := *m.Spec
	at := sp.Params[0].Offset
	sp.DataParallel = &trainer.DataParallel{Ranks: 2, GlobalBatch: 2 * sp.Batch, ReduceAfter: n - 1,
		Buckets: []trainer.Bucket{{Offset: at, Bytes: 8, ReadyAfter: 1, NeededAt: n - 1}, {Offset: at + 8, Bytes: 12, ReadyAfter: n - 1, NeededAt: n}}}
	b := trainertest.RandomBatch(&sp, sp.Batch, rand.New(rand.NewPCG(1, 2)))
	b.GlobalValid = 2 * sp.Batch

	step := func(r trainer.Reducer) []string {
		dev, err := m.Backends["cpu"](&sp)
		require.NoError(t, err)
		defer dev.Close()
		rec := &recordingDevice{Device: dev}
		s, err := trainer.NewSession(&sp, rec, 1)
		require.NoError(t, err)
		rec.log = nil // the parameters' initialisation
		if rr, ok := r.(*recordingReducer); ok {
			rr.log = &rec.log
		} else {
			r.(*hostReducer).log = &rec.log
		}
		require.NoError(t, s.SetParallel(1, r))
		_, _, err = s.TrainStep(b)
		require.NoError(t, err)
		require.NoError(t, s.Close())
		return rec.log
	}

	var want []string
	for i := range n {
		switch i {
		case 1:
			want = append(want, "side waits for the device", "all-reduce of 2 on the side stream", "mark 0")
		case n - 1:
			want = append(want, "side waits for the device", "all-reduce of 3 on the side stream", "mark 1", "device waits for mark 0")
		}
		want = append(want, fmt.Sprintf("launch %d", i))
	}
	want = append(want, "device waits for mark 1", "side stream closed")
	assert.Equal(t, want, launchesNamed(step(&recordingReducer{}), m.Spec))

	want = nil
	for i := range n {
		if i == n-1 {
			want = append(want, "host all-reduce of 2", "host all-reduce of 3")
		}
		want = append(want, fmt.Sprintf("launch %d", i))
	}
	assert.Equal(t, want, launchesNamed(step(&hostReducer{}), m.Spec), "a reducer that cannot queue on a stream sums from the host")
}

// launchesNamed numbers the launches of log (the device records kernels).
func launchesNamed(log []string, sp *trainer.Spec) []string {
	out, i := []string{}, 0
	for _, l := range log {
		if k, ok := strings.CutPrefix(l, "kernel "); ok {
			if i < len(sp.Train.Launches) && sp.Train.Launches[i].Kernel == k {
				l = fmt.Sprintf("launch %d", i)
			}
			i++
		}
		out = append(out, l)
	}
	return out
}

// recordingDevice records launches and the side stream's calls.
type recordingDevice struct {
	device.Device
	log []string
}

func (d *recordingDevice) Launch(kernel string, grid, block device.Dim3, shared int, params []uint64) error {
	d.log = append(d.log, "kernel "+kernel)
	return d.Device.Launch(kernel, grid, block, shared, params)
}

func (d *recordingDevice) NewSideStream(marks int) (device.SideStream, error) {
	return &recordingSide{d: d, marks: marks}, nil
}

type recordingSide struct {
	d     *recordingDevice
	marks int
}

func (s *recordingSide) WaitForDevice() error {
	s.d.log = append(s.d.log, "side waits for the device")
	return nil
}

func (s *recordingSide) Run(f func(stream uintptr) error) error { return f(7) }

func (s *recordingSide) Mark(i int) error {
	if i < 0 || i >= s.marks {
		return fmt.Errorf("mark %d of %d", i, s.marks)
	}
	s.d.log = append(s.d.log, fmt.Sprintf("mark %d", i))
	return nil
}

func (s *recordingSide) DeviceWaits(i int) error {
	s.d.log = append(s.d.log, fmt.Sprintf("device waits for mark %d", i))
	return nil
}

func (s *recordingSide) Close() error {
	s.d.log = append(s.d.log, "side stream closed")
	return nil
}

// recordingReducer queues on the stream it is given (and sums nothing:
// one rank's values are their sum).
type recordingReducer struct{ log *[]string }

func (r *recordingReducer) AllReduce(p device.Ptr, count int) error {
	return fmt.Errorf("summed from the host")
}

func (r *recordingReducer) AllReduceOn(stream uintptr, p device.Ptr, count int) error {
	if stream != 7 {
		return fmt.Errorf("queued on stream %d", stream)
	}
	*r.log = append(*r.log, fmt.Sprintf("all-reduce of %d on the side stream", count))
	return nil
}

// hostReducer can only sum from the host.
type hostReducer struct{ log *[]string }

func (r *hostReducer) AllReduce(p device.Ptr, count int) error {
	*r.log = append(*r.log, fmt.Sprintf("host all-reduce of %d", count))
	return nil
}

// Data-parallel ranks agree whether to stop (one all-reduce of a single
// flag) at an epoch's start and every 16th step, not at every step:
// agreeing drains the host loop's pipeline. Over 2 epochs of 37 steps:
// at each epoch's start, and after steps 16, 32 (epoch 1), 48, 64 (epoch
// 2) — 6 agreements; the gradient buckets are summed at every step.
func TestRanksAgreeToStopEvery16Steps(t *testing.T) {
	m := trainertest.Tiny(t)
	n := len(m.Spec.Train.Launches)
	sp := *m.Spec
	at := sp.Params[0].Offset
	sp.DataParallel = &trainer.DataParallel{Ranks: 2, GlobalBatch: 2 * sp.Batch, ReduceAfter: n - 1,
		Buckets: []trainer.Bucket{{Offset: at, Bytes: 8, ReadyAfter: n - 1, NeededAt: n - 1}}}
	dev, err := m.Backends["cpu"](&sp)
	require.NoError(t, err)
	defer dev.Close()
	s, err := trainer.NewSession(&sp, dev, 1)
	require.NoError(t, err)
	defer s.Close()
	var log []string
	require.NoError(t, s.SetParallel(0, &hostReducer{log: &log}))
	const steps = 37
	loop := &trainer.Loop{Session: s, Train: trainertest.Data(&sp, steps*2*sp.Batch, 3), Epochs: 2}
	res, err := loop.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, trainer.Finished, res.Stop)
	require.Equal(t, int64(2*steps), s.Step)
	count := map[string]int{}
	for _, l := range log {
		count[l]++
	}
	assert.Equal(t, map[string]int{"host all-reduce of 2": 2 * steps, "host all-reduce of 1": 6}, count)
}
