package trainergen_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A trainer's evaluation runs with batch norm folded into the conv before
// it (issue 12): bn.cnn's two batch norms after convs are folded (their
// weight and bias each: Spec.EvalFolds), its batch norm after a linear
// layer is not, so evaluation launches the statistics and normalisation
// kernels of that one alone. The folded parameters are computed from the
// trained ones before an evaluation whenever those changed: after each
// training step evaluation equals the float64 reference's (running
// statistics, the tolerance of TestCPUTrainerBatchNorm: the fold rounds
// each folded weight once, relative 2^-24), and a prediction after an
// evaluation with no step between uses the same folds.
func TestTrainerEvaluationFoldsBatchNorm(t *testing.T) {
	const batch = 6
	c := compileExample(t, "../../compiler/plan/testdata/bn.cnn", batch)
	var folds []string
	for _, f := range c.Spec.EvalFolds {
		folds = append(folds, f.Name)
	}
	assert.Equal(t, []string{"c1+bn1.weight", "c1+bn1.bias", "c2+bn2.weight", "c2+bn2.bias"}, folds)
	stats := 0
	for _, l := range c.Spec.Eval.Launches {
		if strings.Contains(l.Kernel, "batchnorm") {
			stats++
		}
	}
	trainStats := 0
	for _, l := range c.Spec.Train.Launches {
		// one merge of the statistics a batch norm (on the CUDA target
		// after a first pass over the cells, batchnorm_stats_partial)
		if strings.Contains(l.Kernel, "batchnorm_stats") && !strings.Contains(l.Kernel, "batchnorm_stats_partial") {
			trainStats++
		}
	}
	assert.Equal(t, 3, trainStats, "training normalises with three batch norms")
	assert.LessOrEqual(t, stats, 2, "evaluation: bn3's statistics and normalisation alone")

	sess := newSession(t, c, 4)
	ref := reference.New(c.Plan.Graph, 4)
	rng := rand.New(rand.NewPCG(3, 4))
	batchOf := func() trainer.Batch { return trainertest.RandomBatch(c.Spec, batch, rng) }
	for step := 0; step < 3; step++ {
		b := batchOf()
		_, _, err := sess.TrainStep(b)
		require.NoError(t, err)
		_, err = ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Train)
		require.NoError(t, err)
		e := batchOf()
		loss, correct, err := sess.EvalBatch(e)
		require.NoError(t, err)
		r, err := ref.Run(reference.Batch{N: batch, Pixels: e.Pixels, Labels: e.Labels}, reference.Eval)
		require.NoError(t, err)
		assert.InDelta(t, r.Loss, float64(loss), 1e-5*math.Max(1, r.Loss), "evaluation after step %d", step)
		assert.Equal(t, r.Correct, correct)
		preds, err := sess.Predict(e.Pixels, 1)
		require.NoError(t, err)
		logits := r.Values[c.Plan.Graph.Logits]
		for i, p := range preds {
			best := 0
			for k := 1; k < c.Spec.Classes; k++ {
				if logits[i*c.Spec.Classes+k] > logits[i*c.Spec.Classes+best] {
					best = k
				}
			}
			assert.Equal(t, best, p[0].Class, "sample %d after step %d", i, step)
		}
	}
}
