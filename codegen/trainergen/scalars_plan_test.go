package trainergen_test

import (
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
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
				c, err := driver.Compile(res, cfg, driver.CUDA)
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
							if a.Kind == kernelarg.Buffer && a.Arena == trainer.TrainArena {
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

// span is a byte range of an arena.
type span struct{ off, bytes int64 }

func overlap(a, b span) bool { return a.off < b.off+b.bytes && b.off < a.off+a.bytes }
