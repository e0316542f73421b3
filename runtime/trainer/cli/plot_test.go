package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The learning-rate panel starts at 0, so that a constant rate is drawn
// at its height: gonum centres a flat line's axis on it, which put a rate
// of 0.01 at the 0 tick between -0.8 and 0.8.
func TestLRPanelStartsAtZero(t *testing.T) {
	for _, rates := range [][]float64{{0.01, 0.01, 0.01}, {0.1, 0.05, 0.001}} {
		var c curves
		for i, lr := range rates {
			c.steps = append(c.steps, stepPoint{step: int64(i + 1), lr: lr})
		}
		p, err := c.lrPanel("M")
		require.NoError(t, err)
		assert.Equal(t, 0.0, p.Y.Min, "%v", rates)
		assert.Greater(t, p.Y.Max, rates[0], "%v: the largest rate is inside the axis", rates)
		assert.LessOrEqual(t, p.Y.Max, 1.1*rates[0]*(1+1e-12), "%v: and fills it", rates)
	}
}
