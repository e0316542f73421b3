package codegen_test

import (
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
)

// Every plan of the examples — at their own batch and larger, under
// budgets that make them recompute, split updates, run in place and in
// micro-batches — passes no two overlapping byte ranges of the arena to one
// launch where a __restrict__ parameter is involved and either is written:
// that would break __restrict__'s promise (undefined behaviour that nvcc is
// free to exploit; the CPU emulator would not show it). The plans do alias
// (in-place outputs), so the check is not vacuous.
func TestPlansPassNoAliasedRestrictPointers(t *testing.T) {
	aliased := 0
	for _, c := range []struct {
		file  string
		batch int64
		cfg   plan.Config
	}{
		{"../examples/simplecnn.cnn", 32, plan.Config{}},
		{"../examples/simplecnn.cnn", 32, plan.Config{Budget: 44e6}},
		{"../examples/simplecnn.cnn", 32, plan.Config{Budget: 40e6}},
		{"../examples/simplecnn.cnn", 256, plan.Config{}},
		{"../examples/simplecnn.cnn", 256, plan.Config{Budget: 64 << 20}},
		{"../examples/mnist.cnn", 64, plan.Config{}},
		{"../examples/mnist.cnn", 64, plan.Config{MicroBatch: 24}},
		{"../examples/mnist.cnn", 64, plan.Config{MicroBatch: 16, Trunk: "conv2"}},
		// batch norm's normalisation and activations recomputed, in place
		// over the recomputed values
		{"../examples/vgg_small.cnn", 16, plan.Config{}},
		{"../examples/mobilenet_small.cnn", 16, plan.Config{}},
		// conv2d_tanh_avgpool blocks, with and without their tanh output
		{"../examples/lenet5.cnn", 64, plan.Config{}},
	} {
		src, err := os.ReadFile(c.file)
		require.NoError(t, err)
		res, err := compiler.CompileSource(c.file, src, compiler.Options{Batch: c.batch})
		require.NoError(t, err)
		comp, err := driver.Compile(res, c.cfg, driver.CUDA)
		require.NoError(t, err)
		aliased += checkNoRestrictAliasing(t, comp)
	}
	require.Positive(t, aliased, "no plan aliased any arguments: the check saw nothing")
	t.Logf("%d launches pass aliased arguments, none to __restrict__ parameters", aliased)
}

// checkNoRestrictAliasing checks every training launch of comp and returns
// how many pass overlapping buffers.
func checkNoRestrictAliasing(t *testing.T, comp *trainergen.Compiled) int {
	t.Helper()
	kernels := map[string]*codegen.Kernel{}
	for _, k := range comp.Train.Kernels {
		kernels[k.Name] = k
	}
	aliased := 0
	for i, l := range comp.Spec.Train.Launches {
		gl := comp.Train.Launches[i]
		k := kernels[l.Kernel]
		require.Len(t, k.Params, len(l.Args), l.Kernel)
		samples := launchSamples(comp.Plan, gl)
		type span struct{ lo, hi int64 }
		spans := make([]span, len(l.Args))
		for j, a := range l.Args {
			if a.Kind == kernelarg.Buffer {
				spans[j] = span{a.Offset, a.Offset + gl.Args[j].Value.Type.Bytes(samples)}
			}
		}
		found := false
		for j := range l.Args {
			for m := j + 1; m < len(l.Args); m++ {
				if l.Args[j].Kind != kernelarg.Buffer || l.Args[m].Kind != kernelarg.Buffer {
					continue
				}
				if spans[j].hi <= spans[m].lo || spans[m].hi <= spans[j].lo {
					continue
				}
				pj, pm := k.Params[j], k.Params[m]
				if pj.Const && pm.Const {
					continue // both only read: aliasing is harmless
				}
				found = true
				require.False(t, pj.Restrict || pm.Restrict,
					"%s (step %d, %s): %q and %q receive overlapping bytes [%d,%d) and [%d,%d) of the arena",
					l.Kernel, gl.Step, gl.Node.Text(), pj.Decl, pm.Decl, spans[j].lo, spans[j].hi, spans[m].lo, spans[m].hi)
			}
		}
		if found {
			aliased++
		}
	}
	return aliased
}

// launchSamples is the samples launch l processes: the batch, a loop's
// micro-batch, or what its last iteration has left.
func launchSamples(p *plan.Plan, l *codegen.Launch) int64 {
	s := p.Steps[l.Step]
	if s.Loop < 0 {
		return s.Samples
	}
	lp := p.Loops[s.Loop]
	return min(lp.MicroBatch, p.Batch-int64(l.Iter)*lp.MicroBatch)
}
