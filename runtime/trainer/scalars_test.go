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
