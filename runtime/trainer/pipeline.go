package trainer

// The host loop. A training step is: the batch and the step's scalars
// (device.StepScalars: learning rate, step, seed, valid count) written
// into a staging buffer, copied into the arena, the step's launches, and
// the loss and correct count copied back. Kernels read the scalars from
// their block in the arena, so no launch argument ever changes between
// steps and a step captured as a graph is replayed as it is.
//
// On a device that can — page-locked memory, asynchronous copies and
// fences (device.HostAllocator, AsyncCopier, Fencer: the CUDA backend) —
// steps are pipelined over two staging slots: the host writes the next
// batch into slot k while the step of slot 1-k runs, and waits only for
// the step that used slot k last, two steps back; that step's loss and
// correct count are in slot k by then and go to its done function. With
// graphs (device.Grapher) each slot's step is one graph, captured once:
// copies in from the slot, the launches, copies out to the slot, and the
// slot's fence, so that a steady-state step costs the host two driver
// calls — one wait, one graph launch (see runtime/cuda's driver-call test
// for why that is the least).
//
// Elsewhere (the CPU emulator) the same code runs with one slot and a
// synchronisation per step, and results arrive at once.

import (
	"encoding/binary"
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"sort"
	"time"

	"github.com/cnnc/cnnc/runtime/device"
)

// PipelineDepth is the number of staging slots of a pipelined session: the
// steps that may be queued on the device at once, and how many steps late
// a result may arrive.
const PipelineDepth = 2

// StepResult is what a training step gave.
type StepResult struct {
	Step    int64   // the step's 1-based number: steps submitted up to and including it
	Loss    float32 // the batch's mean loss, before the step's update
	Correct int     // correct predictions, before the update
	Valid   int     // samples of the batch that are real
	// Samples are the real samples the loss and correct count are over:
	// Valid, or on a data-parallel rank the global batch's.
	Samples int
	// Input is the batch trained on, valid while the done function runs.
	Input Batch
	// With Session.TraceGaps, Gap is how long the device had nothing to
	// do between the previous step's end and this step's start (the host
	// gap), and Time the step's own time; from the device's fences (CUDA
	// events) where it has them, else from the host's clock around the
	// synchronous step. Timed says they are set, HasGap that Gap is (it
	// needs a traced step before).
	Gap, Time     time.Duration
	Timed, HasGap bool
}

// transfer is one copy between a staging buffer and an arena.
type transfer struct {
	arena Arena
	dev   int64 // offset in the arena
	host  int   // offset in the staging buffer
	n     int
}

// stepIO is where a step's inputs and results sit in a staging buffer, and
// the copies that move them.
type stepIO struct {
	batch                   int // samples the step's kernels take
	pixels, labels, scalars int // offsets in the staging buffer
	loss, correct           int
	hasLabels               bool // the step reads labels (not an inference build's)
	in, out                 []transfer
	bytes                   int
}

// maxResultGap is the farthest apart the loss and the correct count may be
// for one copy to read both back (and the bytes between, ignored).
const maxResultGap = 4096

// newStepIO lays out st's staging buffer for batch samples: the images,
// the labels and the step's scalar block, each copied by a transfer of its
// own unless it directly follows another in the same arena (one transfer
// then carries both), then the loss and the correct count.
func newStepIO(sp *Spec, st Step, batch int) stepIO {
	io := stepIO{batch: batch}
	type region struct {
		arena Arena
		off   int64
		n     int
		at    *int
	}
	ins := []region{
		{st.Images.Arena, st.Images.Offset, batch * sp.H * sp.W * sp.C, &io.pixels},
		{TrainArena, sp.Scalars, device.StepScalarsBytes, &io.scalars},
	}
	if io.hasLabels = st.Labels.Shape != nil; io.hasLabels { // an inference build reads none
		ins = append(ins, region{st.Labels.Arena, st.Labels.Offset, 4 * batch, &io.labels})
	}
	sort.Slice(ins, func(i, j int) bool {
		if ins[i].arena != ins[j].arena {
			return ins[i].arena < ins[j].arena
		}
		return ins[i].off < ins[j].off
	})
	host := 0
	for _, r := range ins {
		if k := len(io.in) - 1; k >= 0 && io.in[k].arena == r.arena && io.in[k].dev+int64(io.in[k].n) == r.off {
			*r.at = host
			io.in[k].n += r.n
			host += r.n
			continue
		}
		host = align8(host)
		*r.at = host
		io.in = append(io.in, transfer{r.arena, r.off, host, r.n})
		host += r.n
	}
	host = align8(host)
	lo, hi := st.Loss, st.Correct
	if lo.Arena == hi.Arena && abs64(lo.Offset-hi.Offset) <= maxResultGap {
		first := min(lo.Offset, hi.Offset)
		n := int(max(lo.Offset, hi.Offset)-first) + 4
		io.loss, io.correct = host+int(lo.Offset-first), host+int(hi.Offset-first)
		io.out = []transfer{{lo.Arena, first, host, n}}
		host += n
	} else {
		io.loss, io.correct = host, host+4
		io.out = []transfer{{lo.Arena, lo.Offset, host, 4}, {hi.Arena, hi.Offset, host + 4, 4}}
		host += 8
	}
	io.bytes = host
	return io
}

func align8(n int) int { return (n + 7) &^ 7 }

func abs64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// put writes b, padded to io.batch samples of n bytes, and sc into buf.
func (io *stepIO) put(buf []byte, b Batch, n int, sc device.StepScalars) {
	px := buf[io.pixels : io.pixels+io.batch*n]
	clear(px[copy(px, b.Pixels):]) // a partial batch's padding is zero
	if io.hasLabels {
		lb := buf[io.labels : io.labels+4*io.batch]
		for i, l := range b.Labels {
			binary.LittleEndian.PutUint32(lb[4*i:], uint32(l))
		}
		clear(lb[4*len(b.Labels):])
	}
	sc.Put(buf[io.scalars:])
}

// results reads the loss and correct count from buf.
func (io *stepIO) results(buf []byte) (float32, int) {
	loss := math.Float32frombits(binary.LittleEndian.Uint32(buf[io.loss:]))
	correct := math.Float32frombits(binary.LittleEndian.Uint32(buf[io.correct:]))
	return loss, int(correct)
}

// checkBatch refuses a batch that does not fit batch samples of the model.
func (s *Session) checkBatch(b Batch, batch int) error {
	sp := s.Spec
	n := sp.H * sp.W * sp.C
	if b.Valid < s.minValid() || b.Valid > batch || len(b.Pixels) != b.Valid*n || len(b.Labels) != b.Valid {
		return fmt.Errorf("trainer: a batch of %d valid samples needs %d pixels and %d labels, got %d and %d (compiled batch %d)",
			b.Valid, b.Valid*n, b.Valid, len(b.Pixels), len(b.Labels), batch)
	}
	for i, l := range b.Labels {
		if l < 0 || int(l) >= sp.Classes {
			return fmt.Errorf("trainer: label %d of sample %d is outside [0,%d)", l, i, sp.Classes)
		}
	}
	return nil
}

// minValid: a batch's fewest samples; a data-parallel rank's share of a
// partial last batch may be empty.
func (s *Session) minValid() int {
	if s.reducer != nil {
		return 0
	}
	return 1
}

// scalars are the step scalars of the next training step for valid samples.
func (s *Session) scalars(valid int) device.StepScalars {
	return device.StepScalars{Step: s.Step, Seed: s.Seed, Valid: int64(valid), LR: s.StepLR()}
}

// allocStaging returns n bytes of staging memory: page-locked on devices
// that have it (device.HostAllocator), whose contents are left from before
// (callers write what they use).
func (s *Session) allocStaging(n int) ([]byte, error) {
	if ha, ok := s.Dev.(device.HostAllocator); ok {
		b, err := ha.AllocHost(n)
		if err != nil {
			return nil, fmt.Errorf("trainer: page-locked staging memory of %d bytes: %w", n, err)
		}
		return b, nil
	}
	return make([]byte, n), nil
}

func (s *Session) freeStaging(b []byte) error {
	if ha, ok := s.Dev.(device.HostAllocator); ok && b != nil {
		return ha.FreeHost(b[:cap(b)])
	}
	return nil
}

// syncStaging is the staging buffer of synchronous uploads (evaluation,
// prediction, profiles), at least n bytes: one serves them all, because
// a synchronous copy has read it when it returns.
func (s *Session) syncStaging(n int) ([]byte, error) {
	if cap(s.staging) < n {
		if err := s.freeStaging(s.staging); err != nil {
			return nil, err
		}
		s.staging = nil
		b, err := s.allocStaging(n)
		if err != nil {
			return nil, err
		}
		s.staging = b
	}
	return s.staging[:n], nil
}

func (s *Session) upload(st Step, b Batch) error {
	return s.uploadAs(st, b, s.Spec.Batch)
}

// uploadAs copies b into st's inputs, padded to batch samples, and the
// scalars of the next training step (b.Valid real samples) into the
// scalar block, synchronously.
func (s *Session) uploadAs(st Step, b Batch, batch int) error {
	if err := s.checkBatch(b, batch); err != nil {
		return err
	}
	io := newStepIO(s.Spec, st, batch)
	buf, err := s.syncStaging(io.bytes)
	if err != nil {
		return err
	}
	io.put(buf, b, s.Spec.H*s.Spec.W*s.Spec.C, s.scalars(b.Valid))
	for _, t := range io.in {
		if err := s.Dev.CopyIn(s.addr(t.arena, t.dev), buf[t.host:t.host+t.n]); err != nil {
			return err
		}
	}
	return nil
}

// run launches st and waits for it. (valid is in the scalar block, which
// upload wrote.)
func (s *Session) run(st Step, valid int) error {
	if err := s.launch(st.Launches); err != nil {
		return err
	}
	return s.Dev.Sync()
}

// launch queues launches.
func (s *Session) launch(ls []Launch) error {
	for _, l := range ls {
		s.params = s.args(l, s.params[:0])
		if err := s.Dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, s.params); err != nil {
			return err
		}
	}
	return nil
}

// args appends l's parameter values to dst: the same at every step.
func (s *Session) args(l Launch, dst []uint64) []uint64 {
	for _, a := range l.Args {
		var v uint64
		switch a.Kind {
		case kernelarg.Buffer:
			v = uint64(s.addr(a.Arena, a.Offset))
		case kernelarg.Int:
			v = uint64(a.Int)
		case kernelarg.Float:
			v = uint64(math.Float32bits(a.Float))
		case kernelarg.Scalars:
			v = uint64(s.addr(TrainArena, s.Spec.Scalars))
		}
		dst = append(dst, v)
	}
	return dst
}

func (s *Session) readScalars(st Step) (float32, int, error) {
	loss, err := s.ReadTensor(st.Loss)
	if err != nil {
		return 0, 0, err
	}
	correct, err := s.ReadTensor(st.Correct)
	if err != nil {
		return 0, 0, err
	}
	return loss[0], int(correct[0]), nil
}

// slot is a staging buffer of the training step and the step queued
// from it.
type slot struct {
	buf    []byte // the inputs and results (stepIO), page-locked when the device has it
	io     stepIO
	fence  device.Fence    // marks the end of the slot's step (pipelined sessions)
	graph  device.Replayer // the slot's step as a graph, once captured
	labels []int32         // the batch's labels, for StepResult.Input
	busy   bool            // a step was queued from the slot and its result not delivered
	step   int64           // its 0-based number
	valid  int             // its real samples
	global int             // the samples its loss is over (StepResult.Samples)
	done   func(StepResult) error
}

// Pipelined says whether the session queues steps PipelineDepth deep
// (and times them with the device's fences under TraceGaps): the device
// has page-locked memory, asynchronous copies and fences.
func (s *Session) Pipelined() bool {
	_, ha := s.Dev.(device.HostAllocator)
	_, ac := s.Dev.(device.AsyncCopier)
	_, f := s.Dev.(device.Fencer)
	return ha && ac && f
}

// asyncCopier is the device's asynchronous copies when the staging
// buffers are page-locked (the copies can then travel inside graphs), or
// nil: copies are then synchronous, before the launches and after the
// wait.
func (s *Session) asyncCopier() device.AsyncCopier {
	ac, async := s.Dev.(device.AsyncCopier)
	if _, pinned := s.Dev.(device.HostAllocator); !async || !pinned {
		return nil
	}
	return ac
}

// ensureSlots makes the staging slots at the first step: PipelineDepth
// of them, each with a fence, on a pipelined device, else one.
func (s *Session) ensureSlots() error {
	if s.slots != nil {
		return nil
	}
	depth := 1
	if s.Pipelined() {
		depth = PipelineDepth
	}
	slots := make([]slot, depth)
	io := newStepIO(s.Spec, s.Spec.Train, s.Spec.Batch)
	for i := range slots {
		sl := &slots[i]
		sl.io = io
		var err error
		sl.buf, err = s.allocStaging(io.bytes)
		if err == nil && depth > 1 {
			sl.fence, err = s.Dev.(device.Fencer).NewFence(false)
		}
		if err != nil {
			s.slots = slots[:i+1]
			s.closeSlots()
			return err
		}
	}
	s.slots = slots
	return nil
}

// Submit queues a training step on b (forward, backward, update) and
// returns; done is called with the step's result once it is known, in
// step order: on a device that runs steps synchronously before Submit
// returns, else during a later Submit (at most PipelineDepth steps later)
// or Flush. An error from done is returned by the call that ran it; when
// that is a later Submit, its own batch is then not queued (Session.Step
// says what was).
func (s *Session) Submit(b Batch, done func(StepResult) error) error {
	s.evalFolded = false // the step changes the parameters and the arena's temporary space
	if err := s.checkBatch(b, s.Spec.Batch); err != nil {
		return err
	}
	valid, err := s.stepValid(b)
	if err != nil {
		return err
	}
	if err := s.ensureSlots(); err != nil {
		return err
	}
	sl := &s.slots[s.next]
	if sl.busy {
		if err := s.collect(sl); err != nil {
			return err
		}
	}
	sl.io.put(sl.buf, b, s.Spec.H*s.Spec.W*s.Spec.C, s.scalars(valid))
	sl.labels = append(sl.labels[:0], b.Labels...)
	sl.step, sl.valid, sl.global, sl.done = s.Step, b.Valid, valid, done
	if err := s.queue(sl); err != nil {
		return fmt.Errorf("step %d: %w", s.Step, err)
	}
	sl.busy = true
	s.Step++
	s.next = (s.next + 1) % len(s.slots)
	if len(s.slots) == 1 {
		return s.collect(sl)
	}
	return nil
}

// Flush waits for every submitted step and calls their done functions,
// oldest first.
func (s *Session) Flush() error {
	for i := range s.slots {
		if sl := &s.slots[(s.next+i)%len(s.slots)]; sl.busy {
			if err := s.collect(sl); err != nil {
				return err
			}
		}
	}
	return nil
}

// TrainStep runs one training step (forward, backward, update) on b and
// returns the batch's mean loss and correct predictions: Submit and Flush
// (steps submitted before get their results too).
func (s *Session) TrainStep(b Batch) (loss float32, correct int, err error) {
	err = s.Submit(b, func(r StepResult) error {
		loss, correct = r.Loss, r.Correct
		return nil
	})
	if err == nil {
		err = s.Flush()
	}
	return loss, correct, err
}

// queue queues sl's step on the device: as the slot's graph when graphs
// are on and the step's kernels have run once outside a capture (loaded,
// their shared memory limits raised), else copy by copy and launch by
// launch.
func (s *Session) queue(sl *slot) error {
	ac := s.asyncCopier()
	tr := s.traceStart(sl.step)
	if g, ok := s.Dev.(device.Grapher); ok && s.UseGraphs && s.warm {
		replayed, err := s.replayGraph(g, sl, ac)
		if err != nil {
			return err
		}
		if replayed {
			return s.traceEnd(tr)
		}
	}
	if err := s.enqueue(sl, ac, false); err != nil {
		return err
	}
	s.warm = true
	return s.traceEnd(tr)
}

// enqueue queues sl's step: the copies in, the launches, the copies out
// and the fence. Without asynchronous copies the copies in are made
// synchronously here (unless capturing: the replay makes them) and the
// results are read after the wait.
func (s *Session) enqueue(sl *slot, ac device.AsyncCopier, capturing bool) error {
	for _, t := range sl.io.in {
		var err error
		switch {
		case ac != nil:
			err = ac.CopyInAsync(s.addr(t.arena, t.dev), sl.buf[t.host:t.host+t.n])
		case !capturing:
			err = s.Dev.CopyIn(s.addr(t.arena, t.dev), sl.buf[t.host:t.host+t.n])
		}
		if err != nil {
			return err
		}
	}
	if err := s.launchTrain(); err != nil {
		return err
	}
	if ac != nil {
		for _, t := range sl.io.out {
			if err := ac.CopyOutAsync(sl.buf[t.host:t.host+t.n], s.addr(t.arena, t.dev)); err != nil {
				return err
			}
		}
	}
	if sl.fence != nil {
		return sl.fence.Record()
	}
	return nil
}

// replayGraph queues sl's step as its graph, capturing it the first time.
// A graph that cannot be captured is reported through Warnf, when set,
// and the session goes on without graphs (replayed false); without Warnf
// the step fails.
func (s *Session) replayGraph(g device.Grapher, sl *slot, ac device.AsyncCopier) (replayed bool, err error) {
	if sl.graph == nil {
		if err := s.settle(); err != nil { // nothing runs while a capture records
			return false, err
		}
		r, err := g.CaptureGraph(func() error { return s.enqueue(sl, ac, true) })
		if err != nil {
			err = fmt.Errorf("capturing the training step as a CUDA graph: %w", err)
			if s.Warnf == nil {
				return false, err
			}
			s.Warnf("%v; launching kernels one by one", err)
			s.UseGraphs = false
			return false, s.dropGraphs()
		}
		sl.graph = r
	}
	if ac == nil {
		for _, t := range sl.io.in {
			if err := s.Dev.CopyIn(s.addr(t.arena, t.dev), sl.buf[t.host:t.host+t.n]); err != nil {
				return false, err
			}
		}
	}
	return true, sl.graph.Replay()
}

// wait returns when sl's step has finished and its results are in sl.buf.
func (s *Session) wait(sl *slot) error {
	if sl.fence != nil {
		if err := sl.fence.Wait(); err != nil {
			return err
		}
	} else if err := s.Dev.Sync(); err != nil {
		return err
	}
	if s.asyncCopier() == nil {
		for _, t := range sl.io.out {
			if err := s.Dev.CopyOut(sl.buf[t.host:t.host+t.n], s.addr(t.arena, t.dev)); err != nil {
				return err
			}
		}
	}
	return nil
}

// collect waits for sl's step and gives its result to its done function.
func (s *Session) collect(sl *slot) error {
	sl.busy = false
	done := sl.done
	sl.done = nil
	if err := s.wait(sl); err != nil {
		return fmt.Errorf("step %d: %w", sl.step, err)
	}
	loss, correct := sl.io.results(sl.buf)
	n := s.Spec.H * s.Spec.W * s.Spec.C
	r := StepResult{Step: sl.step + 1, Loss: loss, Correct: correct, Valid: sl.valid, Samples: sl.global,
		Input: Batch{Pixels: sl.buf[sl.io.pixels : sl.io.pixels+sl.valid*n], Labels: sl.labels[:sl.valid], Valid: sl.valid}}
	if err := s.traceResult(sl.step, &r); err != nil {
		return err
	}
	if done == nil {
		return nil
	}
	return done(r)
}

// settle waits for every queued step, keeping their results for collect.
func (s *Session) settle() error {
	for i := range s.slots {
		if sl := &s.slots[i]; sl.busy {
			if err := s.wait(sl); err != nil {
				return err
			}
		}
	}
	return nil
}

// dropGraphs destroys the slots' graphs.
func (s *Session) dropGraphs() error {
	var first error
	for i := range s.slots {
		if g := s.slots[i].graph; g != nil {
			s.slots[i].graph = nil
			if err := g.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// closeSlots waits for the queued steps (their results are dropped) and
// frees the slots.
func (s *Session) closeSlots() error {
	errs := []error{s.settle(), s.dropGraphs()}
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.fence != nil {
			errs = append(errs, sl.fence.Close())
		}
		errs = append(errs, s.freeStaging(sl.buf))
	}
	s.slots = nil
	for _, m := range s.marks {
		for _, f := range []device.Fence{m.start, m.end} {
			if f != nil {
				errs = append(errs, f.Close())
			}
		}
	}
	s.marks = nil
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// mark times one traced step: fences around its queued work, or the
// host's clock around a synchronous step.
type mark struct {
	step       int64
	start, end device.Fence
	t0, t1     time.Time
}

// traceStart begins timing step (Session.TraceGaps), or returns nil.
func (s *Session) traceStart(step int64) *mark {
	if !s.TraceGaps {
		return nil
	}
	if s.marks == nil {
		// a mark is read when its step is collected, which is before
		// the step PipelineDepth+1 later reuses it, and the previous
		// step's mark with it (for the gap)
		s.marks = make([]mark, PipelineDepth+1)
		s.traceFrom = step
	}
	m := &s.marks[step%int64(len(s.marks))]
	m.step = step
	if fr, ok := s.Dev.(device.Fencer); ok && s.Pipelined() {
		if m.start == nil {
			var err error
			if m.start, err = fr.NewFence(true); err == nil {
				m.end, err = fr.NewFence(true)
			}
			if err != nil {
				return nil
			}
		}
		if m.start.Record() != nil {
			return nil
		}
		return m
	}
	m.t0 = time.Now()
	return m
}

// traceEnd marks the end of a traced step's queued work.
func (s *Session) traceEnd(m *mark) error {
	if m == nil || m.end == nil {
		return nil
	}
	return m.end.Record()
}

// traceResult sets r's times when step was traced.
func (s *Session) traceResult(step int64, r *StepResult) error {
	if s.marks == nil || step < s.traceFrom {
		return nil
	}
	m := &s.marks[step%int64(len(s.marks))]
	if m.step != step {
		return nil
	}
	prev := &s.marks[(step+int64(len(s.marks))-1)%int64(len(s.marks))]
	hasPrev := step > s.traceFrom && prev.step == step-1
	if m.end != nil {
		if err := m.end.Wait(); err != nil {
			return err
		}
		var err error
		if r.Time, err = m.end.Since(m.start); err != nil {
			return err
		}
		if hasPrev && prev.end != nil {
			if r.Gap, err = m.start.Since(prev.end); err != nil {
				return err
			}
		}
	} else {
		m.t1 = time.Now()
		r.Time = m.t1.Sub(m.t0)
		if hasPrev {
			r.Gap = m.t0.Sub(prev.t1)
		}
	}
	r.Timed, r.HasGap = true, hasPrev
	return nil
}
