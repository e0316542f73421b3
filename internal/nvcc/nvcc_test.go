package nvcc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The toolchain CI installs compiles for every target and reports
// registers through ptxas.
func TestNVCCCompilesForEveryTarget(t *testing.T) {
	Require(t)
	out := filepath.Join(t.TempDir(), "saxpy.fatbin")
	args := append([]string{"-fatbin", "-Xptxas", "-v", "-o", out}, GencodeArgs()...)
	report, err := Run(append(args, "testdata/saxpy.cu")...)
	require.NoError(t, err)
	for _, sm := range Targets {
		assert.Contains(t, string(report), "for '"+sm+"'", "ptxas reports on %s", sm)
	}
	assert.True(t, strings.Contains(string(report), "registers"), string(report))
	st, err := os.Stat(out)
	require.NoError(t, err)
	assert.Greater(t, st.Size(), int64(0))
}

func TestGencodeArgs(t *testing.T) {
	assert.Equal(t, []string{"-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"}, GencodeArgs())
}

// Compile keeps nvcc's report and output by nvcc's version, the flags and
// the source: the same compile again is served from the cache (here a
// marked entry proves it), another source or flag is compiled, and "off"
// compiles every time.
func TestCompileCache(t *testing.T) {
	Require(t)
	cache := t.TempDir()
	t.Setenv(CacheEnv, cache)
	src, err := os.ReadFile("testdata/saxpy.cu")
	require.NoError(t, err)
	args := []string{"-cubin", "-arch=sm_80", "-Xptxas", "-v"}
	report, cubin, err := Compile(src, "saxpy.cu", args, "saxpy.cubin")
	require.NoError(t, err)
	assert.Contains(t, string(report), "registers")
	assert.NotEmpty(t, cubin)
	entries, err := filepath.Glob(filepath.Join(cache, "*.out"))
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.NoError(t, os.WriteFile(entries[0], []byte("cached"), 0o644))

	_, again, err := Compile(src, "saxpy.cu", args, "saxpy.cubin")
	require.NoError(t, err)
	assert.Equal(t, "cached", string(again), "served from the cache")
	_, other, err := Compile(src, "saxpy.cu", []string{"-cubin", "-arch=sm_90", "-Xptxas", "-v"}, "saxpy.cubin")
	require.NoError(t, err)
	assert.NotEqual(t, "cached", string(other), "another flag is another key")
	_, other, err = Compile(append(src, '\n'), "saxpy.cu", args, "saxpy.cubin")
	require.NoError(t, err)
	assert.NotEqual(t, "cached", string(other), "another source is another key")
	t.Setenv(CacheEnv, "off")
	_, fresh, err := Compile(src, "saxpy.cu", args, "saxpy.cubin")
	require.NoError(t, err)
	assert.NotEqual(t, "cached", string(fresh), "off: compiled again")
	assert.NotEmpty(t, fresh)

	_, _, err = Compile([]byte("__global__ void k() { this is not C++ }\n"), "bad.cu", args, "bad.cubin")
	require.Error(t, err)
	t.Setenv(CacheEnv, cache)
	_, _, err = Compile([]byte("__global__ void k() { this is not C++ }\n"), "bad.cu", args, "bad.cubin")
	require.Error(t, err)
	entries, err = filepath.Glob(filepath.Join(cache, "*.out"))
	require.NoError(t, err)
	assert.Len(t, entries, 3, "failures are not kept")
}
