package trainergen_test

import (
	"bytes"
	"encoding/json"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/internal/datasets"
)

// A trainer of the CPU target (cnnc build --target cpu) has its kernels compiled into the binary
// by go build (cgo, with flags go build allows) and trains where no compiler is installed; its
// step's scalars (learning rate, step, valid count) reach the kernels through the scalar block;
// resume is bit-exact.
func TestNativeCPUTrainerIsStandalone(t *testing.T) {
	if testing.Short() {
		t.Skip("a go build of a trainer module")
	}
	root := moduleRoot(t)
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join(root, "examples/mnist.cnn"))
	require.NoError(t, err)
	res, err := compiler.CompileSource("mnist.cnn", src, compiler.Options{Batch: 64})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CPU)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, trainergen.WriteModuleCPU(dir, c.Spec, c.Kernels))
	for _, f := range []string{"kernels_cpu.h", "kernels_cpu.go", "cnnc_cpu.h", "main.go", "spec.go"} {
		assert.FileExists(t, filepath.Join(dir, f))
	}
	bin := filepath.Join(dir, "mnist-trainer")
	require.NoError(t, trainergen.GoBuild(dir, bin, nil, func(string) {}))

	out := filepath.Join(t.TempDir(), "out") // the one writable place
	require.NoError(t, os.Mkdir(out, 0o755))
	cmd := exec.Command(bin, "--data", mnist, "--test", "", "--max-steps", "30", "--log", filepath.Join(out, "log.jsonl"),
		"--checkpoint", filepath.Join(out, "m.safetensors"))
	cmd.Env = noToolsEnv(t)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Run(), log.String())
	assert.Contains(t, log.String(), "kernels built in)")
	assert.NotContains(t, log.String(), "CUDA emulator")
	assert.FileExists(t, filepath.Join(out, "m.safetensors"))
	steps := stepLog(t, filepath.Join(out, "log.jsonl"))
	require.Len(t, steps, 30)
	// 30 SGD steps (lr 0.05, momentum 0.9) from ln(10) = 2.30: the loss falls (the learning rate
	// reached the update kernels; with lr 0 it would stay near 2.3; measured 2.30 -> ~1.4 on the
	// last five) and every step counted its 64 samples (the valid count reached the loss).
	mean := func(s []logStep) float64 {
		m := 0.0
		for _, x := range s {
			m += x.Loss / float64(len(s))
		}
		return m
	}
	first, last := mean(steps[:5]), mean(steps[25:])
	assert.InDelta(t, 2.3, first, 0.3)
	assert.Less(t, last, first-0.4, "mean loss of steps 1-5 %v, of 26-30 %v", first, last)
	for _, s := range steps {
		assert.Equal(t, 64, s.Size)
	}

	// resume is bit-exact: 15 steps, then resumed to 30, write the checkpoint 30 steps wrote
	half := filepath.Join(out, "half.safetensors")
	for _, args := range [][]string{{"--max-steps", "15"}, {"--max-steps", "30", "--resume", half}} {
		cmd := exec.Command(bin, append([]string{"--data", mnist, "--test", "", "--quiet", "--checkpoint", half}, args...)...)
		cmd.Env = noToolsEnv(t)
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", b)
	}
	whole, err := os.ReadFile(filepath.Join(out, "m.safetensors"))
	require.NoError(t, err)
	resumed, err := os.ReadFile(half)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(whole, resumed), "the resumed run's checkpoint differs from the straight run's")
}

type logStep struct {
	Step *int64  `json:"step"`
	Loss float64 `json:"loss"`
	Size int     `json:"size"`
}

// stepLog reads a trainer's --log: its per-step lines (not the epochs').
func stepLog(t *testing.T, path string) []logStep {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var steps []logStep
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var s logStep
		require.NoError(t, json.Unmarshal(line, &s), "%s", line)
		if !bytes.Contains(line, []byte(`"train_loss"`)) {
			steps = append(steps, s)
		}
	}
	return steps
}
