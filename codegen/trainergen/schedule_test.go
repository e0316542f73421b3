package trainergen_test

import (
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/runtime/schedule"
)

// The train block's schedule reaches the Spec (onecycle's max_lr as its
// base rate), label smoothing the loss kernel, and the Spec's Go literal
// names runtime/schedule's types and compiles.
func TestScheduleAndSmoothingReachTheSpec(t *testing.T) {
	src := `model S(image: f32[1,6,6], label: class[3]) {
    fc = linear(flatten(image), out=3)
    loss = cross_entropy(fc, label, label_smoothing=0.1)
}
train {
    optimizer = sgd(momentum=0.9)
    schedule = onecycle(max_lr=0.2, pct_start=0.25)
    batch = 4
}
`
	res, err := compiler.CompileSource("s.cnn", []byte(src), compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	assert.Equal(t, schedule.Schedule{Kind: schedule.OneCycle, PctStart: 0.25, DivFactor: 25, FinalDivFactor: 1e4}, c.Spec.Schedule)
	assert.Equal(t, float32(0.2), c.Spec.LR)
	// the loss is the classifier tail's (linear_cross_entropy: fc's forward, the loss and its gradients in one kernel)
	assert.Regexp(t, `linear_cross_entropy_b4_in36_out3\w*_ls0p1`, string(c.Kernels))

	code, err := trainergen.SpecFile("specpkg", c.Spec)
	require.NoError(t, err)
	assert.Contains(t, string(code), "Schedule: schedule.Schedule{")
	assert.Regexp(t, `Kind: +schedule.OneCycle`, string(code))
	// compiled as a package of this module, under testdata (which ./...
	// leaves out, so that no other go command sees it)
	require.NoError(t, os.MkdirAll("testdata", 0o755))
	dir, err := os.MkdirTemp("testdata", "specpkg-")
	require.NoError(t, err)
	t.Cleanup(func() {
		os.RemoveAll(dir)
		os.Remove("testdata") // when it was made for this
	})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "spec.go"), code, 0o644))
	out, err := goCmd(t, ".", "vet", "./"+filepath.ToSlash(dir))
	require.NoError(t, err, out)
}
