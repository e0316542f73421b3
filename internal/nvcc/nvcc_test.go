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
