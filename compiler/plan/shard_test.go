package plan

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
)

// Sharding is real: the rank's plan holds the largest share of the
// optimizer state instead of the whole, and its peak is the unsharded
// plan's less exactly the difference (for SGD with momentum, Adam, and,
// for the last, a stateless optimizer, which saves nothing). Each
// parameter's state lies with one rank, the shares add up to the state,
// and the largest is within the greedy bound: the average plus one
// parameter's state.
func TestShardOptimizerShrinksThePlan(t *testing.T) {
	for _, c := range []struct {
		path      string
		ranks     int
		stateless bool
	}{
		{"../../examples/simplecnn.cnn", 4, false},
		{"../../examples/adam_dropout.cnn", 2, false},
		{"../../examples/resnet18.cnn", 8, false},
		{"testdata/small.cnn", 2, true},
	} {
		t.Run(c.path, func(t *testing.T) {
			src, err := os.ReadFile(c.path)
			require.NoError(t, err)
			if c.stateless {
				plain := strings.Replace(string(src), "sgd(lr=0.1, momentum=0.9)", "sgd(lr=0.1)", 1)
				require.NotEqual(t, string(src), plain)
				src = []byte(plain)
			}
			res, err := compiler.CompileSource(c.path, src, compiler.Options{})
			require.NoError(t, err)
			cfg := Config{Batch: 8 * int64(c.ranks), Ranks: c.ranks}
			whole, err := Build(res.Graph, cfg)
			require.NoError(t, err)
			cfg.ShardOptimizer = true
			p, err := Build(res.Graph, cfg)
			require.NoError(t, err)
			s := p.DataParallel.Shard
			require.NotNil(t, s)
			assert.Nil(t, whole.DataParallel.Shard)
			assert.Equal(t, p.PeakBytes, s.PeakBytes)
			assert.Equal(t, whole.PeakBytes, s.UnshardedBytes, "the unsharded peak, as planned")
			assert.Equal(t, whole.PeakBytes-s.StateBytes+s.ShardBytes, p.PeakBytes, "the saving is the state less the largest share")
			var largest, sum int64
			for _, r := range s.RankBytes {
				sum += r
			}
			assert.Equal(t, s.StateBytes, sum)
			for _, prm := range p.Params {
				var bytes int64
				for _, id := range prm.State {
					b := p.Buffers[id]
					assert.Equal(t, p.Buffers[prm.State[0]].Owner, b.Owner, "%s: one rank holds a parameter's state", prm.Name)
					assert.True(t, b.Owner >= 1 && b.Owner <= c.ranks, "%s: owner %d", b.Name, b.Owner)
					bytes += (b.Bytes + p.Alignment - 1) / p.Alignment * p.Alignment
				}
				largest = max(largest, bytes)
			}
			for _, b := range p.Buffers {
				assert.Equal(t, b.Category == CatState, b.Owner > 0, "%s", b.Name)
			}
			if c.stateless {
				assert.Zero(t, s.StateBytes)
				assert.Equal(t, whole.PeakBytes, p.PeakBytes, "no state, no saving")
				return
			}
			assert.Less(t, s.ShardBytes, s.StateBytes)
			assert.LessOrEqual(t, s.ShardBytes, (s.StateBytes+int64(c.ranks)-1)/int64(c.ranks)+largest)
		})
	}
	_, err := Build(compileGraph(t, "../../examples/simplecnn.cnn"), Config{Batch: 8, ShardOptimizer: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sharding the optimizer state needs data parallelism over more than one rank")
}

func compileGraph(t *testing.T, path string) *ir.Graph {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(path, src, compiler.Options{})
	require.NoError(t, err)
	return res.Graph
}
