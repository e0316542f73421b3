package data

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shardBatches collects an epoch's batches of a rank (copied).
func shardBatches(t *testing.T, l *Loader, epoch, first int) []Batch {
	t.Helper()
	var out []Batch
	for b, err := range l.Epoch(context.Background(), epoch, first) {
		require.NoError(t, err)
		out = append(out, Batch{Epoch: b.Epoch, Number: b.Number, GlobalSize: b.GlobalSize,
			Pixels: slices.Clone(b.Pixels), Labels: slices.Clone(b.Labels), Indices: slices.Clone(b.Indices)})
	}
	return out
}

// Data parallelism: N ranks with the same seed take disjoint shares of
// every global batch which, put together in rank order, are the batch one
// process gets — samples, labels and pixels, epoch after epoch, resumed
// mid-epoch too; a partial last batch leaves later ranks fewer samples or
// none, and GlobalSize says how many the whole batch has.
func TestLoaderShardsEveryBatchOverRanks(t *testing.T) {
	ds := smallMNIST(t, 53) // 53 = 6 batches of 8 and 5 samples: ranks 2 and 3 of 4 get none, rank 1 three
	one, err := NewLoader(ds, LoaderOptions{BatchSize: 8, Seed: 11, Workers: 2})
	require.NoError(t, err)
	for _, ranks := range []int{2, 4, 8} {
		for epoch := range 2 {
			want := shardBatches(t, one, epoch, 0)
			got := make([][]Batch, ranks)
			for r := range ranks {
				l, err := NewLoader(ds, LoaderOptions{BatchSize: 8, Seed: 11, Workers: 3, Rank: r, Ranks: ranks})
				require.NoError(t, err)
				got[r] = shardBatches(t, l, epoch, 0)
				require.Len(t, got[r], len(want), "every rank steps through every batch")
			}
			for n, w := range want {
				var idx []int
				var labels []int32
				var pixels []uint8
				for r := range ranks {
					b := got[r][n]
					assert.Equal(t, n, b.Number)
					assert.Equal(t, w.Size(), b.GlobalSize)
					assert.LessOrEqual(t, b.Size(), 8/ranks)
					if b.Size() < 8/ranks && r+1 < ranks {
						assert.Zero(t, got[r+1][n].Size(), "ranks fill in order")
					}
					idx = append(idx, b.Indices...)
					labels = append(labels, b.Labels...)
					pixels = append(pixels, b.Pixels...)
				}
				assert.Equal(t, w.Indices, idx, "ranks %d, epoch %d, batch %d", ranks, epoch, n)
				assert.Equal(t, w.Labels, labels)
				assert.Equal(t, w.Pixels, pixels)
			}
		}
	}
	last := func(rank int) *Batch {
		l, err := NewLoader(ds, LoaderOptions{BatchSize: 8, Seed: 11, Rank: rank, Ranks: 4})
		require.NoError(t, err)
		b := shardBatches(t, l, 0, 5)
		require.Len(t, b, 2, "resumed at batch 5 of 7")
		return &b[1]
	}
	assert.Equal(t, []int{2, 2, 1, 0}, []int{last(0).Size(), last(1).Size(), last(2).Size(), last(3).Size()}, "5 samples over 4 ranks of 2")
	assert.Equal(t, 5, last(3).GlobalSize)
	plain := shardBatches(t, one, 0, 0)
	assert.Equal(t, 8, plain[0].GlobalSize, "one process: the batch itself")
}

func TestLoaderShardOptionsAreChecked(t *testing.T) {
	ds := smallMNIST(t, 10)
	for _, c := range []struct {
		opts LoaderOptions
		msg  string
	}{
		{LoaderOptions{BatchSize: 8, Ranks: 3}, "global batch 8 does not split evenly over 3 ranks"},
		{LoaderOptions{BatchSize: 8, Ranks: 2, Rank: 2}, "rank 2 of 2: want 0..1"},
		{LoaderOptions{BatchSize: 8, Ranks: 2, Rank: -1}, "rank -1 of 2: want 0..1"},
		{LoaderOptions{BatchSize: 8, Ranks: -1}, "-1 ranks: want at least 1"},
		{LoaderOptions{BatchSize: 8, Rank: 1}, "rank 1 without data-parallel ranks"},
	} {
		_, err := NewLoader(ds, c.opts)
		require.Error(t, err, "%+v", c.opts)
		assert.Contains(t, err.Error(), c.msg)
	}
}
