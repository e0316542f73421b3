package main

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// packageFiles lists a package directory's files.
func packageFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// cnnc gen's --target picks the package's kernels as cnnc build's does: the CPU target's by
// default (built into the program by cgo and run by runtime/native), the CUDA C on the emulator
// with --target emu. Writing a package of one target over another's removes the files only the
// other target has (go build would compile both kernel libraries), and nothing cnnc did not write.
// (The CPU target's package trains in examples/gogenerate; --cuda's in TestGenCUDAPackage.)
func TestGenTargets(t *testing.T) {
	model, err := filepath.Abs("../../examples/mnist.cnn")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "mnistnet")
	cpuFiles := []string{"cnnc_cpu.h", "kernels_cpu.go", "kernels_cpu.h", "kernels_cpu_avx2.cc", "kernels_cpu_sse2.cc", "kernels_cpu_table.cc", "model.go", "spec.go"}

	code, out, errOut := cnnc("gen", model, "-o", dir, "--batch", "8")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	assert.Contains(t, out, "target cpu")
	assert.Equal(t, cpuFiles, packageFiles(t, dir))
	src, err := os.ReadFile(filepath.Join(dir, "model.go"))
	require.NoError(t, err)
	assert.Contains(t, string(src), `native.New(kernels, "kernels_cpu.h", native.Options{})`)
	assert.Contains(t, string(src), "on the CPU (kernels generated for the CPU, compiled into the program)")
	assert.NotContains(t, string(src), "runtime/cpu")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mine.go"), []byte("package mnistnet\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cuda.go"), []byte("package mnistnet // the user's, not cnnc's\n"), 0o644))

	code, out, errOut = cnnc("gen", model, "-o", dir, "--batch", "8", "--target", "emu")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	assert.Contains(t, out, "target emu")
	assert.Equal(t, []string{"cuda.go", "cuda_emu.h", "kernels.cu", "kernels_cpu.cc", "kernels_cpu.go", "mine.go", "model.go", "spec.go"}, packageFiles(t, dir),
		"the CPU target's files are gone; the user's files stay")
	src, err = os.ReadFile(filepath.Join(dir, "model.go"))
	require.NoError(t, err)
	assert.Contains(t, string(src), `cpu.New(kernels, "kernels.cu", cpu.Options{})`)
	assert.Contains(t, string(src), "the CUDA C kernels through cnnc's emulator")

	require.NoError(t, os.Remove(filepath.Join(dir, "cuda.go")))
	code, out, errOut = cnnc("gen", model, "-o", dir, "--batch", "8", "--target", "cpu")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	assert.Equal(t, []string{"cnnc_cpu.h", "kernels_cpu.go", "kernels_cpu.h", "kernels_cpu_avx2.cc", "kernels_cpu_sse2.cc", "kernels_cpu_table.cc", "mine.go", "model.go", "spec.go"},
		packageFiles(t, dir), "the emulator's files are gone")
}

// --target takes cnnc build's values; --cuda is --target cuda and contradicts another target;
// a model with the layers the CPU target once refused (dilated and depthwise convs, label
// smoothing) gets the CPU target's package, with no warning. (The refusal path itself, which no
// DSL model reaches now, is TestCPURefusal's: cpuRefusal on a planted optimizer.)
func TestGenTargetErrors(t *testing.T) {
	dir := t.TempDir()
	model, err := filepath.Abs("../../examples/mnist.cnn")
	require.NoError(t, err)
	code, _, errOut := cnnc("gen", model, "-o", filepath.Join(dir, "a"), "--target", "tpu")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "cnnc gen: --target tpu: want cpu, cuda, emu or auto")
	code, _, errOut = cnnc("gen", model, "-o", filepath.Join(dir, "a"), "--target", "cpu", "--cuda")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "cnnc gen: --cuda is --target cuda, not --target cpu")

	path := filepath.Join(dir, "dilated.cnn")
	src := strings.Replace(dilatedModel, "f32[2,8,8]", "f32[3,8,8]", 1)
	require.NoError(t, os.WriteFile(path, []byte(src), 0o600))
	code, out, errOut := cnnc("gen", path, "-o", filepath.Join(dir, "b"), "--target", "cpu")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	assert.NotContains(t, errOut, "warning")
	assert.Contains(t, out, "target cpu")
	assert.Contains(t, strings.Join(packageFiles(t, filepath.Join(dir, "b")), " "), "kernels_cpu.go")
}
