package onnx_test

import (
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/export/onnx"
	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// The trainer's own checkpoint, exported, predicts what the trainer
// predicts: examples/mnist.cnn's trainer (the CPU target's kernels, as
// cnnc build makes it by default) trains 60 steps on real MNIST digits and saves its
// checkpoint; ONNX Runtime runs the exported model on a test batch, and its
// logits give the trainer's evaluation (EvalBatch, dropout off) — the same
// mean loss and the same number of correct predictions — and the float64
// reference's logits from that checkpoint.
func TestTrainerCheckpointInONNXRuntime(t *testing.T) {
	node, mods := requireORT(t)
	if testing.Short() {
		t.Skip("compiles the MNIST trainer's kernels with g++")
	}
	const batch = 16
	path := "../../examples/mnist.cnn"
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	full, err := compiler.CompileSource(path, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	c, err := driver.Compile(full, plan.Config{}, driver.CPU)
	require.NoError(t, err)
	dev, err := native.New(c.Kernels, "kernels.cc", native.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	sess, err := trainer.NewSession(c.Spec, dev, 3)
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() })

	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	ds, err := data.LoadMNIST(dir, "train")
	require.NoError(t, err)
	next := 0
	mnistBatch := func() trainer.Batch {
		b := trainer.Batch{Valid: batch}
		for range batch {
			b.Pixels = append(b.Pixels, ds.Images.Image(next)...)
			b.Labels = append(b.Labels, int32(ds.Labels[next]))
			next++
		}
		return b
	}
	for range 60 {
		_, _, err := sess.TrainStep(mnistBatch())
		require.NoError(t, err)
	}
	ck := filepath.Join(t.TempDir(), "mnist.safetensors")
	require.NoError(t, sess.Save(ck, nil))

	res := forward(t, path)
	model, _ := exportFile(t, res, ck, t.TempDir(), "mnist-trained", onnx.Options{})
	b := mnistBatch()
	x := toTensor(b.Pixels) // one channel: HWC is CHW
	got := runORT(t, node, mods, model, x, batch, res.Graph.Inputs[0].Type.Dims)
	checkAgainstAnalysis(t, "trained MNIST", referenceEval(t, res.Graph, ck, float64s(x), batch), got)

	loss, correct, err := sess.EvalBatch(b)
	require.NoError(t, err)
	ortLoss, ortCorrect, ambiguous := crossEntropy(got, b.Labels, 10, issueTolerance)
	// the trainer's float32 logits and ONNX Runtime's are both within 1e-4
	// of the exact ones (TestExportInONNXRuntime's analysis; kernelcheck's
	// for the kernels), so each sample's loss differs by at most 2·2e-4
	// (the loss is 1-Lipschitz in each logit's max-norm, twice: the
	// logsumexp and the label's logit), plus float32 rounding of the loss
	assert.InDelta(t, ortLoss, float64(loss), 4*issueTolerance+1e-5*math.Max(1, ortLoss))
	assert.InDelta(t, ortCorrect, correct, float64(ambiguous), "correct predictions (%d samples with a top-2 margin under 2e-4)", ambiguous)
	t.Logf("trainer: loss %.6f, %d/%d correct; ONNX Runtime: loss %.6f, %d correct (%d ambiguous)", loss, correct, batch, ortLoss, ortCorrect, ambiguous)
}

// crossEntropy is the mean softmax cross-entropy of float32 logits (in
// float64), the number of samples whose largest logit is their label, and
// how many samples have a top-2 margin under 2·tol (whose prediction two
// runtimes within tol of the truth may disagree on).
func crossEntropy(logits []float32, labels []int32, classes int, tol float64) (float64, int, int) {
	sum, correct, ambiguous := 0.0, 0, 0
	for s, l := range labels {
		row := float64s(logits[s*classes : (s+1)*classes])
		best, second := argmax2(row)
		if best == int(l) {
			correct++
		}
		if row[best]-row[second] <= 2*tol {
			ambiguous++
		}
		lse := 0.0
		for _, v := range row {
			lse += math.Exp(v - row[best])
		}
		sum += math.Log(lse) + row[best] - row[l]
	}
	return sum / float64(len(labels)), correct, ambiguous
}
