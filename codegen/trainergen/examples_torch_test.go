package trainergen_test

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/torchtest"
	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// exampleTwin is an example model, its twin in scripts/torch_examples.py,
// the batch the test runs it at (small: the CPU emulator and the float64
// reference are slow), the steps cnnc's float32 trainer takes before the
// checkpoint (so that batch norm's running statistics and the momentum
// are not their initial values) and the steps compared after it.
type exampleTwin struct {
	file, model          string
	batch, before, after int
	dropout              []string // layers whose masks go to the twin
	slow                 bool     // only with -examples-slow (minutes on 2 cores)
	// f32 checks cnnc's float32 losses against the float32 error bound
	// of scripts/f32_error_bound.py (Analysis.forward_bound), whose rules
	// cover LeNet-5's ops; not yet batch norm, hardswish, grouped convs,
	// dropout or add
	f32 bool
}

// examplesSlow runs TestExamplesInPyTorch's slow cases too (ResNet-18:
// about 2 minutes on 2 shared cores, most of it the CPU emulator's and the
// float64 reference's steps):
// go test ./codegen/trainergen -run TestExamplesInPyTorch -args -examples-slow
var examplesSlow = flag.Bool("examples-slow", false, "TestExamplesInPyTorch: the slow cases too (ResNet-18)")

var exampleTwins = []exampleTwin{
	{"lenet5.cnn", "lenet5", 8, 2, 3, nil, false, true},
	{"vgg_small.cnn", "vgg_small", 4, 2, 3, []string{"drop1"}, false, false},
	{"mobilenet_small.cnn", "mobilenet_small", 4, 2, 3, nil, false, false},
	// ResNet-18's steps take minutes; without -examples-slow its check is
	// the parameter count, the strict load and the evaluation loss at
	// initialisation
	{"resnet18.cnn", "resnet18", 2, 0, 0, nil, false, false},
	{"resnet18.cnn", "resnet18", 2, 1, 2, nil, true, false},
}

// torchExample is what scripts/torch_examples.py prints.
type torchExample struct {
	Torch       string
	Params      int64
	Buffers     int64
	EvalLoss    float64   `json:"eval_loss"`
	EvalCorrect int       `json:"eval_correct"`
	TrainLosses []float64 `json:"train_losses"`
	LossBound   float64   `json:"eval_loss_bound"`
	State       []string  // written to the request's folder, float64 LE
}

// Every example model has a PyTorch twin (scripts/torch_examples.py) with
// the same parameter count, into which a checkpoint that cnnc's float32
// trainer wrote after a few steps (none in ResNet-18's quick case) loads
// with load_state_dict(strict=True), every value bit for bit (names,
// shapes, OIHW and flatten layouts, batch norm's buffers with
// num_batches_tracked an int64). From that checkpoint (parameters, running
// statistics, momentum) cnnc's float64 reference — the semantics cnnc's
// kernels are tested against — and PyTorch in float64 compute the loss on
// a batch in evaluation mode (running statistics) and take SGD steps
// (momentum, weight decay) in training mode (batch statistics; dropout
// with cnnc's masks, which torch's RNG cannot draw); the losses before
// each step and every parameter and buffer after them (running mean and
// variance, num_batches_tracked) must agree.
//
// The tolerance, from error analysis: both sides compute one function in
// float64 from the same float64 inputs (float32 checkpoint values, pixels
// /255, exact), so they differ only by float64 rounding in different
// orders. Each value is a sum of at most n = 4,608 terms here (a 3x3
// conv's input gradient over 512 channels; weight gradients sum batch x
// output pixels <= 4 x 1,024), within gamma_n = n 2^-53 = 5.1e-13 of the
// sum of its terms' magnitudes. Carried through the network (at most 60
// layers and 3 steps), an error grows by the layers' magnification of
// relative errors: 1 for relu, pools, adds and the losses' softmax, at
// most 1.5 for hardswish and tanh, and for batch norm (|mean|+sigma)/sigma
// of its input. The tolerance 1e-7 (relative to each tensor's largest
// magnitude; 9e8 units of float64 rounding) leaves a product of
// magnifications up to 1e-7 / (5.1e-13 x 60 x 3) ≈ 1,000 — far above what
// batch norm's normalised activations give, below which no float64
// rounding can reach it. A relu or max-pool input within 1e-13 of a tie
// (probability ~1e-13 per element on random data) could route a gradient
// differently. The test's power: a wrong layout, an argument's default
// (momentum, eps), batch norm's biased/unbiased variance (n/(n-1) >=
// 1 + 1/4096 here), a missing bias or another shortcut changes these
// values by more than 1e-4 relative.
//
// cnnc's float32 trainer's own losses from the checkpoint are logged
// beside the float64 truth; LeNet-5's (f32) must lie within the float32
// bound of scripts/f32_error_bound.py (Analysis.forward_bound), whose
// rules do not cover batch norm, hardswish, grouped convs or add yet: the
// other examples' float32 kernels are checked against the reference op by
// op (codegen TestEveryOpExampleKernels).
func TestExamplesInPyTorch(t *testing.T) {
	torchtest.Require(t)
	for _, ex := range exampleTwins {
		t.Run(fmt.Sprintf("%s %d+%d steps", ex.model, ex.before, ex.after), func(t *testing.T) {
			if ex.slow && !*examplesSlow {
				t.Skipf("!!! SKIPPING %s: minutes on the CPU; run it with -args -examples-slow", t.Name())
			}
			exampleAgreesWithTwin(t, ex)
		})
	}
}

// exampleTol is the float64-vs-float64 tolerance derived above, relative
// to each tensor's largest magnitude.
const exampleTol = 1e-7

func exampleAgreesWithTwin(t *testing.T, ex exampleTwin) {
	root := moduleRoot(t)
	c := compileTrainerExample(t, filepath.Join(root, "examples", ex.file), int64(ex.batch))
	s := newSession(t, c, 3)
	rng := rand.New(rand.NewPCG(21, uint64(ex.batch)))
	sp := c.Spec
	randomBatch := func() trainer.Batch { return trainertest.RandomBatch(sp, ex.batch, rng) }
	for range ex.before {
		_, _, err := s.TrainStep(randomBatch())
		require.NoError(t, err)
	}
	ck := filepath.Join(t.TempDir(), "ck.safetensors")
	require.NoError(t, s.Save(ck, nil))
	b := randomBatch()

	// the reference from the checkpoint's values
	ref := referenceAt(t, c.Plan.Graph, ck, 3, int64(ex.before)) // the session's seed: the same dropout masks
	rb := reference.Batch{N: ex.batch, Pixels: b.Pixels, Labels: b.Labels}
	evalRes, err := ref.Run(rb, reference.Eval)
	require.NoError(t, err)
	masks := map[string][][]int{}
	var refLosses []float64
	for range ex.after {
		r, err := ref.Run(rb, reference.Train)
		require.NoError(t, err)
		refLosses = append(refLosses, r.Loss)
		for _, layer := range ex.dropout {
			masks[layer] = append(masks[layer], keptMask(t, c.Plan.Graph, r, layer))
		}
	}

	labels, pixels := make([]int, len(b.Labels)), make([]int, len(b.Pixels)) // JSON numbers, not base64
	for i, l := range b.Labels {
		labels[i] = int(l)
	}
	for i, p := range b.Pixels {
		pixels[i] = int(p)
	}
	var tw torchExample
	out := t.TempDir()
	torchtest.Run(t, filepath.Join(root, "scripts/torch_examples.py"), map[string]any{
		"model": ex.model, "checkpoint": ck, "pixels": pixels, "labels": labels, "steps": ex.after, "masks": masks, "out": out, "loss_bound": ex.f32,
	}, &tw)

	var params, buffers int64
	for _, p := range sp.Params {
		params += elems(p.Shape)
	}
	for _, p := range sp.Buffers {
		buffers += elems(p.Shape)
	}
	assert.Equal(t, tw.Params, params, "parameter count")
	assert.Equal(t, tw.Buffers, buffers, "buffer elements")

	assert.InDelta(t, tw.EvalLoss, evalRes.Loss, exampleTol*math.Max(1, math.Abs(tw.EvalLoss)), "evaluation-mode loss")
	assert.Equal(t, tw.EvalCorrect, evalRes.Correct, "correct in evaluation mode")
	require.Len(t, tw.TrainLosses, ex.after)
	for i := range refLosses {
		assert.InDelta(t, tw.TrainLosses[i], refLosses[i], exampleTol*math.Max(1, math.Abs(tw.TrainLosses[i])), "training-mode loss before step %d", i+1)
	}
	for _, p := range append(append([]trainer.Tensor{}, sp.Params...), sp.Buffers...) {
		require.Contains(t, tw.State, p.Name, "the twin's state_dict")
		want := readF64(t, filepath.Join(out, p.Name))
		got := ref.ParamByName(p.Name)
		require.Len(t, got, len(want), p.Name)
		if p.DType == trainer.DTypeI64 {
			assert.Equal(t, float64(ex.before+ex.after), want[0], "%s: one count a step", p.Name)
			continue
		}
		assert.LessOrEqual(t, maxRel64(got, want), exampleTol, "%s after %d steps", p.Name, ex.after)
	}

	// information: cnnc's float32 trainer from the same checkpoint
	loss32, _, err := s.EvalBatch(b)
	require.NoError(t, err)
	var train32 []float64
	for range ex.after {
		l, _, err := s.TrainStep(b)
		require.NoError(t, err)
		train32 = append(train32, float64(l))
	}
	if ex.f32 {
		// the checkpoint's loss in float32, within the bound of its
		// float32 rounding; the first training step's loss is the same
		// function (no batch norm, no dropout)
		assert.LessOrEqual(t, math.Abs(float64(loss32)-tw.EvalLoss), tw.LossBound, "cnnc's float32 evaluation loss: error past the float32 bound")
		assert.LessOrEqual(t, math.Abs(train32[0]-tw.TrainLosses[0]), tw.LossBound, "cnnc's float32 training loss: error past the float32 bound")
		t.Logf("float32 loss errors %.1e (evaluation), %.1e (training); bound %.1e", math.Abs(float64(loss32)-tw.EvalLoss), math.Abs(train32[0]-tw.TrainLosses[0]), tw.LossBound)
	}
	t.Logf("%s (torch %s): %d parameters; evaluation loss %.9f (cnnc float32 %.9f); training losses %v (cnnc float32 %v)",
		ex.model, tw.Torch, params, tw.EvalLoss, loss32, tw.TrainLosses, train32)
}

// referenceAt is cnnc's float64 reference holding a checkpoint's
// parameters, buffers and optimizer state, after steps steps (seed:
// dropout's masks).
func referenceAt(t *testing.T, g *ir.Graph, ck string, seed uint64, steps int64) *reference.Executor {
	t.Helper()
	f, err := checkpoint.Read(ck)
	require.NoError(t, err)
	ref := reference.New(g, seed)
	ref.Step = steps
	load := func(name string, dst []float64) {
		v, ok := f.Tensor(name)
		require.True(t, ok, "the checkpoint lacks %s", name)
		if v.DType == checkpoint.I64 {
			return // num_batches_tracked: the reference counts steps itself
		}
		vals := v.Float32s()
		require.Len(t, vals, len(dst), name)
		for i, x := range vals {
			dst[i] = float64(x)
		}
	}
	for p, d := range ref.Params {
		load(p.Name, d)
	}
	for s, d := range ref.State {
		load("optimizer."+s.Name, d)
	}
	return ref
}

// keptMask is dropout layer's mask in reference run r: 1 where its output
// is nonzero. Where its input is 0 the mask does not matter (the output is
// 0 either way, and the relu before it passes no gradient there).
func keptMask(t *testing.T, g *ir.Graph, r *reference.Result, layer string) []int {
	t.Helper()
	for _, n := range g.Nodes {
		if n.Name == layer && n.Phase == ir.Forward {
			out := r.Values[n.Outs[0]]
			mask := make([]int, len(out))
			for i, v := range out {
				if v != 0 {
					mask[i] = 1
				}
			}
			return mask
		}
	}
	t.Fatalf("no forward node %s", layer)
	return nil
}

// readF64 reads a file of little-endian float64s.
func readF64(t *testing.T, path string) []float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func elems(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// maxRel64 is the largest |got - want| over want's largest magnitude.
func maxRel64(got, want []float64) float64 {
	scale, worst := 0.0, 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	for i := range want {
		worst = math.Max(worst, math.Abs(got[i]-want[i]))
	}
	return worst / math.Max(scale, 1e-300)
}
