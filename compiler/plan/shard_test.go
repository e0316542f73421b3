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

// The sharded peak is exact: placing the rank's buffers again with one
// persistent buffer of the share in place of the optimizer state's buffers
// gives the arena DataParallel.Shard predicts (for SGD with momentum, Adam,
// and, for the last, a stateless optimizer, which saves nothing).
func TestShardOptimizerPeakIsExact(t *testing.T) {
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
			cfg := Config{Batch: 8 * int64(c.ranks), Ranks: c.ranks, ShardOptimizer: true}
			a, cand, strategy, err := search(res.Graph, cfg)
			require.NoError(t, err)
			p, err := a.materialize(cand, cfg, strategy)
			require.NoError(t, err)
			s := p.DataParallel.Shard
			require.NotNil(t, s)
			var state int64
			var kept []*buffer
			for _, b := range cand.bufs {
				if b.insts[0].cat == CatState {
					state += b.bytes
					continue
				}
				kept = append(kept, b)
			}
			assert.Equal(t, c.stateless, state == 0)
			if state == 0 {
				assert.Zero(t, s.ShardBytes)
				assert.Equal(t, p.PeakBytes, s.PeakBytes, "no state, no saving")
				return
			}
			assert.Less(t, s.ShardBytes, s.StateBytes)
			assert.GreaterOrEqual(t, s.ShardBytes*int64(c.ranks), state, "the shares cover the state")
			shard := &inst{v: &ir.Value{Name: "optimizer state share", Type: ir.F32Fixed(s.ShardBytes / 4)}, persistent: true, cat: CatState, loop: -1}
			sb := &buffer{id: len(cand.bufs), insts: []*inst{shard}, bytes: s.ShardBytes, last: len(cand.steps) - 1, loop: -1}
			shard.buf = sb
			arena := place(append(kept, sb), a.align, placeEffort)
			assert.Equal(t, s.PeakBytes, arena, "the peak with the share, placed again")
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
