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
// for the last, a stateless optimizer, which saves nothing). A parameter's
// state is either split in element ranges over every rank (each buffer
// one rank's range: ⌈n/N⌉ rounded up to RangeAlignElems) when it outweighs
// 1/SplitFraction of an even share, or lies whole with one rank; the
// shares add up to the state plus the ranges' rounding, and the largest is
// within the greedy bound: the even share plus the largest whole
// parameter's state (at most 1/SplitFraction of it), plus rounding. On
// SimpleCNN (fc1.weight: 99.8% of the state) and ResNet-18 that is about
// an even share — where whole-tensor shares left SimpleCNN's largest at
// nearly the whole state.
func TestShardOptimizerShrinksThePlan(t *testing.T) {
	for _, c := range []struct {
		path      string
		ranks     int
		stateless bool
		split     bool // some parameter's state is split
	}{
		{"../../examples/simplecnn.cnn", 4, false, true},
		{"../../examples/adam_dropout.cnn", 2, false, true},
		{"../../examples/resnet18.cnn", 8, false, true},
		{"testdata/small.cnn", 2, true, false},
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
			aligned := func(b int64) int64 { return (b + p.Alignment - 1) / p.Alignment * p.Alignment }
			var largest, sum, rounding, splitShare int64
			var split []string
			for _, prm := range p.Params {
				if len(prm.State) == 0 {
					continue
				}
				var bytes int64
				first := p.Buffers[prm.State[0]]
				for _, id := range prm.State {
					b := p.Buffers[id]
					n := int64(1)
					for _, d := range prm.Shape {
						n *= d
					}
					assert.Equal(t, first.RangeElems, b.RangeElems, "%s: a parameter's state is split alike", prm.Name)
					if b.RangeElems > 0 {
						k := (n + int64(c.ranks) - 1) / int64(c.ranks)
						assert.Equal(t, (k+RangeAlignElems-1)/RangeAlignElems*RangeAlignElems, b.RangeElems, "%s", b.Name)
						assert.Equal(t, 4*b.RangeElems, b.Bytes, "%s: one rank's range", b.Name)
						assert.Zero(t, b.Owner, "%s", b.Name)
						assert.True(t, b.Persistent, "%s", b.Name)
						rounding += int64(c.ranks)*aligned(b.Bytes) - aligned(4*n)
						splitShare += aligned(b.Bytes)
						bytes += aligned(4 * n)
						continue
					}
					assert.Equal(t, first.Owner, b.Owner, "%s: one rank holds a parameter's state", prm.Name)
					assert.True(t, b.Owner >= 1 && b.Owner <= c.ranks, "%s: owner %d", b.Name, b.Owner)
					bytes += aligned(b.Bytes)
				}
				if first.RangeElems > 0 {
					split = append(split, prm.Name)
					assert.Greater(t, bytes*int64(c.ranks)*SplitFraction, s.StateBytes, "%s is split", prm.Name)
				} else {
					largest = max(largest, bytes)
				}
			}
			assert.Equal(t, split, s.SplitParams)
			for _, r := range s.RankBytes {
				sum += r
				assert.GreaterOrEqual(t, r, splitShare, "every rank holds a range of each split parameter")
			}
			assert.Equal(t, s.StateBytes+rounding, sum)
			for _, b := range p.Buffers {
				assert.Equal(t, b.Category == CatState, b.Owner > 0 || b.RangeElems > 0, "%s", b.Name)
			}
			if c.stateless {
				assert.Zero(t, s.StateBytes)
				assert.Equal(t, whole.PeakBytes, p.PeakBytes, "no state, no saving")
				return
			}
			assert.Equal(t, c.split, len(split) > 0, "split: %v", split)
			assert.Less(t, s.ShardBytes, s.StateBytes)
			assert.LessOrEqual(t, s.ShardBytes, (sum+int64(c.ranks)-1)/int64(c.ranks)+largest)
			assert.LessOrEqual(t, largest*int64(c.ranks)*SplitFraction, s.StateBytes, "no whole parameter outweighs 1/%d of an even share", SplitFraction)
			t.Logf("%d ranks: largest share %d of %d bytes of state (even: %d); split %v", c.ranks, s.ShardBytes, s.StateBytes, s.StateBytes/int64(c.ranks), split)
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
