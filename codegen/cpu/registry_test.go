package cpu_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ops"
)

// Every op of the registry that runs kernels has a CPU rule, or is one of the ops the CPU
// target refuses (a codegen.NoRuleError naming the target; cmd/cnnc's cpuRefusal turns it into
// the user's error at the layer). An op added to the registry shows up here: give it a CPU rule,
// or add it to the refused list and the docs (docs/architecture.md, "The CPU target").
func TestRegistryOpsHaveCPURulesOrAreRefused(t *testing.T) {
	want := []string{} // the CPU target has kernels for every op
	refused := []string{}
	for _, d := range ops.All() {
		if d.View || d.Kernel.ReplacedBy != "" {
			continue
		}
		if !cpu.Supported(d.Op) {
			refused = append(refused, d.Name)
		}
	}
	assert.Equal(t, want, refused)
}

// Label smoothing and grouped, depthwise and dilated convolutions generate on the CPU target:
// the loss kernel carries the smoothing (its values are TestSmoothedLossKernels'), the convs run
// the direct kernels. At batch 4 the loss kernel is the classifier tail (f and the loss fuse into
// linear_cross_entropy); at batch 256 the tail does not pay (3·B·out·in past
// ops.MaxLinearCrossEntropyMACs) and softmax_cross_entropy carries it.
func TestSmoothingAndDirectConvsGenerate(t *testing.T) {
	src := "model M(image: f32[4,6,6], label: class[3]) {\n  d = conv2d(image, out=4, kernel=3, groups=4, dilation=2, padding=2)\n  f = linear(flatten(d), out=3)\n  loss = cross_entropy(f, label, label_smoothing=0.1)\n}\n"
	for batch, loss := range map[int64]string{4: "linear_cross_entropy", 256: "softmax_cross_entropy"} {
		res, err := compiler.CompileSource("m.cnn", []byte(src), compiler.Options{Batch: batch})
		require.NoError(t, err)
		prog, err := cpu.Generate(res.Graph, codegen.Options{Batch: batch})
		require.NoError(t, err)
		families := map[string]bool{}
		for _, k := range prog.Kernels {
			families[k.Family] = true
			if k.Family == loss {
				assert.Contains(t, k.Text, "label smoothing 0.1", "batch %d: %s", batch, k.Name)
			}
		}
		for _, f := range []string{"direct_conv_fwd", "direct_conv_wgrad", "direct_conv_bgrad", loss} {
			assert.True(t, families[f], "batch %d: no %s kernel in %v", batch, f, families)
		}
		assert.Contains(t, string(prog.Source), "label smoothing 0.1")
	}
}
