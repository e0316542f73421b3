package driver_test

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/examples"
	"github.com/cnnc/cnnc/internal/nvcc"
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
		{"vgg_small.cnn", 128, 0.4}, // measured: 23.6 MB of 64.5 MB (CUDA target; training recomputes batch norm's normalisation and conv1)
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

// The inference build's kernels and Spec for every target: forward
// launches only, the arena the inference plan's peak (plus at most the
// step's 32-byte scalar block), folded parameters in place of the conv and
// batch norm tensors, no batch norm buffers left (vgg_small: every batch
// norm follows a conv); on CUDA, nvcc compiles the kernels for sm_80 and
// sm_90 and every launch fits the GPUs' limits (ptxas).
func TestCompileInfer(t *testing.T) {
	for _, file := range []string{"simplecnn.cnn", "vgg_small.cnn"} {
		res := loadInfer(t, file, 16)
		for _, tg := range []driver.Target{driver.CPU, driver.CUDA} {
			c, err := driver.CompileInfer(res, plan.Config{}, tg)
			require.NoError(t, err, "%s %s", file, tg)
			s := c.Spec
			assert.True(t, s.Infer)
			assert.Empty(t, s.Train.Launches)
			assert.NotEmpty(t, s.Eval.Launches)
			assert.Empty(t, s.State)
			assert.Equal(t, 16, s.Batch)
			assert.InDelta(t, c.Plan.PeakBytes, s.ArenaBytes, 40)
			assert.Equal(t, []int64{16, 10}, s.Eval.Logits.Shape)
			folded := 0
			for _, p := range s.Params {
				if p.Folded() {
					folded++
				}
			}
			if file == "vgg_small.cnn" {
				assert.Equal(t, 10, folded, "5 convs, weight and bias each")
				assert.Empty(t, s.Buffers)
			} else {
				assert.Zero(t, folded)
			}
			for _, l := range s.Eval.Launches {
				assert.NotContains(t, l.Kernel, "grad", l.Kernel)
			}
			if tg == driver.CUDA && file == "vgg_small.cnn" {
				t.Run("nvcc", func(t *testing.T) {
					nvcc.Require(t)
					_, err := trainergen.CompileFatbinFor(s, c.Kernels)
					require.NoError(t, err)
				})
			}
		}
	}
}
