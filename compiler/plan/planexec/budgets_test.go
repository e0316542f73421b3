package planexec

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

// Every small model under every budget from none down to impossible:
// planning either fits the budget or fails with a BudgetError whose
// minimum works, and whatever plan comes out runs in its arena and
// matches the reference.
func TestEveryModelEveryBudget(t *testing.T) {
	models, err := filepath.Glob("../testdata/*.cnn")
	require.NoError(t, err)
	models = append(models, "../../testdata/residual.cnn", "../../testdata/unused.cnn", "../../../examples/mnist.cnn",
		"../../../examples/lenet5.cnn") // conv2d_tanh_avgpool blocks
	for _, path := range models {
		for _, fused := range []bool{true, false} {
			opts := compiler.Options{Batch: 4}
			if !fused {
				opts.Disable = []string{"fuse"}
			}
			res := compileFile(t, path, opts)
			free, err := plan.Build(res.Graph, plan.Config{Batch: 4})
			require.NoError(t, err)
			for _, frac := range []float64{1, 0.97, 0.9, 0.8, 0.7, 0.5, 0.2} {
				budget := int64(float64(free.PeakBytes) * frac)
				if frac == 1 {
					budget--
				}
				t.Run(fmt.Sprintf("%s fused=%v budget=%.2f", filepath.Base(path), fused, frac), func(t *testing.T) {
					p, err := plan.Build(res.Graph, plan.Config{Batch: 4, Budget: budget})
					var be *plan.BudgetError
					if errors.As(err, &be) {
						assert.Greater(t, be.Min, budget)
						p, err = plan.Build(res.Graph, plan.Config{Batch: 4, Budget: be.Min})
						require.NoError(t, err, "the named minimum %d works", be.Min)
						budget = be.Min
					}
					require.NoError(t, err)
					assert.LessOrEqual(t, p.PeakBytes, budget)
					r := runBoth(t, res.Graph, p, Arena, 1)
					r.compare(t, 2e-5)
				})
			}
		}
	}
}
