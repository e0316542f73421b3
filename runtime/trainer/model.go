package trainer

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/device"
)

// Backends open devices by name ("cpu", "cuda"); a program built without
// the cuda tag has no "cuda" entry, so it never links gorgonia.org/cu.
type Backends map[string]func(spec *Spec) (device.Device, error)

// OpenDevice opens the named backend: "cpu", "cuda", or "auto" (or "")
// for "cuda" when backends has it, else "cpu". With warn set, "auto"
// reports a CUDA device that cannot be opened through it and uses the
// CPU; without, that is an error.
func OpenDevice(spec *Spec, backends Backends, name string, warn func(string)) (device.Device, error) {
	if name == "" || name == "auto" {
		name = "cpu"
		if open, ok := backends["cuda"]; ok {
			d, err := open(spec)
			if err == nil || warn == nil {
				return d, err
			}
			warn(fmt.Sprintf("no CUDA device (%v); using the CPU emulator", err))
		}
	}
	if name != "cpu" && name != "cuda" {
		return nil, fmt.Errorf("%q: want auto, cpu or cuda", name)
	}
	open, ok := backends[name]
	if !ok {
		var have []string
		for k := range backends {
			have = append(have, k)
		}
		sort.Strings(have)
		return nil, fmt.Errorf("%q: this program was built without it (it has %v); CUDA needs the kernels' fatbin (cnnc gen --cuda, cnnc build --target cuda) and go build -tags cuda", name, have)
	}
	return open(spec)
}

// Options configure a Model. The zero value trains as the model's train
// block says, on the GPU when the program has one, else on the CPU.
type Options struct {
	// Seed fixes the initial parameters (PyTorch's default distributions),
	// the data order of Train and dropout.
	Seed uint64
	// LR is the learning rate; 0 keeps the model's. With the train block's
	// schedule it is the base rate the schedule scales (onecycle: its
	// max_lr). The kernels compute in float32: a rate it cannot hold is
	// an error.
	LR float64
	// Device is "auto" or "" (the GPU when the program has CUDA kernels
	// and is built with -tags cuda, else the CPU), "cpu" or "cuda".
	Device string
	// Epochs is Train's number of passes over the data; 0: the model's.
	Epochs int
	// Batch is Train's and Evaluate's samples per step; 0: the compiled
	// batch, which is also the most.
	Batch int
	// NoShuffle makes Train read the data in order.
	NoShuffle bool
	// MaxSteps stops Train when the model has taken this many steps in
	// all (Steps); 0: no limit.
	MaxSteps int64
	// OnStep and OnEpoch, when set, receive Train's metrics after every
	// step and epoch, on Train's goroutine.
	OnStep  func(StepMetrics)
	OnEpoch func(EpochMetrics)
}

// Model is a compiled model on a device, with its parameters and
// optimizer state in the one arena the memory plan sized: what a `cnnc
// gen` package's New returns. Its methods must not be called
// concurrently.
type Model struct {
	sess *Session
	o    Options
	// at is where Train stands (restored by Load, moved by Train).
	at      Position
	samples int      // the training data's size, once Train has seen it
	classes []string // class names, from the training data or a checkpoint
}

// NewModel opens the device (o.Device among backends), allocates the
// model's arena once and initialises its parameters from o.Seed.
func NewModel(spec *Spec, backends Backends, o Options) (*Model, error) {
	lr := spec.LR
	if o.LR != 0 {
		var err error
		if lr, err = LR32(o.LR); err != nil {
			return nil, fmt.Errorf("%s: Options.LR: %w", spec.Model, err)
		}
	}
	if o.Epochs == 0 {
		o.Epochs = spec.Epochs
	}
	if o.Batch == 0 {
		o.Batch = spec.Batch
	}
	if o.Epochs < 0 || o.Batch < 1 || o.Batch > spec.Batch || o.MaxSteps < 0 {
		return nil, fmt.Errorf("%s: Options: epochs %d, batch %d (1 to %d, the compiled batch), max steps %d", spec.Model, o.Epochs, o.Batch, spec.Batch, o.MaxSteps)
	}
	dev, err := OpenDevice(spec, backends, o.Device, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: Options.Device %w", spec.Model, err)
	}
	s, err := NewSession(spec, dev, o.Seed)
	if err != nil {
		dev.Close()
		return nil, err
	}
	s.LR = lr
	// on a GPU the training step is replayed as one CUDA graph from the
	// second step on
	s.UseGraphs = true
	return &Model{sess: s, o: o}, nil
}

// Train runs Options.Epochs passes over train from where the model stands
// (a fresh model at the start; after Load, where the saved run was),
// shuffled by Options.Seed. It returns when the epochs are done, at
// Options.MaxSteps, on ctx's cancellation (ctx's error; Train again goes
// on from there) or with the error that stopped it: a *DivergedError when
// the loss became non-finite or exploded (see Diverging).
func (m *Model) Train(ctx context.Context, train data.Dataset) error {
	if m.samples != 0 && m.samples != train.Len() && m.at != (Position{}) {
		return fmt.Errorf("%s: Train: the model is in an epoch over %d samples; this data has %d", m.sess.Spec.Model, m.samples, train.Len())
	}
	l := &Loop{Session: m.sess, Train: train, Epochs: m.o.Epochs, Batch: m.o.Batch, NoShuffle: m.o.NoShuffle, MaxSteps: m.o.MaxSteps, Start: m.at,
		Schedule: m.sess.Spec.Schedule}
	if f := m.o.OnStep; f != nil {
		l.OnStep = func(s *StepMetrics) error { f(*s); return nil }
	}
	if f := m.o.OnEpoch; f != nil {
		l.OnEpoch = func(e *EpochMetrics) error { f(*e); return nil }
	}
	if names := ClassNames(train); names != nil {
		m.classes = names
	}
	res, err := l.Run(ctx)
	m.at, m.samples = res.At, train.Len()
	if err != nil {
		return err
	}
	if res.Stop == Interrupted {
		return ctx.Err()
	}
	return nil
}

// Step runs one training step (forward, backward, update) on b and
// returns its mean loss (before the update) and correct predictions. It
// updates with the session's current rate (Session().StepLR(): the last
// rate Train's schedule set, or the base rate): Train applies the
// schedule, Step does not.
func (m *Model) Step(b Batch) (loss float32, correct int, err error) {
	return m.sess.TrainStep(b)
}

// Evaluate runs ds through the forward pass (dropout off) and returns its
// mean loss and accuracy.
func (m *Model) Evaluate(ctx context.Context, ds data.Dataset) (Evaluation, error) {
	return Evaluate(ctx, m.sess, ds, m.o.Batch)
}

// EvaluateBatch runs the forward pass (dropout off) on b.
func (m *Model) EvaluateBatch(b Batch) (loss float32, correct int, err error) {
	return m.sess.EvalBatch(b)
}

// Predict returns, for each image of pixels (uint8 HWC, one image after
// the other), its k most probable classes, most probable first, named
// when the model knows its classes' names (Classes).
func (m *Model) Predict(pixels []uint8, k int) ([][]Prediction, error) {
	preds, err := m.sess.Predict(pixels, k)
	if err != nil || m.classes == nil {
		return preds, err
	}
	for _, top := range preds {
		for i := range top {
			top[i].Name = ClassName(m.classes, top[i].Class)
		}
	}
	return preds, nil
}

// Classes are the class names in label order — an ImageFolder's folder
// names, MNIST's digits — from the data Train last read or the checkpoint
// Load read; nil when neither had them.
func (m *Model) Classes() []string { return m.classes }

// Save writes the model as a safetensors checkpoint to w: parameters
// under PyTorch's state_dict names and layouts, optimizer state, step,
// seed, learning rate and where Train stands, so that Load continues
// exactly. To replace a file safely, write a temporary file and rename it
// (or use Session().Save, which does).
func (m *Model) Save(w io.Writer) error {
	st := RunState{Position: m.at, Epochs: m.o.Epochs, Batch: m.o.Batch, NoShuffle: m.o.NoShuffle, Samples: m.samples}
	meta := st.Meta()
	if m.classes != nil {
		meta[MetaClasses] = EncodeClassNames(m.classes)
	}
	return m.sess.Encode(w, meta)
}

// Load restores a checkpoint Save (or a trainer's --checkpoint) wrote:
// parameters, optimizer state, step, seed, the learning rate (unless
// Options.LR was given), the class names and Train's position with the
// batch size and order it counts in. Everything is checked before
// anything changes: a checkpoint of another model or a damaged one is an
// error naming what is wrong, and the model stays as it was.
func (m *Model) Load(r io.Reader) error {
	sp := m.sess.Spec
	var st RunState
	var classes []string
	lr := m.sess.LR
	check := func(meta map[string]string) error {
		if got := meta[MetaModel]; got != "" && got != sp.Model {
			return fmt.Errorf("a checkpoint of model %q, not %q", got, sp.Model)
		}
		var err error
		if st, err = ParseRunState(meta); err != nil {
			return err
		}
		if st.Has[metaBatchSize] && st.Batch > sp.Batch && !sp.Infer {
			return fmt.Errorf("trained with batch %d; the model was compiled for at most %d", st.Batch, sp.Batch)
		}
		if classes, err = DecodeClassNames(meta, sp.Classes); err != nil {
			return err
		}
		if v, err := strconv.ParseFloat(meta[MetaLR], 64); err == nil && m.o.LR == 0 {
			if lr, err = LR32(v); err != nil {
				return fmt.Errorf("metadata %q: %w", MetaLR, err)
			}
		}
		return nil
	}
	if _, err := m.sess.decode(r, true, check); err != nil {
		return err
	}
	m.sess.LR = lr // the seed came back with the step (Session.load)
	m.at, m.samples, m.classes = st.Position, st.Samples, classes
	if st.HasPosition() {
		// the position counts batches of the saved run's size and order
		if st.Has[metaBatchSize] {
			m.o.Batch = st.Batch
		}
		m.o.NoShuffle = st.NoShuffle
	}
	return nil
}

// Steps is the number of training steps the model has taken.
func (m *Model) Steps() int64 { return m.sess.Step }

// Device names the device the model trains on.
func (m *Model) Device() string { return m.sess.Dev.Name() }

// Session is the model's session, for what the Model does not offer
// (reading a parameter, profiling).
func (m *Model) Session() *Session { return m.sess }

// Close frees the model's memory and its device.
func (m *Model) Close() error {
	err := m.sess.Close()
	if cerr := m.sess.Dev.Close(); err == nil {
		err = cerr
	}
	return err
}
