package fakecuda_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
)

func TestImageKey(t *testing.T) {
	// a fatbin is hashed as far as its header says, PTX up to its NUL
	fat := make([]byte, 16+5)
	binary.LittleEndian.PutUint32(fat, 0xBA55ED50)
	binary.LittleEndian.PutUint16(fat[4:], 1)
	binary.LittleEndian.PutUint16(fat[6:], 16)
	binary.LittleEndian.PutUint64(fat[8:], 5)
	copy(fat[16:], "abcde")
	k1, err := fakecuda.ImageKey(fat)
	require.NoError(t, err)
	k2, err := fakecuda.ImageKey(append(append([]byte{}, fat...), "padding"...))
	require.NoError(t, err)
	assert.Equal(t, k1, k2)
	assert.Len(t, k1, 16)
	fat[20] = 'x'
	k3, err := fakecuda.ImageKey(fat)
	require.NoError(t, err)
	assert.NotEqual(t, k1, k3)

	p1, err := fakecuda.ImageKey([]byte(".version 8.0\x00junk"))
	require.NoError(t, err)
	p2, err := fakecuda.ImageKey([]byte(".version 8.0"))
	require.NoError(t, err)
	assert.Equal(t, p1, p2)

	_, err = fakecuda.ImageKey([]byte("\x7fELF...."))
	assert.ErrorContains(t, err, "cubin")
	binary.LittleEndian.PutUint64(fat[8:], 500)
	_, err = fakecuda.ImageKey(fat)
	assert.ErrorContains(t, err, "header says")
}

func TestEnviron(t *testing.T) {
	env := fakecuda.Environ("/f", []string{"A=1", "LD_LIBRARY_PATH=/x:/y", "CNNC_FAKECUDA=/old"})
	assert.Equal(t, []string{"A=1", "CNNC_FAKECUDA=/f", "LD_LIBRARY_PATH=/f:/x:/y"}, env)
	env = fakecuda.Environ("/f", []string{"A=1"})
	assert.Equal(t, []string{"A=1", "CNNC_FAKECUDA=/f", "LD_LIBRARY_PATH=/f"}, env)
}

// HeadersEnv names an include directory of other CUDA headers (make
// test-cuda-headers sets it to the newest Debian ships) that -tags cuda
// binaries are also built with.
const headersEnv = "CNNC_CUDA_HEADERS"

// The fake defines every driver symbol a -tags cuda binary binds (cu binds
// far more than cnnc calls; those are stubs that fail loudly), so such a
// binary loads under it whatever the loader's binding mode — built with the
// installed CUDA headers, and with $CNNC_CUDA_HEADERS when set (newer
// headers bind some of cu's calls under _v2 names).
func TestDefinesEveryDriverSymbol(t *testing.T) {
	nvcc.Require(t) // the toolkit brings cuda.h and libcuda to link against
	if testing.Short() {
		t.Skip("links a -tags cuda test binary")
	}
	dir := t.TempDir()
	require.NoError(t, fakecuda.Build(dir))
	lib := filepath.Join(dir, fakecuda.LibName)
	out, err := exec.Command("readelf", "-d", lib).Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), "Library soname: ["+fakecuda.LibName+"]")
	have := map[string]bool{}
	for _, s := range symbols(t, lib, "--defined-only") {
		have[s] = true
	}

	headers := map[string]string{"installed": ""} // subtest name: CGO_CFLAGS include
	if inc := os.Getenv(headersEnv); inc != "" {
		headers[headersEnv] = inc
	}
	for name, inc := range headers {
		t.Run(name, func(t *testing.T) {
			bin := filepath.Join(dir, "cuda.test")
			cmd := exec.Command("go", "test", "-tags", "cuda", "-c", "-o", bin, "github.com/cnnc/cnnc/runtime/cuda")
			cmd.Env = append(os.Environ(), "GOWORK=off")
			if inc != "" {
				cmd.Env = append(cmd.Env, "CGO_CFLAGS=-I"+inc+" -O2 -g")
			}
			b, err := cmd.CombinedOutput()
			require.NoError(t, err, string(b))
			need := symbols(t, bin, "--undefined-only")
			var missing []string
			for _, s := range need {
				if strings.HasPrefix(s, "cu") && !have[s] {
					missing = append(missing, s)
				}
			}
			assert.Empty(t, missing, "add them to csrc/stubs.c (or emulate them in csrc/libcuda.c)")
			assert.Greater(t, len(need), 50)
			// runtime/cuda resolves its versioned calls at run time: the
			// binary binds the cuGetProcAddress its headers declare
			assert.True(t, slices.Contains(need, "cuGetProcAddress") || slices.Contains(need, "cuGetProcAddress_v2"), "%v", need)
		})
	}
}

func symbols(t *testing.T, file, which string) []string {
	out, err := exec.Command("nm", "-D", which, file).Output()
	require.NoError(t, err)
	var syms []string
	for _, line := range bytes.Split(out, []byte("\n")) {
		if f := strings.Fields(string(line)); len(f) > 0 {
			syms = append(syms, strings.SplitN(f[len(f)-1], "@", 2)[0])
		}
	}
	sort.Strings(syms)
	return syms
}
