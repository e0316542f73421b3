package codegen_test

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/internal/nvcc"
)

func TestParsePtxas(t *testing.T) {
	report := `ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_80'
ptxas info    : Function properties for gemm
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, 4096 bytes smem, 400 bytes cmem[0]
ptxas info    : Function properties for helper
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'spiller' for 'sm_90'
ptxas info    : Function properties for spiller
    40 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'old' for 'sm_70'
ptxas info    : Used 20 registers, 8+0 bytes lmem, 16+16 bytes smem, 344 bytes cmem[0]
`
	ks, err := codegen.ParsePtxas(strings.NewReader(report))
	require.NoError(t, err)
	require.Equal(t, []codegen.PtxasKernel{
		{Name: "gemm", Arch: "sm_80", Registers: 64, SharedBytes: 4096, ConstBytes: 400},
		{Name: "spiller", Arch: "sm_90", Registers: 255, ConstBytes: 380, StackFrame: 40, SpillStores: 8, SpillLoads: 12},
		{Name: "old", Arch: "sm_70", Registers: 20, SharedBytes: 32, ConstBytes: 344, LocalBytes: 8},
	}, ks)
	assert.True(t, ks[0].Clean())
	assert.False(t, ks[1].Clean())
	assert.False(t, ks[2].Clean())
	_, err = codegen.ParsePtxas(strings.NewReader("ptxas info    : Used 3 registers\n"))
	assert.Error(t, err)
}

// requireClean fails on any kernel that spills or has a stack frame, and
// on a kernel of the program missing from the report.
func requireClean(t *testing.T, prog *codegen.Program, ks []codegen.PtxasKernel) {
	t.Helper()
	var table bytes.Buffer
	codegen.WritePtxasReport(&table, prog, ks)
	t.Log("\n" + table.String())
	seen := map[string]int{}
	for _, k := range ks {
		seen[k.Name]++
		assert.True(t, k.Clean(), "%s spills or uses a local-memory stack frame", k)
	}
	for _, name := range prog.KernelNames() {
		assert.Equal(t, len(nvcc.Targets), seen[name], "ptxas reports on %s for every target", name)
	}
	for _, err := range codegen.CheckLaunchResources(prog.Launches, ks) {
		t.Errorf("a launch would not start: %v", err)
	}
}

// CheckLaunchResources finds launches whose blocks need more registers or
// shared memory than an architecture has.
func TestCheckLaunchResources(t *testing.T) {
	launches := []*codegen.Launch{
		{Kernel: "k", Block: [3]uint32{256, 1, 1}, SharedBytes: 100 << 10},
		{Kernel: "big", Block: [3]uint32{1024, 1, 1}},
	}
	ks := []codegen.PtxasKernel{
		{Name: "k", Arch: "sm_80", Registers: 255, SharedBytes: 64 << 10}, // 256 x 256 registers fit exactly
		{Name: "k", Arch: "sm_90", Registers: 250, SharedBytes: 64 << 10},
		{Name: "big", Arch: "sm_90", Registers: 64},
		{Name: "big", Arch: "sm_80", Registers: 65}, // allocated as 72
	}
	var msgs []string
	for _, err := range codegen.CheckLaunchResources(launches, ks) {
		msgs = append(msgs, err.Error())
	}
	assert.Equal(t, []string{
		"k on sm_80: 65536 bytes of static and 102400 of dynamic shared memory exceed the block's 166912",
		"big on sm_80: 1024 threads x 65 registers need 73728 of the block's 65536",
	}, msgs)
}

// Every variant of this package's kernel families compiles for every
// target without spills or local memory.
func TestPtxasLinearLossUpdateDropout(t *testing.T) {
	nvcc.Require(t)
	g := ir.NewGraph("T")
	var nodes []*ir.Node
	for v := 0; v < 8; v++ {
		l := kernelcases.NewLinear(g, "fc"+string(rune('a'+v)), 28800, 128, v&1 != 0, v&2 != 0)
		l.Masked, l.XMask = v&4 != 0 && v&2 != 0, v&4 != 0
		nodes = append(nodes, l.Forward(t), l.GradInput(t))
		if v < len(testOptimizers) {
			nodes = append(nodes, l.GradWeight(t, testOptimizers[v]))
		} else {
			nodes = append(nodes, l.GradWeight(t, nil))
		}
	}
	small := kernelcases.NewLinear(g, "small", 300, 10, true, true)
	nodes = append(nodes, small.Forward(t), small.GradInput(t))
	for _, c := range lossUpdateDropoutCases(t, g, 1) {
		nodes = append(nodes, c.n)
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32})
	require.NoError(t, err)
	ks, err := codegen.CompilePtxas(prog.Source, "kernels.cu", nvcc.Targets)
	require.NoError(t, err)
	requireClean(t, prog, ks)
}

// The linear blocks with each activation other than ReLU folded in
// (kernelcases.LinearActChecks: f in the forward epilogue, z saved, f' as
// the gradients load dy), in FP32 and on tensor cores, compile for every
// target without spills or local memory, at the examples' batch 32.
func TestPtxasLinearAct(t *testing.T) {
	nvcc.Require(t)
	var nodes []*ir.Node
	for _, c := range kernelcases.LinearActChecks(t) {
		nodes = append(nodes, c.N)
	}
	for _, prec := range []codegen.Precision{codegen.FP32, codegen.TF32, codegen.BF16} {
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: 32, Precision: prec, SMs: testSMs(prec)})
		require.NoError(t, err)
		ks, err := codegen.CompilePtxas(prog.Source, "linact.cu", nvcc.Targets)
		require.NoError(t, err)
		requireClean(t, prog, ks)
	}
}

// exampleProgram compiles an example at a batch size and generates its
// program; it skips the test (loudly) only while kernels of the conv and
// pool families, written separately, do not exist yet.
func exampleProgram(t *testing.T, path string, batch int64) (*compiler.Result, *codegen.Program) {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := compiler.CompileSource(path, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	prog, err := codegen.Generate(res.Graph, codegen.Options{Batch: batch, SourceName: strings.TrimPrefix(path, "../")})
	var missing *codegen.NoRuleError
	if errors.As(err, &missing) && convPoolOps[missing.Op] {
		msg := "!!! SKIPPING " + t.Name() + ": " + err.Error() + " — the conv/pool kernel families do not exist yet"
		os.Stderr.WriteString(msg + "\n")
		t.Skip(msg)
	}
	require.NoError(t, err)
	return res, prog
}

// convPoolOps are the ops of the conv and pool kernel families.
var convPoolOps = map[ir.Op]bool{
	ir.OpConvBlock: true, ir.OpConvBlockGradInput: true, ir.OpConvBlockGradWeight: true,
	ir.OpConv2D: true, ir.OpMaxPool2D: true, ir.OpAvgPool2D: true, ir.OpMaxPool2DGrad: true, ir.OpAvgPool2DGrad: true,
}

var examples = []string{"../examples/simplecnn.cnn", "../examples/mnist.cnn"}

// The examples' whole generated .cu compiles for sm_80 and sm_90 with no
// spill and no local-memory stack frame in any kernel.
func TestPtxasExamples(t *testing.T) {
	nvcc.Require(t)
	for _, path := range examples {
		t.Run(strings.TrimSuffix(strings.TrimPrefix(path, "../examples/"), ".cnn"), func(t *testing.T) {
			// batch 32, the train block's own batch (MNIST's 64 once spilled
			// on sm_80), and 256
			src, err := os.ReadFile(path)
			require.NoError(t, err)
			res, err := compiler.CompileSource(path, src, compiler.Options{})
			require.NoError(t, err)
			for _, batch := range slices.Compact([]int64{32, res.Train.Batch, 256}) {
				_, prog := exampleProgram(t, path, batch)
				ks, err := codegen.CompilePtxas(prog.Source, path, nvcc.Targets)
				require.NoError(t, err)
				requireClean(t, prog, ks)
			}
		})
	}
}
