package trainergen_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// requireTorch returns Debian's python3 when it has PyTorch; without it the
// test is skipped loudly, or fails with CNNC_REQUIRE_TORCH=1 (CI).
func requireTorch(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		if os.Getenv("CNNC_REQUIRE_TORCH") == "1" {
			t.Fatalf("CNNC_REQUIRE_TORCH=1 but %s cannot import torch: %v (apt-get install python3-torch)", py, err)
		}
		t.Skipf("!!! SKIPPING %s: %s cannot import torch (apt-get install python3-torch)", t.Name(), py)
	}
	return py
}

// torchSeeds runs TestCheckpointInPyTorch's cases on more seeds (of the
// batch and of the initial parameters):
// go test ./codegen/trainergen -run TestCheckpointInPyTorch -args -torch-seeds=20
var torchSeeds = flag.Int("torch-seeds", 1, "TestCheckpointInPyTorch: seeds per case")

// A cnnc checkpoint loads into the same model written for PyTorch with
// load_state_dict(strict=True) — the OOM guide's SimpleCNN (pools added),
// MNISTNet and LeNet-5 (tanh, average pooling); PyTorch then computes
// cnnc's loss on a batch, and steps of the torch.optim optimizer the checkpoint names (SGD with momentum,
// Nesterov and weight decay; Adam with L2; AdamW) give the parameters and
// optimizer state cnnc's steps give: names, shapes, layouts (OIHW, out x
// in, flatten order) and optimizers agree with PyTorch's.
//
// The truth is PyTorch's step in float64. Every step starts from the same
// float32 parameters and state in both (the checkpoint, then the truth of
// the step before rounded to float32, loaded with Session.Load), so each
// step is measured by its own rounding. cnnc computes in float32 and may
// differ from the truth by its rounding and no more: every element of the
// loss, the predictions, the parameters and the state must lie within the
// bound scripts/f32_error_bound.py derives for it. PyTorch's own float32
// step is logged beside it for information, never used as a bound.
//
// The bound, per element (u = 2^-24, first order in u, magnitudes |.| from
// the float64 step):
//
//   - a sum of n float32 products, in any order, FMA or not, is within
//     g(n) sum|products| of the exact sum, g(n) = min(gamma_n, gamma~_n):
//     gamma_n = nu/(1-nu) always (Higham, Accuracy and Stability of
//     Numerical Algorithms, section 3.1); gamma~_n = exp(10 sqrt(n) u +
//     n u^2/(1-u)) - 1 with probability at least 1 - 2n exp(-50(1-u)^2)
//     when rounding errors are independent and of mean zero (Higham and
//     Mary, SIAM J. Sci. Comput. 41(5), 2019, theorem 3.1): over the
//     fewer than 10^12 products of a run, all hold with probability above
//     1 - 4e-10.
//   - input, pixel * (1.0f/255): E_x = gamma_2 |x|, x = pixel/255 exactly.
//   - forward, y = W h + b with fan_in products per output:
//     E_y = |W| E_h + g(fan_in+1) (|W||h| + |b|); relu passes E (exactly 0
//     where a + E_a <= 0), max-pool the window's largest E; tanh
//     (1 - tanh(max(|a| - E, 0))^2) E plus tanhf's 2 ulp, average pooling
//     the window's mean E plus g(k*k) mean|a| and the division's u|y|.
//     Backward, tanh's dx = dy (1 - v v) from its float32 output v:
//     (1 - y^2) D_y + |dy| (2|y| E_y + E_y^2 + u y^2 + 2u (1 - y^2));
//     average pooling D_y/(k k) + u |dy|/(k k).
//   - loss: lse = max + logf(sum expf(z - max)) moves by at most the
//     logits' largest error, plus its own rounding (the sum's g(C-1),
//     expf's and logf's 2 ulp, the arguments'); expf(z - lse) turns the
//     argument's error into a relative one:
//     |d dz_c| <= p_c/B (E_z + d_lse + u|z_c - lse| + 4u), plus u/B +
//     u|dz_c| at the label. The mean loss:
//     each row within d_lse + E_z at the label, the sum and 1/B g(B)+2u of
//     mean |L|; a prediction may flip where another logit's interval
//     reaches the top one's.
//   - backward, D bounding a gradient's error: dh = W^T dy: |W|^T D_y +
//     g(fan_out) |W|^T |dy|; dW = sum over the batch (and output pixels)
//     of dy h^T: D_y |h|^T + |dy| E_h^T + g(terms) |dy||h|^T; db alike.
//   - flips: where a relu's input is within E of 0, or a pool window's
//     runner-up within the errors of its maximum, float32 may pass or
//     route dy where the truth does not: an error of |dy| + D_y there.
//   - MNISTNet: the gradients are linear in the logits' gradient and in a
//     flipped element's, so those errors reach the parameters' gradients
//     through the exact derivatives, sum_i |d grad/d g_i| D_i (one
//     backward pass per element), and only the sums' own rounding through
//     magnitudes (|W|^T, which overestimates cancelling sums).
//   - optimizer (templates/update.cu.tmpl), each product with a float32
//     constant rounding twice and each add once: SGD g' = g + wd p, buf =
//     g' or mom buf + g', d = g' + mom buf (Nesterov) or buf, p -= lr d,
//     each with its error. Adam: m and v carry D_m = (1-b1) D_g' + ...,
//     D_v = (1-b2)(2|g'| D_g' + D_g'^2) + .... Its update F = lr/bc1 m /
//     (sqrt(v)/sqrt(bc2) + eps) magnifies gradient error where v is small,
//     and is bounded through its sensitivity, exactly: F grows with m and
//     falls with v, so over m +- D_m, v +- D_v (v >= 0) its extremes are
//     two corners of the box. Where a gradient is known only to within its
//     own size the box is wide, and Cauchy-Schwarz caps it: every Adam
//     update has |m^| <= C_t sqrt(v^), C_t^2 = sum a_i^2/b_i over the
//     weights of m^ and v^, so |F32 - F| <= |F| + lr C_t (1 + gamma_{5t+10}).
//     The update's ten roundings add gamma_10 |F|; AdamW's decay rounds
//     u(2 + 3 lr wd/(1 - lr wd)) |p|; the result's rounding u |p|.
//   - the truth's own float64 rounding is the same analysis with u = 2^-53
//     (2^-29 of the bound): bounds are widened by 2^-28, rounded up.
//
// The log gives, per tensor and step, bound/error at the worst element
// (about 1 where the error is the float32 rounding of the result itself,
// which the bound counts exactly, and mostly 2 to 10^5) and PyTorch's
// float32 against the same bound. The test keeps its power: a wrong
// layout, formula or constant moves parameters by a visible fraction of
// their step, and each parameter's median bound is at most a quarter of
// its step — except for the layers at or below a relu or pool that may
// flip in that step (their bounds then hold the gradient the flip would
// send the other way, a real float32 outcome however unlikely; logged),
// and except
// SimpleCNN's conv layers, whose weight gradients sum 47,628 and 11,163
// products each: bounded for every summation order, their error may
// exceed their step, and they are checked only that far;
// likewise LeNet-5's (examples/lenet5.cnn) conv layers: the bounds reach
// them through the magnitudes of three linear and four tanh layers (the
// forward errors through |W| grow about tenfold a layer).
func TestCheckpointInPyTorch(t *testing.T) {
	py := requireTorch(t)
	mnist, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	withOptimizer := func(opt string) []byte {
		src := strings.Replace(string(mnist), "optimizer = sgd(lr=0.05, momentum=0.9)", "optimizer = "+opt, 1)
		require.NotEqual(t, string(mnist), src)
		return []byte(src)
	}
	simplecnn, err := os.ReadFile("../../examples/simplecnn.cnn")
	require.NoError(t, err)
	lenet5, err := os.ReadFile("../../examples/lenet5.cnn")
	require.NoError(t, err)
	for seed := range uint64(*torchSeeds) {
		for _, tc := range []torchCase{
			{"simplecnn sgd", "simplecnn", simplecnn, 3, 1, []string{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"}},
			{"mnist sgd nesterov", "mnist", withOptimizer("sgd(lr=0.05, momentum=0.9, nesterov=true, weight_decay=0.001)"), 8, 3, nil},
			{"mnist adam", "mnist", withOptimizer("adam(lr=0.01, weight_decay=0.01)"), 8, 3, nil},
			{"mnist adamw", "mnist", withOptimizer("adamw(lr=0.01, betas=[0.8, 0.99], eps=1e-6)"), 8, 3, nil},
			{"lenet5 sgd", "lenet5", lenet5, 8, 3, []string{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"}},
		} {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) { agreesWithPyTorch(t, py, tc, seed) })
		}
	}
}

// torchCase is a model, its batch size, its steps, and the parameters
// whose bound may exceed their step (coarse; every other one's median
// bound is at most a quarter of its step).
type torchCase struct {
	name, model string
	src         []byte
	n, steps    int
	coarse      []string
}

// torchResult is what scripts/torch_checkpoint.py prints: the float64
// loss and correct count at the checkpoint with their bounds, and
// PyTorch's float32 ones (information).
type torchResult struct {
	Loss           float64
	LossBound      float64 `json:"loss_bound"`
	Correct        int
	MayFlip        int     `json:"may_flip"`
	TorchLoss32    float64 `json:"torch_loss32"`
	TorchCorrect32 int     `json:"torch_correct32"`
	Optimizer      string
	Version        string     `json:"torch"`
	Flips          []int      // per step: relu or pool elements float32 may flip,
	Unsettled      [][]string // and the parameters at or below them
}

func agreesWithPyTorch(t *testing.T, py string, tc torchCase, seed uint64) {
	model, n, steps := tc.model, tc.n, tc.steps
	res, err := compiler.CompileSource(model+".cnn", tc.src, compiler.Options{Batch: int64(n)})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	// CNNC_EMU_TEST_FLAGS (e.g. "-O3 -march=native -ffp-contract=fast")
	// compiles the kernels otherwise: the bound holds for any
	dev, err := cpu.New(c.Kernels, "kernels.cu", cpu.Options{Flags: strings.Fields(os.Getenv("CNNC_EMU_TEST_FLAGS"))})
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	s, err := trainer.NewSession(c.Spec, dev, 5+seed)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	rng := rand.New(rand.NewPCG(11+seed, 12))
	sp := c.Spec
	b := trainer.Batch{Valid: n, Pixels: make([]uint8, n*sp.H*sp.W*sp.C), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	lb := make([]byte, 4*n)
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(sp.Classes))
		binary.LittleEndian.PutUint32(lb[4*i:], uint32(b.Labels[i]))
	}
	dir := t.TempDir()
	ck, px, lbl, out := filepath.Join(dir, "ck.safetensors"), filepath.Join(dir, "px"), filepath.Join(dir, "lb"), filepath.Join(dir, "torch.safetensors")
	require.NoError(t, s.Save(ck, nil))
	require.NoError(t, os.WriteFile(px, b.Pixels, 0o644))
	require.NoError(t, os.WriteFile(lbl, lb, 0o644))

	cmd := exec.Command(py, filepath.Join(moduleRoot(t), "scripts/torch_checkpoint.py"), model, ck, px, lbl, fmt.Sprint(n), fmt.Sprint(steps), out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	var torch torchResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &torch), stdout.String())
	loss, correct, err := s.EvalBatch(b)
	require.NoError(t, err)
	t.Logf("PyTorch %s, %s: loss %.7f, cnnc's error %.1e, bound %.1e (PyTorch float32's error %.1e); correct %d (cnnc %d, %d may flip; PyTorch float32 %d)",
		torch.Version, torch.Optimizer, torch.Loss, math.Abs(float64(loss)-torch.Loss), torch.LossBound, math.Abs(torch.TorchLoss32-torch.Loss),
		torch.Correct, correct, torch.MayFlip, torch.TorchCorrect32)
	assert.LessOrEqual(t, math.Abs(float64(loss)-torch.Loss), torch.LossBound, "loss: cnnc's float32 error")
	assert.LessOrEqual(t, abs(correct-torch.Correct), torch.MayFlip, "correct count")

	// step by step, each from the same float32 parameters and state: the
	// checkpoint, then the truth of the step before rounded to float32
	for step := 1; step <= steps; step++ {
		at := fmt.Sprintf("%s.%d", out, step)
		start := ck
		if step > 1 {
			start = fmt.Sprintf("%s.%d.ck", out, step-1)
			_, err := s.Load(start, true)
			require.NoError(t, err)
		}
		_, _, err = s.TrainStep(b)
		require.NoError(t, err)
		require.Len(t, torch.Flips, steps)
		require.Len(t, torch.Unsettled, steps)
		unsettled := torch.Unsettled[step-1]
		if torch.Flips[step-1] > 0 {
			t.Logf("step %d: %d relu or pool elements may flip in float32; the bounds of %v hold the gradient a flip would send the other way",
				step, torch.Flips[step-1], unsettled)
		}
		files := map[string]*checkpoint.File{}
		for _, name := range []string{at + ".f64", at + ".bound", at + ".torch", start} {
			files[name], err = checkpoint.Read(name)
			require.NoError(t, err)
		}
		read := func(file, name string, shape []int64) []float32 {
			v, err := files[file].Expect(name, checkpoint.F32, shape)
			require.NoError(t, err)
			return v.Float32s()
		}
		for k, p := range append(append([]trainer.Tensor{}, sp.Params...), sp.State...) {
			hi, lo := read(at+".f64", p.Name, p.Shape), read(at+".f64", p.Name+".lo", p.Shape)
			bound, torch32, init := read(at+".bound", p.Name, p.Shape), read(at+".torch", p.Name, p.Shape), read(start, p.Name, p.Shape)
			got, err := s.ReadTensor(p)
			require.NoError(t, err)
			var e, et errorStats
			var moves, bounds []float64
			for i := range hi {
				truth := float64(hi[i]) + float64(lo[i])
				e.add(i, math.Abs(float64(got[i])-truth), float64(bound[i]), truth)
				et.add(i, math.Abs(float64(torch32[i])-truth), float64(bound[i]), truth)
				moves = append(moves, math.Abs(truth-float64(init[i])))
				bounds = append(bounds, float64(bound[i]))
			}
			t.Logf("step %d %s: moved %.2e RMS; error %.2e RMS, %.2e max; bound %.2e RMS, median bound/move %.2g; margin (bound/error, worst element) %s; PyTorch float32: %.2e RMS, margin %s",
				step, p.Name, rms(moves), e.rms(), e.max, rms(bounds), medianRatio(bounds, moves), e.margin(), et.rms(), et.margin())
			assert.Zero(t, e.over, "step %d %s: %d of %d elements are farther from the float64 step than float32 rounding can take them; worst [%d]: cnnc %.9g, truth %.9g, bound %.3g",
				step, p.Name, e.over, len(hi), e.worst, got[e.worst], float64(hi[e.worst])+float64(lo[e.worst]), bound[e.worst])
			if k < len(sp.Params) && !slices.Contains(unsettled, p.Name) && !slices.Contains(tc.coarse, p.Name) {
				// the test's power: a wrong layout, formula or constant
				// moves a parameter by a visible fraction of its step
				assert.LessOrEqual(t, medianRatio(bounds, moves), 0.25, "step %d %s: the bound is not far below the step", step, p.Name)
			}
		}
	}
}

func rms(v []float64) float64 {
	sq := 0.0
	for _, x := range v {
		sq += x * x
	}
	return math.Sqrt(sq / float64(max(len(v), 1)))
}

// medianRatio is the median of a[i]/b[i] over the elements where b[i] > 0.
func medianRatio(a, b []float64) float64 {
	var r []float64
	for i := range a {
		if b[i] > 0 {
			r = append(r, a[i]/b[i])
		}
	}
	if len(r) == 0 {
		return math.NaN()
	}
	sort.Float64s(r)
	return r[len(r)/2]
}

// errorStats gathers |x - truth| against its bound over a tensor. Its
// margins are bound / error at the worst element, and the same for the
// arithmetic before the result's own rounding: every bound holds u|x| for
// that rounding, at most half an ulp, so where it is all the error there
// is the first margin is 1 to 2 by construction; the second is
// (bound - h) / (error - h), h half an ulp of the truth, over the elements
// whose error exceeds h.
type errorStats struct {
	n, over, worst int
	sq, max        float64
	ratio, arith   float64 // the largest error / bound, overall and past the result's rounding
}

func (s *errorStats) add(i int, err, bound, truth float64) {
	s.n++
	s.sq += err * err
	s.max = math.Max(s.max, err)
	if err > bound {
		s.over++
	}
	if r := err / bound; err > 0 && r > s.ratio {
		s.ratio, s.worst = r, i
	}
	if h := halfULP32(truth); err > h {
		s.arith = math.Max(s.arith, (err-h)/(bound-h))
	}
}

// halfULP32 is half the spacing of float32 numbers at x.
func halfULP32(x float64) float64 {
	f := float32(math.Abs(x))
	return float64(math.Nextafter32(f, float32(math.Inf(1)))-f) / 2
}

func (s *errorStats) rms() float64 { return math.Sqrt(s.sq / float64(max(s.n, 1))) }

func (s *errorStats) margin() string {
	m := func(r float64) string {
		if r == 0 {
			return "none"
		}
		return fmt.Sprintf("%.3g", 1/r)
	}
	return fmt.Sprintf("%s (arithmetic %s)", m(s.ratio), m(s.arith))
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// README's PyTorch snippet, run exactly as README.md shows it (read from
// the file, so the two cannot drift) in a folder holding a checkpoint of
// MNISTNet and cnnc's scripts/, loads it into PyTorch's model with
// load_state_dict(strict=True), with Debian's torch (no safetensors
// package): every parameter arrives bit for bit.
func TestREADMELoadsCheckpointInPyTorch(t *testing.T) {
	py := requireTorch(t)
	root := moduleRoot(t)
	snippet := readmeSnippet(t, filepath.Join(root, "README.md"), "cnnc_checkpoint")
	// the kernels of export/onnx's TestTrainerCheckpointInONNXRuntime (same name, same batch):
	// one compile in runtime/native's cache serves both
	c := compileTrainerExample(t, "../../examples/mnist.cnn", 16)
	s := newSession(t, c, 3)
	dir := t.TempDir()
	require.NoError(t, s.Save(filepath.Join(dir, "m.safetensors"), nil))
	require.NoError(t, os.Symlink(filepath.Join(root, "scripts"), filepath.Join(dir, "scripts")))
	// the model before the snippet; after it, what PyTorch holds
	program := fmt.Sprintf("import sys\nsys.path.insert(0, %q)\nfrom torch_train import MNISTNet\nmodel = MNISTNet()\n\n", filepath.Join(root, "scripts", "bench")) +
		snippet +
		"\nfrom torch_checkpoint import write_safetensors\nwrite_safetensors(\"loaded.safetensors\", model.state_dict())\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "snippet.py"), []byte(program), 0o644))
	cmd := exec.Command(py, "snippet.py")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "README's snippet:\n%s\n%s", snippet, out)
	loaded, err := checkpoint.Read(filepath.Join(dir, "loaded.safetensors"))
	require.NoError(t, err)
	require.Len(t, loaded.Tensors, len(c.Spec.Params))
	for _, p := range c.Spec.Params {
		want, err := s.ReadTensor(p)
		require.NoError(t, err)
		got, err := loaded.Expect(p.Name, checkpoint.F32, p.Shape)
		require.NoError(t, err)
		assert.Equal(t, want, got.Float32s(), p.Name)
	}
}

// readmeSnippet is the one ```python block of the README that mentions
// marker, without the indentation of its list item.
func readmeSnippet(t *testing.T, readme, marker string) string {
	t.Helper()
	b, err := os.ReadFile(readme)
	require.NoError(t, err)
	var found []string
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```python" {
			continue
		}
		indent := lines[i][:strings.Index(lines[i], "`")]
		var block []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			block = append(block, strings.TrimPrefix(lines[i], indent))
		}
		if code := strings.Join(block, "\n") + "\n"; strings.Contains(code, marker) {
			found = append(found, code)
		}
	}
	require.Len(t, found, 1, "%s: want one ```python block using %s", readme, marker)
	return found[0]
}
