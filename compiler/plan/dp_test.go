package plan

import (
	"os"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
)

func analyzeFile(t *testing.T, path string, batch int64) *analysis {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(path, src, compiler.Options{})
	require.NoError(t, err)
	a, err := analyze(res.Graph, batch, DefaultAlignment)
	require.NoError(t, err)
	return a
}

// The dynamic programme over a chain is optimal: for every budget, no
// subset of droppable activations (all 2^n, evaluated by the scheduler
// itself) keeps the live bytes within the budget with fewer recomputed
// FLOPs, and the programme's choice does keep them within it.
func TestChainDPIsOptimal(t *testing.T) {
	for _, c := range []struct {
		path  string
		batch int64
	}{
		{"testdata/deep.cnn", 6},
		{"testdata/small.cnn", 8},
		{"testdata/dropout.cnn", 6},
		{"../../examples/mnist.cnn", 16},
		{"../../examples/simplecnn.cnn", 4},
	} {
		t.Run(c.path, func(t *testing.T) {
			a := analyzeFile(t, c.path, c.batch)
			base, err := a.bestSplits(decisions{split: map[int]bool{}, drop: map[int]bool{}})
			require.NoError(t, err)
			_, chain := a.chainAttribution(base)
			require.True(t, chain, "expected a chain")
			drops := a.droppable()
			require.NotEmpty(t, drops)
			type point struct{ live, extra int64 }
			var all []point
			for mask := 0; mask < 1<<len(drops); mask++ {
				d := base.d.clone()
				for i, u := range drops {
					if mask&(1<<i) != 0 {
						d.drop[a.fwd[u].ID] = true
					}
				}
				cand, err := a.evaluate(d)
				require.NoError(t, err)
				all = append(all, point{cand.maxLive, cand.extra})
			}
			budgets := map[int64]bool{}
			for _, p := range all {
				budgets[p.live] = true
				budgets[p.live-1] = true
			}
			var sorted []int64
			for b := range budgets {
				sorted = append(sorted, b)
			}
			sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
			for _, budget := range sorted {
				best := int64(-1)
				for _, p := range all {
					if p.live <= budget && (best < 0 || p.extra < best) {
						best = p.extra
					}
				}
				d, ok := a.chainDP(base.d, budget)
				require.Equal(t, best >= 0, ok, "budget %d: feasible?", budget)
				if !ok {
					continue
				}
				got, err := a.evaluate(d)
				require.NoError(t, err)
				assert.LessOrEqual(t, got.maxLive, budget, "budget %d", budget)
				assert.Equal(t, best, got.extra, "budget %d: recomputed FLOPs", budget)
			}
		})
	}
}

// The residual and skip-connection models are not chains: the heuristic
// handles them.
func TestDAGsAreNotChains(t *testing.T) {
	for _, path := range []string{"testdata/dag.cnn", "../testdata/residual.cnn"} {
		a := analyzeFile(t, path, 3)
		base, err := a.bestSplits(decisions{split: map[int]bool{}, drop: map[int]bool{}})
		require.NoError(t, err)
		_, chain := a.chainAttribution(base)
		assert.False(t, chain, path)
	}
}
