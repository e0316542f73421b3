package driver_test

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/examples"
)

func loadInfer(t *testing.T, name string, batch int64) *compiler.Result {
	t.Helper()
	src, err := fs.ReadFile(examples.Models, name)
	require.NoError(t, err)
	res, err := driver.Load(name, src, compiler.Options{Batch: batch, Infer: true})
	require.NoError(t, err)
	require.True(t, res.Graph.Infer)
	return res
}

// The inference plan holds the parameters (batch norm folded: its
// parameters and statistics are gone), the input and the forward pass's
// activations, two at a time at most: no saved activations, argmax bits,
// gradients or optimizer state. Its peak is a small part of training's at
// the same batch (SimpleCNN: fc1's 14.7 MB of weights dominate both, and
// training holds them with their momentum besides its saved activations;
// vgg_small: activations dominate training's) and at least the
// parameters plus the largest layer's input and output.
func TestInferencePlan(t *testing.T) {
	for _, c := range []struct {
		file  string
		batch int64
		ratio float64 // inference peak / training peak at most
	}{
		{"simplecnn.cnn", 32, 0.6},  // measured: 26.6 MB of 47.4 MB
		{"vgg_small.cnn", 128, 0.2}, // measured: 23.6 MB of 136 MB (CPU target)
	} {
		t.Run(c.file, func(t *testing.T) {
			for _, tg := range []driver.Target{driver.CPU, driver.CUDA} {
				train, err := driver.Plan(load(t, c.file, c.batch), plan.Config{}, tg)
				require.NoError(t, err)
				res := loadInfer(t, c.file, c.batch)
				inf, err := driver.Plan(res, plan.Config{}, tg)
				require.NoError(t, err)
				t.Logf("%s %s batch %d: training peak %d bytes, inference peak %d bytes", c.file, tg, c.batch, train.PeakBytes, inf.PeakBytes)
				assert.Less(t, float64(inf.PeakBytes), c.ratio*float64(train.PeakBytes))
				params := int64(0)
				for _, p := range res.Graph.Params {
					params += p.Value.Type.Bytes(1)
				}
				assert.Greater(t, inf.PeakBytes, params)
				for _, b := range inf.Buffers {
					assert.NotContains(t, []string{"grad", "state", "saved", "argmax"}, b.Category, "%s", b.Name)
				}
				for _, s := range inf.Steps {
					assert.Equal(t, "forward", s.Phase, s.Text)
				}
			}
		})
	}
}
