package trainer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
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
	// GlobalValid, on a data-parallel rank (Session.SetParallel), is the
	// real samples of the global batch this is the rank's share of.
	GlobalValid int
}

// Session is a model on a device: its arena, parameters and step counter.
type Session struct {
	Spec *Spec
	Dev  device.Device
	// Step counts the training steps submitted: the next step's 0-based
	// number (Adam's bias correction and the dropout RNG read it). After
	// Flush every one of them has completed.
	Step int64
	// LR is the run's base learning rate: what checkpoints store, and what
	// a schedule scales (Loop sets each step's rate with SetStepLR).
	// Without a schedule the kernels use it as it is. LR, the step's rate
	// and Seed apply to the steps submitted from then on.
	LR   float32
	Seed uint64
	// stepLR is the rate the next training step's kernels use, when
	// hasStepLR (SetStepLR); else LR.
	stepLR    float32
	hasStepLR bool

	// UseGraphs replays the training step as a captured graph on devices
	// that can (device.Grapher). The first step runs launch by launch (so
	// that each kernel is loaded and its shared memory limit raised
	// outside a capture); each staging slot's graph is captured the first
	// time the slot is used after that and serves every later step
	// unchanged: what changes between steps travels in the step's scalar
	// block, which the graph copies in with the batch.
	UseGraphs bool
	// Warnf, when set, reports a failed graph capture; the session then
	// goes on launching kernel by kernel. Without it the step fails.
	Warnf func(format string, args ...any)
	// TraceGaps times every step from the next one on (StepResult.Gap and
	// Time), at the cost of two fence records per step on pipelined
	// devices.
	TraceGaps bool

	arenas [2]device.Ptr
	// staging holds synchronous uploads (evaluation, prediction,
	// profiles); the training steps' inputs and results go through the
	// slots (pipeline.go), next being the one the next step uses.
	staging []byte
	slots   []slot
	next    int
	warm    bool // a training step ran launch by launch: graphs may be captured
	// marks time traced steps, from step traceFrom on.
	marks     []mark
	traceFrom int64
	// params is reused for argument arrays.
	params []uint64
	// evalFolded: evaluation's folded parameters (Spec.EvalFolds) hold
	// the fold of the current parameters (cleared whenever those change or
	// a training step may have overwritten the space they borrow).
	evalFolded bool
	// rank, reducer, rankLaunches and rankBuckets: a data-parallel rank
	// (SetParallel), its all-reduce, its training launches (first-sample
	// arguments placed in the global batch; a sharded optimizer's own
	// updates) and the buckets with launch numbers counted in those.
	rank         int
	reducer      Reducer
	rankLaunches []Launch
	rankBuckets  []Bucket
	// side is the device's second stream, where a rank sums its buckets
	// overlapped with the backward pass (nil: summed from the host).
	side device.SideStream
	// broadcaster, with a sharded optimizer: the reducer's broadcasts;
	// gathered, rank 0's copies of the other ranks' optimizer state at
	// step gatheredStep (shard.go).
	broadcaster  Broadcaster
	gathered     map[int][]byte
	gatheredStep int64
	// stopFlag is a data-parallel rank's flag for AgreeStop (stop.go).
	stopFlag device.Ptr
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

// Close waits for the steps in flight (results not yet delivered are
// dropped: Flush first to have them) and frees the arenas and staging
// memory.
func (s *Session) Close() error {
	errs := []error{s.closeSlots(), s.closeSide()}
	if s.stopFlag != 0 {
		errs = append(errs, s.Dev.Free(s.stopFlag))
		s.stopFlag = 0
	}
	for i, p := range s.arenas {
		if p != 0 {
			errs = append(errs, s.Dev.Free(p))
			s.arenas[i] = 0
		}
	}
	errs = append(errs, s.freeStaging(s.staging))
	s.staging = nil
	return errors.Join(errs...)
}

func (s *Session) addr(a Arena, off int64) device.Ptr { return s.arenas[a] + device.Ptr(off) }

// f32bytes and bytesf32 use the checkpoint format's little-endian float32
// layout, the device's too.
func f32bytes(vals []float32) []byte { return checkpoint.F32Tensor("", nil, vals).Data }

func bytesf32(b []byte) []float32 { return checkpoint.Tensor{Data: b}.Float32s() }

// InitParams sets every parameter and buffer to its initial values for
// seed and zeroes the optimizer state, as the float64 reference does.
func (s *Session) InitParams(seed uint64) error {
	s.evalFolded = false
	for _, p := range append(append([]Tensor{}, s.Spec.Params...), s.Spec.Buffers...) {
		if err := s.Dev.CopyIn(s.addr(p.Arena, p.Offset), initialBytes(p, seed)); err != nil {
			return err
		}
	}
	for _, t := range s.Spec.State {
		if err := s.Dev.CopyIn(s.addr(t.Arena, t.Offset), make([]byte, t.ArenaBytes())); err != nil {
			return err
		}
	}
	s.Step = 0
	return nil
}

// initialBytes are t's initial contents: uniform for seed, or constant.
func initialBytes(t Tensor, seed uint64) []byte {
	switch {
	case t.DType == DTypeI64:
		b := make([]byte, t.Bytes())
		for i := int64(0); i < t.Elems(); i++ {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(t.InitValue)))
		}
		return b
	case t.InitBound == 0:
		vals := make([]float32, t.Elems())
		for i := range vals {
			vals[i] = float32(t.InitValue)
		}
		return f32bytes(vals)
	}
	return f32bytes(initparam.Uniform(t.Name, seed, t.InitBound, int(t.Elems())))
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
//
// Of optimizer state split in element ranges (RankElems) a rank holds its
// range only: that is what it reads.
func (s *Session) ReadTensor(t Tensor) ([]float32, error) {
	n := t.Elems()
	if t.RankElems > 0 {
		lo, hi := t.RankRange(s.rank)
		n = hi - lo
	}
	b := make([]byte, 4*n)
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
	if t.RankElems > 0 { // the rank's range (see ReadTensor)
		lo, hi := t.RankRange(s.rank)
		vals = vals[lo:hi]
	}
	s.evalFolded = false
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

// EvalBatch runs the forward pass (dropout off) and returns the loss and
// correct predictions.
func (s *Session) EvalBatch(b Batch) (float32, int, error) {
	if s.Spec.Infer {
		return 0, 0, fmt.Errorf("trainer: %s is an inference-only build: it predicts, it has no loss to evaluate", s.Spec.Model)
	}
	if err := s.ensureEvalArena(); err != nil {
		return 0, 0, err
	}
	if err := s.checkBatch(b, s.Spec.Batch); err != nil {
		return 0, 0, err
	}
	if err := s.ensureEvalFolds(); err != nil {
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

// checkpointTensors reads the parameters, buffers and optimizer state from
// the device. A non-finite value is an error naming the tensor: such a
// checkpoint could not be resumed (Load refuses it), so it must never
// replace a good one.
func (s *Session) checkpointTensors() ([]checkpoint.Tensor, error) {
	var ts []checkpoint.Tensor
	for _, t := range append(append([]Tensor{}, s.Spec.Params...), s.Spec.Buffers...) {
		if t.DType == DTypeI64 {
			b := make([]byte, t.Bytes())
			if err := s.Dev.CopyOut(b, s.addr(t.Arena, t.Offset)); err != nil {
				return nil, err
			}
			ts = append(ts, checkpoint.Tensor{Name: t.Name, DType: checkpoint.I64, Shape: t.Shape, Data: b})
			continue
		}
		vals, err := s.ReadTensor(t)
		if err != nil {
			return nil, err
		}
		if i, bad := firstNonFinite(vals); bad {
			return nil, fmt.Errorf("%s holds %v at element %d; nothing was written", t.Name, vals[i], i)
		}
		ts = append(ts, checkpoint.F32Tensor(t.Name, t.Shape, vals))
	}
	for j, t := range s.Spec.State {
		b, err := s.stateBytes(j)
		if err != nil {
			return nil, err
		}
		vals := bytesf32(b)
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
	for _, t := range s.Spec.persistent() {
		limit += t.Bytes()
	}
	if s.Spec.Infer { // the trainer's checkpoints hold the model as trained
		limit = 8 + maxHeader + s.Spec.CheckpointBytes
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

// checkpointSeed is the run's seed saved in a checkpoint's metadata, which
// a resume (withState) restores with the step: dropout masks and
// augmentation draws are keyed by (seed, step), so resuming under another
// seed would train differently from the run that was interrupted.
// Checkpoints written before the seed was saved have none.
func checkpointSeed(meta map[string]string, withState bool) (seed uint64, ok bool, err error) {
	v, has := meta[MetaSeed]
	if !withState || !has {
		return 0, false, nil
	}
	if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
		return 0, false, fmt.Errorf("metadata %q = %q is not a seed", MetaSeed, v)
	}
	return seed, true, nil
}

func (s *Session) load(f *checkpoint.File, name string, withState bool, check func(map[string]string) error) (map[string]string, error) {
	type write struct {
		t    Tensor
		data []byte
	}
	var writes []write
	// the model's state: parameters and buffers; with state, the optimizer's
	want := append(append([]Tensor{}, s.Spec.Params...), s.Spec.Buffers...)
	others := map[string]bool{} // other ranks' state: checked, not written (it would overwrite this rank's share)
	if withState {
		if dp := s.Spec.DataParallel; dp != nil && dp.Shard != nil && s.broadcaster == nil {
			return nil, fmt.Errorf("%s: a sharded optimizer's state loads on a rank (after SetParallel): each rank keeps its own share", name)
		}
		want = append(want, s.Spec.State...)
		for j, t := range s.Spec.State {
			others[t.Name] = !s.ownsState(j) && t.RankElems == 0
		}
	}
	for _, t := range want {
		if t.Folded() {
			data, err := foldTensor(f, t)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", name, t.Name, err)
			}
			writes = append(writes, write{t, data})
			continue
		}
		if t.DType == DTypeI64 {
			ct, err := f.Expect(t.Name, checkpoint.I64, t.Shape)
			if err != nil {
				return nil, err
			}
			writes = append(writes, write{t, ct.Data})
			continue
		}
		ct, err := f.Expect(t.Name, checkpoint.F32, t.Shape)
		if err != nil {
			return nil, err
		}
		vals := ct.Float32s()
		if i, bad := firstNonFinite(vals); bad {
			return nil, fmt.Errorf("%s: tensor %q holds %v at element %d", name, t.Name, vals[i], i)
		}
		writes = append(writes, write{t, ct.Data})
	}
	var step int64
	if withState {
		var err error
		step, err = strconv.ParseInt(f.Metadata[MetaStep], 10, 64)
		if err != nil || step < 0 {
			return nil, fmt.Errorf("%s: metadata %q = %q is not a step count", name, MetaStep, f.Metadata[MetaStep])
		}
	}
	seed, hasSeed, err := checkpointSeed(f.Metadata, withState)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if check != nil {
		if err := check(f.Metadata); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	for _, w := range writes {
		if others[w.t.Name] {
			continue
		}
		if w.t.RankElems > 0 { // the rank's range of a split state
			lo, hi := w.t.RankRange(s.rank)
			w.data = w.data[4*lo : 4*hi]
		}
		if err := s.Dev.CopyIn(s.addr(w.t.Arena, w.t.Offset), w.data); err != nil {
			return nil, err
		}
	}
	if withState {
		s.Step = step
	}
	if hasSeed {
		s.Seed = seed
	}
	s.evalFolded = false
	return f.Metadata, nil
}
