package codegen_test

import (
	"github.com/cnnc/cnnc/driver"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// gemmShaped reports whether a kernel family is a GEMM: the linear blocks'
// main kernels and the conv blocks' implicit GEMMs (not the split-K
// reductions, updates, pools, losses, nor the classifier tail,
// linear_cross_entropy, whose few products run on FP32 FFMA by design:
// see templates/linear_ce.cu.tmpl).
func gemmShaped(family string) bool {
	switch strings.TrimSuffix(family, "_tc") {
	case "linear_gemm", "conv_block_fwd", "conv_block_dgrad", "conv_block_wgrad", "conv_block_wgrad_halo":
		return true
	}
	return false
}

// compilePrecision compiles an example's plan with its kernels at prec.
func compilePrecision(t *testing.T, file string, batch int64, prec codegen.Precision) *trainergen.Compiled {
	t.Helper()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	res, err := compiler.CompileSource(file, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	res.Train.Precision = string(prec)
	comp, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	return comp
}

// Built for TF32 or BF16, every GEMM-shaped kernel of the examples runs on
// tensor cores: its SASS (cuobjdump) holds HMMA instructions of that
// precision, for every target, without spills. Built for FP32 none does
// (the check tells them apart).
func TestTensorCoreKernelsUseHMMA(t *testing.T) {
	nvcc.Require(t)
	for _, c := range []struct {
		file  string
		batch int64
	}{{"../examples/simplecnn.cnn", 32}, {"../examples/mnist.cnn", 64}} {
		for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32, codegen.BF16} {
			comp := compilePrecision(t, c.file, c.batch, prec)
			for _, arch := range nvcc.Targets {
				res, err := perf.Resources(comp.Train.Source, arch)
				require.NoError(t, err)
				gemms := 0
				for _, k := range comp.Train.Kernels {
					r, ok := res[k.Name]
					require.True(t, ok, "%s: no ptxas report", k.Name)
					if !gemmShaped(k.Family) {
						continue
					}
					gemms++
					if prec == codegen.FP32 {
						assert.Zero(t, r.HMMA, "%s %s: FP32 kernels run on FFMA", arch, k.Name)
						continue
					}
					assert.Positive(t, r.HMMA, "%s %s built for %s has no HMMA", arch, k.Name, prec)
					assert.Equal(t, string(prec), r.TensorKind, "%s %s", arch, k.Name)
					assert.False(t, r.Spills, "%s %s spills", arch, k.Name)
				}
				assert.GreaterOrEqual(t, gemms, 6, "%s: the examples have conv and linear GEMMs", c.file)
			}
		}
	}
}
