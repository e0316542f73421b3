package fakenccl_test

import (
	"encoding/binary"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/fakenccl"
)

func TestEnviron(t *testing.T) {
	assert.Equal(t, []string{"A=1", "LD_LIBRARY_PATH=/f:/x"}, fakenccl.Environ("/f", []string{"LD_LIBRARY_PATH=/x", "A=1"}))
	assert.Equal(t, []string{"A=1", "LD_LIBRARY_PATH=/f"}, fakenccl.Environ("/f", []string{"A=1"}))
}

// The fake defines NCCL's entry points under NCCL's soname, and nothing else of its own.
func TestBuildDefinesNCCLsFunctions(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, fakenccl.Build(dir))
	lib := filepath.Join(dir, fakenccl.LibName)
	out, err := exec.Command("readelf", "-d", lib).Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), "Library soname: [libnccl.so.2]")
	out, err = exec.Command("nm", "-D", "--defined-only", lib).Output()
	require.NoError(t, err)
	var defined []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[1] == "T" {
			defined = append(defined, f[2])
		}
	}
	assert.ElementsMatch(t, []string{"ncclAllReduce", "ncclBroadcast", "ncclCommAbort", "ncclCommCount", "ncclCommDestroy",
		"ncclCommGetAsyncError", "ncclCommInitRank", "ncclCommUserRank", "ncclGetErrorString", "ncclGetLastError",
		"ncclGetUniqueId", "ncclGetVersion", "ncclGroupEnd", "ncclGroupStart"}, defined)
}

func TestBfloat16Rounding(t *testing.T) {
	one := float32(1)
	ulp := float32(math.Ldexp(1, -7)) // of bfloat16 at 1
	for _, c := range []struct {
		in   float32
		want float32
	}{
		{one, one},
		{one + ulp/2, one},                      // a tie: to even (1's last bit is 0)
		{one + ulp + ulp/2, one + 2*ulp},        // a tie: to even, upwards
		{one + ulp/2 + ulp/1024, one + ulp},     // past the tie
		{-(one + ulp/4), -one},                  // sign kept
		{math.MaxFloat32, float32(math.Inf(1))}, // rounds up past the largest bfloat16
	} {
		assert.Equal(t, c.want, fakenccl.FromBfloat16(fakenccl.Bfloat16(c.in)), "%g", c.in)
	}
	nan := fakenccl.FromBfloat16(fakenccl.Bfloat16(float32(math.NaN())))
	assert.True(t, nan != nan, "NaN stays NaN")
}

func TestSumsInRankOrder(t *testing.T) {
	f32 := func(v ...float32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b
	}
	big, small := float32(1<<24), float32(1)
	in := [][]byte{f32(big, 1), f32(small, 2), f32(small, 3)}
	// (2^24 + 1) + 1 rounds twice to 2^24 (ties to even); 1 + 1 + 2^24 is exact
	assert.Equal(t, f32(big, 6), fakenccl.SumFloat32(in, false))
	assert.Equal(t, f32(big+2, 6), fakenccl.SumFloat32(in, true))

	b16 := func(v ...float32) []byte {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], fakenccl.Bfloat16(x))
		}
		return b
	}
	in = [][]byte{b16(256), b16(1), b16(1)} // bfloat16 has 8 significant bits: 256 + 1 is a tie
	assert.Equal(t, b16(256), fakenccl.SumBfloat16(in, false))
	assert.Equal(t, b16(258), fakenccl.SumBfloat16(in, true))
}
