package reference

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
)

// A micro-batch call draws the full batch's dropout mask for its samples,
// and its loss and logits gradient are the full batch's terms (averaged
// over the whole batch), so micro-batches add up to the full batch.
func TestRunNodeSliceMatchesTheFullBatch(t *testing.T) {
	const batch, classes, feats = 5, 3, 7
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float64, batch*feats)
	for i := range x {
		x[i] = rng.Float64()
	}
	drop := &ir.Node{Op: ir.OpDropout, Attrs: ir.Attrs{P: 0.4, Stream: 2},
		Ins: []*ir.Value{{Type: ir.F32Batched(feats)}}, Outs: []*ir.Value{{Type: ir.F32Batched(feats)}}}
	opts := NodeOptions{Step: 3, Seed: 9, Training: true}
	full, err := RunNode(drop, [][]float64{x}, batch, opts)
	require.NoError(t, err)

	logits := make([]float64, batch*classes)
	for i := range logits {
		logits[i] = rng.NormFloat64()
	}
	labels := []float64{0, 2, 1, 1, 0}
	ce := &ir.Node{Op: ir.OpSoftmaxCrossEntropy,
		Ins:  []*ir.Value{{Type: ir.F32Batched(classes)}, {Type: ir.Type{DType: ir.Class, Batched: true, Classes: classes}}},
		Outs: []*ir.Value{{Type: ir.F32Fixed()}, {Type: ir.F32Batched(classes)}, {Type: ir.F32Fixed()}}}
	fullCE, err := RunNode(ce, [][]float64{logits, labels}, batch, opts)
	require.NoError(t, err)

	var loss, correct float64
	for first := 0; first < batch; first += 2 {
		n := min(2, batch-first)
		part, err := RunNodeSlice(drop, [][]float64{x[first*feats : (first+n)*feats]}, n, opts, Slice{First: first, Of: batch})
		require.NoError(t, err)
		assert.Equal(t, full[0][first*feats:(first+n)*feats], part[0], "dropout mask of samples %d..%d", first, first+n)
		got, err := RunNodeSlice(ce, [][]float64{logits[first*classes : (first+n)*classes], labels[first : first+n]}, n, opts, Slice{First: first, Of: batch})
		require.NoError(t, err)
		loss += got[0][0]
		correct += got[2][0]
		assert.Equal(t, fullCE[1][first*classes:(first+n)*classes], got[1], "dlogits of samples %d..%d", first, first+n)
	}
	assert.InDelta(t, fullCE[0][0], loss, 1e-15*math.Abs(loss))
	assert.Equal(t, fullCE[2][0], correct)

	_, err = RunNodeSlice(drop, [][]float64{x[:feats]}, 1, opts, Slice{First: 5, Of: batch})
	assert.ErrorContains(t, err, "outside a batch of 5")
}
