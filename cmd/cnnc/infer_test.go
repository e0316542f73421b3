package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// mnistBNTrainer is testdata/mnist_bn.cnn's trainer (MNISTNet with batch
// norm after both convs, one without a conv bias, one without affine, for
// the inference build's folding), built once per test binary.
func mnistBNTrainer(t *testing.T) string {
	return buildOnce(t, "testdata/mnist_bn.cnn")
}

// predictJSON runs bin predict --json --top 10 on dir and returns each
// file's class probabilities.
func predictJSON(t *testing.T, bin, ck, dir string) map[string][]float64 {
	t.Helper()
	code, out := runTrainer(t, bin, "predict", "--checkpoint", ck, "--top", "10", "--json", dir)
	require.Equal(t, 0, code, out)
	return parsePredictions(t, out)
}

// parsePredictions reads predict --json --top 10's lines: each file's
// class probabilities.
func parsePredictions(t *testing.T, out string) map[string][]float64 {
	t.Helper()
	got := map[string][]float64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var line struct {
			File string
			Top  []struct {
				Class int
				Prob  float64 `json:"probability"`
			}
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), sc.Text())
		probs := make([]float64, 10)
		for _, c := range line.Top {
			probs[c.Class] = c.Prob
		}
		got[filepath.Base(line.File)] = probs
	}
	return got
}

// An inference-only build (cnnc build --infer) predicts what the trainer's
// own predict does, from the trainer's checkpoint, on the same image
// files: for MNISTNet (no batch norm) and for MNISTBN, whose batch norms
// it folds into the convs when it loads the checkpoint. It is built for
// another batch (5) than the trainer (32), so the 12 images run in three
// chunks, the last partial.
//
// Tolerance: both binaries compute the same function in float32 and each
// lies within the float32 forward error bound of the float64 evaluation
// that export/onnx's tests derive (γ(k) per reduction of length k; the
// largest logit error measured there is 6e-7, and 1e-4 is over 100σ of
// it). Folding changes the rounding, not the bound's form: each folded
// weight and bias is rounded once from float64 (relative 2^-24, one more
// rounding per product), where the unfolded path rounds the normalisation
// three times per element. So the logits of the two differ by well under
// 1e-4, and softmax probabilities by at most half the largest logit
// difference (the softmax Jacobian's ∞-norm is at most 1/2): 1e-4.
func TestInferBuildPredictsAsTheTrainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two trainers and two inference binaries")
	}
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	dir := t.TempDir()
	pngs := writeTestDigits(t, mnist, filepath.Join(dir, "digits"), 12)
	mnistTrainer, _ := trainerBinary(t) // TestBuiltTrainer's
	trainers := map[string]string{"mnist": mnistTrainer, "mnist_bn": mnistBNTrainer(t)}
	for _, model := range []string{"../../examples/mnist.cnn", "testdata/mnist_bn.cnn"} {
		name := strings.TrimSuffix(filepath.Base(model), ".cnn")
		t.Run(name, func(t *testing.T) {
			trainer, infer := trainers[name], filepath.Join(dir, name+"-infer")
			code, out, errOut := cnnc("build", "--infer", model, "-o", infer, "--batch", "5", "--work", filepath.Join(dir, name+"-iw"))
			require.Equal(t, 0, code, "%s\n%s", out, errOut)
			assert.Contains(t, out, "planned inference memory")
			ck := filepath.Join(dir, name+".safetensors")
			code, out = runTrainer(t, trainer, "--data", mnist, "--test", "", "--max-steps", "40", "--checkpoint", ck, "--quiet")
			require.Equal(t, 0, code, out)
			want, got := predictJSON(t, trainer, ck, pngs), predictJSON(t, infer, ck, pngs)
			require.Len(t, want, 12)
			require.Len(t, got, 12)
			for f, p := range want {
				for c := range p {
					assert.InDelta(t, p[c], got[f][c], 1e-4, "%s class %d", f, c)
				}
			}
			worst := 0.0
			for f, p := range want {
				for c := range p {
					worst = math.Max(worst, math.Abs(p[c]-got[f][c]))
				}
			}
			t.Logf("%s: largest probability difference %.2g", name, worst)
			if name == "mnist_bn" { // the CUDA C kernels on the emulator (--target emu)
				emu := filepath.Join(dir, name+"-infer-emu")
				code, out, errOut = cnnc("build", "--infer", "--target", "emu", model, "-o", emu, "--batch", "5", "--work", filepath.Join(dir, name+"-ew"))
				require.Equal(t, 0, code, "%s\n%s", out, errOut)
				got := predictJSON(t, emu, ck, pngs)
				for f, p := range want {
					for c := range p {
						assert.InDelta(t, p[c], got[f][c], 1e-4, "emu: %s class %d", f, c)
					}
				}
			}
			code, out = runTrainer(t, infer, "--version")
			assert.Equal(t, 0, code)
			assert.Contains(t, out, "inference build of model")
			code, out = runTrainer(t, infer, "--data", mnist)
			assert.Equal(t, 2, code, out)
			assert.Contains(t, out, "only predicts")
		})
	}
}

// cnnc plan --infer prints the inference plan (the forward pass at
// --batch, batch norm folded), far below the training step's peak at the
// same batch: vgg_small at batch 128, 23.6 MB against 64.5 MB (the CUDA
// target's plan, which cnnc plan shows); --json carries inference: true.
// The options that search training plans are refused with it.
func TestPlanInfer(t *testing.T) {
	peak := func(args ...string) (int64, bool) {
		t.Helper()
		code, out, errOut := cnnc(append([]string{"plan", "--json", "--batch", "128", "../../examples/vgg_small.cnn"}, args...)...)
		require.Equal(t, 0, code, errOut)
		var p struct {
			PeakBytes int64 `json:"peak_bytes"`
			Inference bool  `json:"inference"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &p))
		return p.PeakBytes, p.Inference
	}
	train, trainInf := peak()
	infer, inferInf := peak("--infer")
	assert.False(t, trainInf)
	assert.True(t, inferInf)
	t.Logf("vgg_small, batch 128: training peak %d bytes, inference peak %d bytes", train, infer)
	assert.Less(t, infer, train*2/5) // 23.6 MB of 64.5 MB (training recomputes batch norm's normalisation and conv1)

	code, out, _ := cnnc("plan", "--infer", "--batch", "16", "../../examples/vgg_small.cnn")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "cnnc inference memory plan: VGGSmall, batch 16 (forward only)")
	assert.Contains(t, out, "conv1+bn1.weight")
	assert.NotContains(t, out, "backward")

	code, _, errOut := cnnc("plan", "--infer", "--max-batch", "../../examples/vgg_small.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--infer plans the forward pass at --batch alone")

	code, out, errOut = cnnc("check", "--infer", "--dump-after=bnfold", "../../examples/vgg_small.cnn")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "# IR after bnfold")
	assert.Contains(t, out, "fold=bnfold(conv1.weight, bn1.running_mean, bn1.running_var, eps=1e-05, affine)")
	code, out, errOut = cnnc("check", "--infer", "../../examples/vgg_small.cnn")
	require.Equal(t, 0, code, errOut)
	assert.NotContains(t, out, "training FLOPs")
	code, _, errOut = cnnc("check", "--infer", "--dump-after=autodiff", "../../examples/vgg_small.cnn")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `pass "autodiff" runs only in training compilations`)

	code, out, _ = cnnc("passes")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "autodiff   required, training only")
	assert.Contains(t, out, "bnfold     optional, inference only")
}

// An inference build for the CUDA target (--target cuda), run under the
// fake driver (internal/fakecuda: the fatbin's kernels on the emulator),
// predicts from a trainer's checkpoint what the trainer does, within the
// tolerance TestInferBuildPredictsAsTheTrainer states.
func TestInferBuildCUDAUnderFakeDriver(t *testing.T) {
	nvcc.Require(t)
	if testing.Short() {
		t.Skip("builds a trainer and a CUDA inference binary")
	}
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	fake := t.TempDir()
	require.NoError(t, fakecuda.Build(fake))
	t.Setenv(fakecuda.Env, fake) // cnnc build registers the fatbin's kernels with the fake
	dir := t.TempDir()
	pngs := writeTestDigits(t, mnist, filepath.Join(dir, "digits"), 7)
	model := "testdata/mnist_bn.cnn"
	trainer, infer := mnistBNTrainer(t), filepath.Join(dir, "infer-cuda")
	code, out, errOut := cnnc("build", "--infer", "--target", "cuda", model, "-o", infer, "--batch", "4")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	ck := filepath.Join(dir, "m.safetensors")
	code, out = runTrainer(t, trainer, "--data", mnist, "--test", "", "--max-steps", "20", "--checkpoint", ck, "--quiet")
	require.Equal(t, 0, code, out)
	want := predictJSON(t, trainer, ck, pngs)
	cmd := exec.Command(infer, "predict", "--device", "cuda", "--checkpoint", ck, "--top", "10", "--json", pngs)
	cmd.Env = fakecuda.Environ(fake, os.Environ())
	var o bytes.Buffer
	cmd.Stdout = &o
	var e bytes.Buffer
	cmd.Stderr = &e
	require.NoError(t, cmd.Run(), e.String())
	got := parsePredictions(t, o.String())
	require.Len(t, got, 7)
	for f, p := range want {
		for c := range p {
			assert.InDelta(t, p[c], got[f][c], 1e-4, "%s class %d", f, c)
		}
	}
}

// An inference binary runs on one device: the data-parallel flags are a
// usage error with --infer, not silently ignored.
func TestInferBuildRefusesDataParallelFlags(t *testing.T) {
	out := filepath.Join(t.TempDir(), "infer")
	for _, flags := range [][]string{{"--gpus", "2"}, {"--data-parallel"}, {"--gpus", "2", "--shard-optimizer"}} {
		code, _, errOut := cnnc(append([]string{"build", "--infer", "../../examples/mnist.cnn", "-o", out}, flags...)...)
		assert.Equal(t, 2, code, "%v: %s", flags, errOut)
		assert.Contains(t, errOut, "cnnc build --infer: --gpus, --data-parallel and --shard-optimizer are for trainers", "%v", flags)
		assert.NoFileExists(t, out)
	}
}
