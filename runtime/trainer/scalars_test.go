package trainer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
)

// A spec whose step scalar block overlaps a tensor, leaves the arena or is
// misaligned is refused before anything runs.
func TestSpecChecksTheScalarBlock(t *testing.T) {
	m := trainertest.Tiny(t)
	require.NoError(t, m.Spec.Validate())
	for name, at := range map[string]int64{
		"a parameter": m.Spec.Params[0].Offset + 4,
		"the images":  m.Spec.Train.Images.Offset,
		"the end":     m.Spec.ArenaBytes - 8,
		"misaligned":  m.Spec.Scalars + 4,
	} {
		sp := *m.Spec
		sp.Scalars = at
		assert.ErrorContains(t, sp.Validate(), "scalar block", name)
	}
}

// Evaluation's logits are the classifier's [batch, classes] output, which
// Predict reads Classes a sample: a spec placing another tensor there (the
// classifier tail's input, as trainergen once did for linear_cross_entropy,
// which tiny.cnn's fc1 and loss fuse into) is refused.
func TestSpecChecksTheLogitsShape(t *testing.T) {
	m := trainertest.Tiny(t)
	batch := int64(m.Spec.Batch)
	if m.Spec.EvalBatch > 0 {
		batch = int64(m.Spec.EvalBatch)
	}
	require.Equal(t, []int64{batch, int64(m.Spec.Classes)}, m.Spec.Eval.Logits.Shape)
	for name, shape := range map[string][]int64{
		"the tail's input": {batch, 2 * 6 * 6},
		"one class more":   {batch, int64(m.Spec.Classes) + 1},
		"another batch":    {batch + 1, int64(m.Spec.Classes)},
		"flat":             {batch * int64(m.Spec.Classes)},
	} {
		sp := *m.Spec
		sp.Eval.Logits.Shape = shape
		assert.ErrorContains(t, sp.Validate(), "logits' shape", name)
	}
}
