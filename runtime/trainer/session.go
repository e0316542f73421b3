package trainer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/initparam"
	"github.com/cnnc/cnnc/runtime/version"
)

// Batch is one step's input. Pixels hold Valid images (uint8 HWC); a
// partial last batch is padded to the compiled batch size and the loss
// kernel ignores the padding.
type Batch struct {
	Pixels []uint8
	Labels []int32
	Valid  int
}

// Session is a model on a device: its arena, parameters and step counter.
type Session struct {
	Spec *Spec
	Dev  device.Device
	// Step counts completed training steps (Adam's bias correction and the
	// dropout RNG read it).
	Step int64
	// LR is the run's base learning rate: what checkpoints store, and what
	// a schedule scales (Loop sets each step's rate with SetStepLR).
	// Without a schedule the kernels use it as it is.
	LR   float32
	Seed uint64
	// stepLR is the rate the next training step's kernels use, when
	// hasStepLR (SetStepLR); else LR.
	stepLR    float32
	hasStepLR bool

	// UseGraphs replays the training step as one captured graph on devices
	// that can (device.Grapher). The graph is captured at the second step
	// (the first one runs launch by launch, so that each kernel is loaded
	// and its shared memory limit raised outside the capture) and serves
	// every later one: before each replay, the launches whose arguments
	// change between steps (step number, seed, learning rate, valid count)
	// get their new values.
	UseGraphs bool
	// Warnf, when set, reports a failed graph capture; the session then
	// goes on launching kernel by kernel. Without it the step fails.
	Warnf func(format string, args ...any)

	graph        device.Replayer
	graphParams  [][]uint64 // per training launch: the values its graph node holds
	graphVarying []int      // the training launches whose arguments change between steps
	graphSteps   int        // training steps run since UseGraphs was set

	arenas [2]device.Ptr
	// staging holds a batch's pixels and labels on their way to the
	// device, and the graph's results on their way back: page-locked
	// memory on devices that have it (device.HostAllocator), reused from
	// step to step (see the stage* indices).
	staging [numStaging][]byte
	// params is reused for argument arrays.
	params []uint64
}

// NewSession allocates exactly the planned arena on dev and initialises
// the parameters from seed (optimizer state zero).
func NewSession(spec *Spec, dev device.Device, seed uint64) (*Session, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	s := &Session{Spec: spec, Dev: dev, LR: spec.LR, Seed: seed}
	p, err := dev.Alloc(spec.ArenaBytes)
	if err != nil {
		return nil, fmt.Errorf("allocating the planned arena of %d bytes on %s: %w", spec.ArenaBytes, dev.Name(), err)
	}
	s.arenas[TrainArena] = p
	if err := s.InitParams(seed); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close frees the arenas.
func (s *Session) Close() error {
	var errs []error
	if s.graph != nil {
		errs = append(errs, s.graph.Close())
		s.graph = nil
	}
	for i, p := range s.arenas {
		if p != 0 {
			errs = append(errs, s.Dev.Free(p))
			s.arenas[i] = 0
		}
	}
	for i := range s.staging {
		errs = append(errs, s.freeStaging(i))
	}
	return errors.Join(errs...)
}

// Staging buffers. The graph's have addresses of their own: its captured
// copies read and write them at every replay.
const (
	stagePixels  = iota // uploads outside the graph
	stageLabels         //
	graphPixels         // read by the graph's copies
	graphLabels         //
	graphResults        // loss and correct, written by the graph's copies
	numStaging
)

// stagingBuffer returns staging buffer i with n bytes (contents left from
// earlier use: callers write all of it).
func (s *Session) stagingBuffer(i, n int) ([]byte, error) {
	if cap(s.staging[i]) < n {
		if err := s.freeStaging(i); err != nil {
			return nil, err
		}
		if ha, ok := s.Dev.(device.HostAllocator); ok {
			b, err := ha.AllocHost(n)
			if err != nil {
				return nil, fmt.Errorf("trainer: page-locked staging memory of %d bytes: %w", n, err)
			}
			s.staging[i] = b
		} else {
			s.staging[i] = make([]byte, n)
		}
	}
	return s.staging[i][:n], nil
}

func (s *Session) freeStaging(i int) error {
	b := s.staging[i]
	s.staging[i] = nil
	if ha, ok := s.Dev.(device.HostAllocator); ok && b != nil {
		return ha.FreeHost(b[:cap(b)])
	}
	return nil
}

func (s *Session) addr(a Arena, off int64) device.Ptr { return s.arenas[a] + device.Ptr(off) }

// f32bytes and bytesf32 use the checkpoint format's little-endian float32
// layout, the device's too.
func f32bytes(vals []float32) []byte { return checkpoint.F32Tensor("", nil, vals).Data }

func bytesf32(b []byte) []float32 { return checkpoint.Tensor{Data: b}.Float32s() }

// InitParams sets every parameter to its initial values for seed and
// zeroes the optimizer state, as the float64 reference does.
func (s *Session) InitParams(seed uint64) error {
	for _, p := range s.Spec.Params {
		vals := initparam.Uniform(p.Name, seed, p.InitBound, int(p.Elems()))
		if err := s.Dev.CopyIn(s.addr(p.Arena, p.Offset), f32bytes(vals)); err != nil {
			return err
		}
	}
	for _, t := range s.Spec.State {
		if err := s.Dev.CopyIn(s.addr(t.Arena, t.Offset), make([]byte, 4*t.Elems())); err != nil {
			return err
		}
	}
	s.Step = 0
	return nil
}

// SetStepLR sets the learning rate of the following training steps'
// kernels — a schedule's rate for the step: Loop calls it before each
// step — and leaves LR, the base rate checkpoints store, as it is.
func (s *Session) SetStepLR(lr float32) { s.stepLR, s.hasStepLR = lr, true }

// StepLR is the learning rate the next training step's kernels use: the
// last SetStepLR's, or LR.
func (s *Session) StepLR() float32 {
	if s.hasStepLR {
		return s.stepLR
	}
	return s.LR
}

// ReadTensor returns a tensor's values from the device.
func (s *Session) ReadTensor(t Tensor) ([]float32, error) {
	b := make([]byte, 4*t.Elems())
	if err := s.Dev.CopyOut(b, s.addr(t.Arena, t.Offset)); err != nil {
		return nil, err
	}
	return bytesf32(b), nil
}

// WriteTensor sets a tensor's values on the device.
func (s *Session) WriteTensor(t Tensor, vals []float32) error {
	if int64(len(vals)) != t.Elems() {
		return fmt.Errorf("trainer: %s needs %d values, got %d", t.Name, t.Elems(), len(vals))
	}
	return s.Dev.CopyIn(s.addr(t.Arena, t.Offset), f32bytes(vals))
}

// Param finds a parameter by name.
func (s *Session) Param(name string) (Tensor, bool) {
	for _, p := range s.Spec.Params {
		if p.Name == name {
			return p, true
		}
	}
	return Tensor{}, false
}

func (s *Session) upload(st Step, b Batch) error {
	return s.uploadAs(st, b, s.Spec.Batch)
}

// uploadAs copies b into st's inputs, padded to batch samples.
func (s *Session) uploadAs(st Step, b Batch, batch int) error {
	px, lb, err := s.stageBatch(b, batch, stagePixels, stageLabels)
	if err != nil {
		return err
	}
	if err := s.Dev.CopyIn(s.addr(st.Images.Arena, st.Images.Offset), px); err != nil {
		return err
	}
	return s.Dev.CopyIn(s.addr(st.Labels.Arena, st.Labels.Offset), lb)
}

// stageBatch checks b and writes it, padded to batch samples, into the
// staging buffers pi (pixels, uint8 HWC) and li (labels, int32).
func (s *Session) stageBatch(b Batch, batch, pi, li int) (px, lb []byte, err error) {
	sp := s.Spec
	n := sp.H * sp.W * sp.C
	if b.Valid < 1 || b.Valid > batch || len(b.Pixels) != b.Valid*n || len(b.Labels) != b.Valid {
		return nil, nil, fmt.Errorf("trainer: a batch of %d valid samples needs %d pixels and %d labels, got %d and %d (compiled batch %d)",
			b.Valid, b.Valid*n, b.Valid, len(b.Pixels), len(b.Labels), batch)
	}
	for i, l := range b.Labels {
		if l < 0 || int(l) >= sp.Classes {
			return nil, nil, fmt.Errorf("trainer: label %d of sample %d is outside [0,%d)", l, i, sp.Classes)
		}
	}
	if px, err = s.stagingBuffer(pi, batch*n); err != nil {
		return nil, nil, err
	}
	if lb, err = s.stagingBuffer(li, 4*batch); err != nil {
		return nil, nil, err
	}
	clear(px[copy(px, b.Pixels):]) // a partial batch's padding is zero
	for i, l := range b.Labels {
		binary.LittleEndian.PutUint32(lb[4*i:], uint32(l))
	}
	clear(lb[4*len(b.Labels):])
	return px, lb, nil
}

func (s *Session) run(st Step, valid int) error {
	if err := s.launch(st, valid); err != nil {
		return err
	}
	return s.Dev.Sync()
}

// launch queues a step's launches.
func (s *Session) launch(st Step, valid int) error {
	for _, l := range st.Launches {
		s.params = s.args(l, valid, s.params[:0])
		if err := s.Dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, s.params); err != nil {
			return err
		}
	}
	return nil
}

// args appends l's parameter values for this step to dst.
func (s *Session) args(l Launch, valid int, dst []uint64) []uint64 {
	for _, a := range l.Args {
		var v uint64
		switch a.Kind {
		case ArgBuffer:
			v = uint64(s.addr(a.Arena, a.Offset))
		case ArgInt:
			v = uint64(a.Int)
		case ArgFloat:
			v = uint64(math.Float32bits(a.Float))
		case ArgLR:
			v = uint64(math.Float32bits(s.StepLR()))
		case ArgStep:
			v = uint64(s.Step)
		case ArgSeed:
			v = s.Seed
		case ArgValid:
			v = uint64(valid)
		}
		dst = append(dst, v)
	}
	return dst
}

// changesPerStep says whether some of l's arguments can differ between
// training steps of a session.
func changesPerStep(l Launch) bool {
	for _, a := range l.Args {
		switch a.Kind {
		case ArgLR, ArgStep, ArgSeed, ArgValid:
			return true
		}
	}
	return false
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

// stager returns the device's asynchronous copies when the graph can
// carry the step's copies too — the batch in from page-locked staging
// buffers and the loss and correct count back out, so that a step costs
// one graph launch and one synchronisation — and nil otherwise.
func (s *Session) stager() device.AsyncCopier {
	ac, async := s.Dev.(device.AsyncCopier)
	if _, pinned := s.Dev.(device.HostAllocator); !async || !pinned {
		return nil
	}
	return ac
}

// captureStep queues the training step for a capture: its launches, and
// through ac (when not nil) its copies.
func (s *Session) captureStep(ac device.AsyncCopier, valid int) error {
	st := s.Spec.Train
	if ac != nil {
		if err := ac.CopyInAsync(s.addr(st.Images.Arena, st.Images.Offset), s.staging[graphPixels]); err != nil {
			return err
		}
		if err := ac.CopyInAsync(s.addr(st.Labels.Arena, st.Labels.Offset), s.staging[graphLabels]); err != nil {
			return err
		}
	}
	if err := s.launch(st, valid); err != nil {
		return err
	}
	if ac != nil {
		res := s.staging[graphResults]
		if err := ac.CopyOutAsync(res[:4], s.addr(st.Loss.Arena, st.Loss.Offset)); err != nil {
			return err
		}
		if err := ac.CopyOutAsync(res[4:8], s.addr(st.Correct.Arena, st.Correct.Offset)); err != nil {
			return err
		}
	}
	return nil
}

// prepareGraph readies the graph of the training step for this step:
// captured on the first call, then the launches whose arguments changed
// get this step's values.
func (s *Session) prepareGraph(g device.Grapher, ac device.AsyncCopier, valid int) error {
	st := s.Spec.Train
	if s.graph == nil {
		r, err := g.CaptureGraph(func() error { return s.captureStep(ac, valid) })
		if err != nil {
			return fmt.Errorf("capturing the training step as a CUDA graph: %w", err)
		}
		s.graph = r
		s.graphParams = make([][]uint64, len(st.Launches))
		s.graphVarying = s.graphVarying[:0]
		for i, l := range st.Launches {
			s.graphParams[i] = s.args(l, valid, nil)
			if changesPerStep(l) {
				s.graphVarying = append(s.graphVarying, i)
			}
		}
	}
	for _, i := range s.graphVarying {
		l := st.Launches[i]
		s.params = s.args(l, valid, s.params[:0])
		if slices.Equal(s.params, s.graphParams[i]) {
			continue
		}
		if err := s.graph.SetParams(i, s.params); err != nil {
			return fmt.Errorf("updating the CUDA graph's arguments: %w", err)
		}
		s.graphParams[i] = append(s.graphParams[i][:0], s.params...)
	}
	return nil
}

// graphStep runs a training step as the graph. A graph that cannot be
// captured or updated is reported through Warnf, when set, and the
// session goes on launching kernel by kernel (fellBack); a failure while
// the graph runs is the step's.
func (s *Session) graphStep(g device.Grapher, b Batch) (loss float32, correct int, fellBack bool, err error) {
	ac := s.stager()
	if ac != nil {
		if _, _, err := s.stageBatch(b, s.Spec.Batch, graphPixels, graphLabels); err != nil {
			return 0, 0, false, err
		}
		if _, err := s.stagingBuffer(graphResults, 8); err != nil {
			return 0, 0, false, err
		}
	} else if err := s.upload(s.Spec.Train, b); err != nil {
		return 0, 0, false, err
	}
	if err := s.prepareGraph(g, ac, b.Valid); err != nil {
		if s.Warnf == nil {
			return 0, 0, false, err
		}
		s.Warnf("%v; launching kernels one by one", err)
		s.UseGraphs = false
		if s.graph != nil {
			s.graph.Close()
			s.graph = nil
		}
		return 0, 0, true, nil
	}
	if err := s.graph.Replay(); err != nil {
		return 0, 0, false, err
	}
	if err := s.Dev.Sync(); err != nil {
		return 0, 0, false, err
	}
	if ac == nil {
		loss, correct, err = s.readScalars(s.Spec.Train)
		return loss, correct, false, err
	}
	res := bytesf32(s.staging[graphResults])
	return res[0], int(res[1]), false, nil
}

// TrainStep runs one training step (forward, backward, update) and
// returns the batch's mean loss and correct predictions. With UseGraphs on
// a device that can (device.Grapher) the step runs as one graph from the
// session's second step on (the first launches kernel by kernel, so that
// each kernel is loaded and its shared memory limit raised outside the
// capture).
func (s *Session) TrainStep(b Batch) (float32, int, error) {
	if g, ok := s.Dev.(device.Grapher); ok && s.UseGraphs {
		s.graphSteps++
		if s.graphSteps > 1 {
			loss, correct, fellBack, err := s.graphStep(g, b)
			if err != nil {
				return 0, 0, fmt.Errorf("step %d: %w", s.Step, err)
			}
			if !fellBack {
				s.Step++
				return loss, correct, nil
			}
		}
	}
	if err := s.upload(s.Spec.Train, b); err != nil {
		return 0, 0, err
	}
	if err := s.run(s.Spec.Train, b.Valid); err != nil {
		return 0, 0, fmt.Errorf("step %d: %w", s.Step, err)
	}
	s.Step++
	return s.readScalars(s.Spec.Train)
}

// EvalBatch runs the forward pass (dropout off) and returns the loss and
// correct predictions.
func (s *Session) EvalBatch(b Batch) (float32, int, error) {
	if err := s.ensureEvalArena(); err != nil {
		return 0, 0, err
	}
	if err := s.upload(s.Spec.Train, b); err != nil { // validates b against the training batch
		return 0, 0, err
	}
	// evaluation may be compiled for a smaller batch (to fit the training
	// arena's temporary space): run b in chunks and combine
	chunk := s.evalChunk()
	n := s.Spec.H * s.Spec.W * s.Spec.C
	var sum float64
	correct := 0
	for first := 0; first < b.Valid; first += chunk {
		k := min(chunk, b.Valid-first)
		part := Batch{Pixels: b.Pixels[first*n : (first+k)*n], Labels: b.Labels[first : first+k], Valid: k}
		if err := s.uploadAs(s.Spec.Eval, part, chunk); err != nil {
			return 0, 0, err
		}
		if err := s.run(s.Spec.Eval, k); err != nil {
			return 0, 0, fmt.Errorf("evaluation: %w", err)
		}
		loss, c, err := s.readScalars(s.Spec.Eval)
		if err != nil {
			return 0, 0, err
		}
		sum += float64(loss) * float64(k)
		correct += c
	}
	return float32(sum / float64(b.Valid)), correct, nil
}

// ensureEvalArena allocates evaluation's arena, when it has one of its
// own, the first time evaluation runs.
func (s *Session) ensureEvalArena() error {
	if s.arenas[EvalArena] == 0 && s.Spec.EvalArenaBytes > 0 {
		p, err := s.Dev.Alloc(s.Spec.EvalArenaBytes)
		if err != nil {
			return fmt.Errorf("allocating the evaluation arena of %d bytes: %w", s.Spec.EvalArenaBytes, err)
		}
		s.arenas[EvalArena] = p
	}
	return nil
}

// evalChunk is the batch evaluation's kernels were compiled for.
func (s *Session) evalChunk() int {
	if s.Spec.EvalBatch > 0 {
		return s.Spec.EvalBatch
	}
	return s.Spec.Batch
}

// Metadata keys in checkpoints.
const (
	MetaFormat = "format"
	MetaModel  = "model"
	MetaStep   = "step"
	MetaSeed   = "seed"
	MetaLR     = "lr" // the base rate: the float32 the kernels use without a schedule, printed exactly
	// MetaSchedule names the learning-rate schedule (schedule.Schedule's
	// String), when there is one.
	MetaSchedule  = "lr_schedule"
	MetaOptimizer = "optimizer"
	MetaVersion   = "cnnc_version" // the cnnc that generated the trainer (runtime/version)
	MetaCommit    = "cnnc_commit"
	formatVersion = "cnnc-checkpoint-1"
)

// checkpointTensors reads the parameters and optimizer state from the
// device. A non-finite value is an error naming the tensor: such a
// checkpoint could not be resumed (Load refuses it), so it must never
// replace a good one.
func (s *Session) checkpointTensors() ([]checkpoint.Tensor, error) {
	var ts []checkpoint.Tensor
	for _, t := range append(append([]Tensor{}, s.Spec.Params...), s.Spec.State...) {
		vals, err := s.ReadTensor(t)
		if err != nil {
			return nil, err
		}
		if i, bad := firstNonFinite(vals); bad {
			return nil, fmt.Errorf("%s holds %v at element %d; nothing was written", t.Name, vals[i], i)
		}
		ts = append(ts, checkpoint.F32Tensor(t.Name, t.Shape, vals))
	}
	return ts, nil
}

func firstNonFinite(vals []float32) (int, bool) {
	for i, v := range vals {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return i, true
		}
	}
	return 0, false
}

// metadata is what every checkpoint says about the session, with extra
// (the run's position and settings) added.
func (s *Session) metadata(extra map[string]string) map[string]string {
	v := version.Get()
	meta := map[string]string{
		MetaFormat: formatVersion, MetaModel: s.Spec.Model, MetaStep: strconv.FormatInt(s.Step, 10),
		MetaSeed: strconv.FormatUint(s.Seed, 10), MetaLR: strconv.FormatFloat(float64(s.LR), 'g', -1, 32),
		MetaOptimizer: s.Spec.Optimizer, MetaVersion: v.Version,
	}
	if v.Commit != "" {
		meta[MetaCommit] = v.Commit
	}
	if !s.Spec.Schedule.IsConstant() {
		meta[MetaSchedule] = s.Spec.Schedule.String()
	}
	for k, v := range extra {
		meta[k] = v
	}
	return meta
}

// Save writes the parameters (PyTorch state_dict names and layouts), the
// optimizer state (as "optimizer.<param>.<state>") and the step, seed,
// learning rate, cnnc version and any extra metadata to path, atomically:
// path holds the old checkpoint or the whole new one at every moment.
func (s *Session) Save(path string, extra map[string]string) error {
	ts, err := s.checkpointTensors()
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return checkpoint.Write(path, ts, s.metadata(extra))
}

// Encode writes what Save writes to w (not atomic: w is the caller's).
func (s *Session) Encode(w io.Writer, extra map[string]string) error {
	ts, err := s.checkpointTensors()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return checkpoint.Encode(w, ts, s.metadata(extra))
}

// Load reads a checkpoint. Parameters always load; with state, the
// optimizer state and the step too (for --resume; --init loads only
// parameters). Everything is checked before anything is written to the
// device, so a checkpoint of another model or a corrupt file changes
// nothing and the error names the tensor.
func (s *Session) Load(path string, withState bool) (map[string]string, error) {
	f, err := checkpoint.Read(path)
	if err != nil {
		return nil, err
	}
	return s.load(f, path, withState, nil)
}

// maxHeader is the largest safetensors header the checkpoint reader takes.
const maxHeader = 100 << 20

// Decode is Load from a reader: r must hold one checkpoint, read up to
// the largest size a checkpoint of this model can have.
func (s *Session) Decode(r io.Reader, withState bool) (map[string]string, error) {
	return s.decode(r, withState, nil)
}

// decode is Decode with check, when set, run on the metadata before
// anything is written to the device.
func (s *Session) decode(r io.Reader, withState bool, check func(meta map[string]string) error) (map[string]string, error) {
	limit := int64(8 + maxHeader)
	for _, t := range append(append([]Tensor{}, s.Spec.Params...), s.Spec.State...) {
		limit += 4 * t.Elems()
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading a checkpoint: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("reading a checkpoint: more than the %d bytes a checkpoint of %s can have", limit, s.Spec.Model)
	}
	f, err := checkpoint.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return s.load(f, "checkpoint", withState, check)
}

func (s *Session) load(f *checkpoint.File, name string, withState bool, check func(map[string]string) error) (map[string]string, error) {
	type write struct {
		t    Tensor
		vals []float32
	}
	var writes []write
	want := s.Spec.Params
	if withState {
		want = append(append([]Tensor{}, s.Spec.Params...), s.Spec.State...)
	}
	for _, t := range want {
		ct, err := f.Expect(t.Name, checkpoint.F32, t.Shape)
		if err != nil {
			return nil, err
		}
		vals := ct.Float32s()
		if i, bad := firstNonFinite(vals); bad {
			return nil, fmt.Errorf("%s: tensor %q holds %v at element %d", name, t.Name, vals[i], i)
		}
		writes = append(writes, write{t, vals})
	}
	var step int64
	if withState {
		var err error
		step, err = strconv.ParseInt(f.Metadata[MetaStep], 10, 64)
		if err != nil || step < 0 {
			return nil, fmt.Errorf("%s: metadata %q = %q is not a step count", name, MetaStep, f.Metadata[MetaStep])
		}
	}
	if check != nil {
		if err := check(f.Metadata); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, w := range writes {
		if err := s.WriteTensor(w.t, w.vals); err != nil {
			return nil, err
		}
	}
	if withState {
		s.Step = step
	}
	return f.Metadata, nil
}
