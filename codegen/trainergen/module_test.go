package trainergen_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/version"
)

// noToolsEnv is an environment with no compiler: PATH names one empty
// folder, CC and CXX are unset, and HOME and the cache folders are
// read-only, so nothing can be compiled or cached at run time.
func noToolsEnv(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	empty, home := filepath.Join(dir, "bin"), filepath.Join(dir, "home")
	require.NoError(t, os.Mkdir(empty, 0o755))
	require.NoError(t, os.Mkdir(home, 0o555))
	t.Cleanup(func() { os.Chmod(home, 0o755) })
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "PATH", "CC", "CXX", "HOME", "XDG_CACHE_HOME", "TMPDIR", "GOCACHE":
		default:
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+empty, "HOME="+home, "XDG_CACHE_HOME="+home, "TMPDIR="+home)
}

// A CPU trainer is standalone: its kernels are compiled when it is built,
// into the binary, so it trains on a machine without a C++ compiler and
// with nowhere to cache one's output.
func TestCPUTrainerIsStandalone(t *testing.T) {
	if testing.Short() {
		t.Skip("a go build of a trainer module")
	}
	root := moduleRoot(t)
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	c := compileExample(t, filepath.Join(root, "examples/mnist.cnn"), 16)
	dir := t.TempDir()
	require.NoError(t, trainergen.WriteModule(dir, c.Spec, c.Kernels))
	for _, f := range []string{"kernels_cpu.cc", "kernels_cpu.go", "cuda_emu.h"} {
		assert.FileExists(t, filepath.Join(dir, f))
	}
	bin := filepath.Join(dir, "mnist-trainer")
	var logged []string
	require.NoError(t, trainergen.GoBuild(dir, bin, nil, func(s string) { logged = append(logged, s) }))
	assert.Contains(t, strings.Join(logged, "\n"), "runtime/version.stampedVersion=", "the trainer is stamped with cnnc's version")

	out := filepath.Join(t.TempDir(), "out") // the one writable place
	require.NoError(t, os.Mkdir(out, 0o755))
	cmd := exec.Command(bin, "--data", mnist, "--test", "", "--max-steps", "3", "--quiet",
		"--checkpoint", filepath.Join(out, "m.safetensors"))
	cmd.Env = noToolsEnv(t)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Run(), log.String())
	assert.Contains(t, log.String(), "on cpu (CUDA emulator, kernels built in)")
	assert.FileExists(t, filepath.Join(out, "m.safetensors"))
}

func TestPackageFilesRefusesBadPackageNames(t *testing.T) {
	spec := &trainer.Spec{Model: "M", Source: "m.cnn"}
	for _, pkg := range []string{"", "_", "func", "a-b", "a\nb", "9x", "a b"} {
		_, err := trainergen.PackageFiles(pkg, spec, []byte("extern \"C\" __global__ void k() {}\n"), nil)
		assert.ErrorContains(t, err, "is not a Go package name", "%q", pkg)
	}
}

// go builds trainers stamped with cnnc's version, and the output path,
// whatever it holds, is one argument of go's (no shell runs).
func TestBuildArgs(t *testing.T) {
	out := "/tmp/a b;$(touch x)\n-o"
	args := trainergen.BuildArgs(out, []string{"cuda"})
	assert.Equal(t, []string{"build", "-trimpath", "-ldflags=-s -w " + version.LDFlags(), "-o", out, "-tags", "cuda", "."}, args)
	assert.Contains(t, version.LDFlags(), "-X github.com/cnnc/cnnc/runtime/version.stampedVersion=")
}

// Without a C++ compiler the build stops saying what it needs.
func TestGoBuildNamesAMissingCompiler(t *testing.T) {
	if testing.Short() {
		t.Skip("go mod tidy of a trainer module")
	}
	c := compileExample(t, filepath.Join(moduleRoot(t), "examples/mnist.cnn"), 2)
	dir := t.TempDir()
	require.NoError(t, trainergen.WriteModule(dir, c.Spec, c.Kernels))
	t.Setenv("CXX", "cnnc-no-such-compiler")
	err := trainergen.GoBuild(dir, filepath.Join(dir, "t"), nil, func(string) {})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "building a trainer needs a C++ compiler (it compiles the CPU kernels into the binary): cnnc-no-such-compiler (go env CXX) not found")
	assert.NoFileExists(t, filepath.Join(dir, "t"))
}
