package trainergen

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// The step's scalar block of every example's plan (batch 32 and 256, with
// and without its memory budget) lies in bytes no planned buffer ever
// holds, inside the planned arena, where no evaluation buffer starts: the
// trainer still allocates exactly the planned peak.
func TestScalarsInThePlannedArena(t *testing.T) {
	for _, path := range []string{"../../examples/mnist.cnn", "../../examples/simplecnn.cnn", "../../examples/adam_dropout.cnn"} {
		for _, batch := range []int64{32, 256} {
			for _, budget := range []bool{false, true} {
				src, err := os.ReadFile(path)
				require.NoError(t, err)
				res, err := compiler.CompileSource(path, src, compiler.Options{Batch: batch})
				require.NoError(t, err)
				cfg := plan.Config{}
				if budget {
					if res.Train.MemoryBudget == 0 {
						continue
					}
					cfg.Budget = res.Train.MemoryBudget
				}
				c, err := CompilePlan(res, cfg)
				require.NoError(t, err, "%s batch %d", path, batch)
				sp := c.Spec
				block := span{sp.Scalars, device.StepScalarsBytes}
				assert.Equal(t, c.Plan.PeakBytes, sp.ArenaBytes, "%s batch %d budget %v", path, batch, budget)
				assert.Zero(t, sp.Scalars%8)
				for _, b := range c.Plan.Buffers {
					assert.False(t, overlap(block, span{b.Offset, b.Bytes}), "%s batch %d: %s", path, batch, b.Name)
				}
				if sp.EvalArenaBytes == 0 { // evaluation in the training arena, around the block
					for _, l := range sp.Eval.Launches {
						for _, a := range l.Args {
							if a.Kind == trainer.ArgBuffer && a.Arena == trainer.TrainArena {
								assert.False(t, block.off <= a.Offset && a.Offset < block.off+block.bytes, "%s: %s", path, l.Kernel)
							}
						}
					}
				}
				require.NoError(t, sp.Validate())
			}
		}
	}
}

func overlap(a, b span) bool { return a.off < b.off+b.bytes && b.off < a.off+a.bytes }

// Where the plan leaves no free bytes the block goes after the arena; it
// prefers the bytes right after an input (one copy for both) to other holes.
func TestScalarsPlace(t *testing.T) {
	full := &plan.Plan{ArenaBytes: 1000, Buffers: []*plan.Buffer{{Offset: 0, Bytes: 600}, {Offset: 512, Bytes: 488}}}
	at, grown := scalarsPlace(full, nil)
	assert.Equal(t, int64(1000), at)
	assert.Equal(t, int64(1032), grown)

	holes := &plan.Plan{ArenaBytes: 1024, Buffers: []*plan.Buffer{{Offset: 0, Bytes: 40}, {Offset: 256, Bytes: 96}, {Offset: 512, Bytes: 512}}}
	at, grown = scalarsPlace(holes, nil)
	assert.Equal(t, int64(40), at, "the first hole")
	assert.Zero(t, grown)
	at, _ = scalarsPlace(holes, []span{{256, 96}})
	assert.Equal(t, int64(352), at, "right after the input")
	odd := &plan.Plan{ArenaBytes: 1024, Buffers: []*plan.Buffer{{Offset: 0, Bytes: 40}, {Offset: 256, Bytes: 100}, {Offset: 512, Bytes: 512}}}
	at, _ = scalarsPlace(odd, []span{{256, 100}})
	assert.Equal(t, int64(40), at, "an input that ends off the 8-byte grid cannot be followed directly")
}
