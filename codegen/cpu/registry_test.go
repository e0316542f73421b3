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
// target refuses (a codegen.NoRuleError naming the target; cmd/cnnc's
// TestBuildTargetCPURefusesDilatedConvAtTheLayer shows the user's error). An op added to the
// registry shows up here: give it a CPU rule, or add it to the refused list and the docs
// (docs/architecture.md, "The CPU target").
func TestRegistryOpsHaveCPURulesOrAreRefused(t *testing.T) {
	// the CPU target has no kernels for these yet: grouped and dilated convolutions (conv2d, not
	// fused)
	want := []string{"conv2d", "conv2d_grad_input", "conv2d_grad_weight", "conv2d_grad_bias"}
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

// A form of an op the CPU kernels do not compute — label smoothing in the loss — is refused
// with the reason, not generated without it.
func TestLabelSmoothingIsRefused(t *testing.T) {
	src := "model M(image: f32[1,6,6], label: class[3]) {\n  f = linear(flatten(image), out=3)\n  loss = cross_entropy(f, label, label_smoothing=0.1)\n}\n"
	res, err := compiler.CompileSource("m.cnn", []byte(src), compiler.Options{Batch: 4})
	require.NoError(t, err)
	_, err = cpu.Generate(res.Graph, codegen.Options{Batch: 4})
	var nr *codegen.NoRuleError
	require.ErrorAs(t, err, &nr)
	assert.Equal(t, "cpu", nr.Target)
	assert.Equal(t, "label smoothing 0.1", nr.Reason)
	assert.ErrorContains(t, err, "the cpu target cannot generate softmax_cross_entropy with label smoothing 0.1")
}
