package cpu_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/native"
)

// The accumulating variants a micro-batch loop's steps use on the CPU target add their share to
// what their outputs hold (kernelcases.AccumulatingNodes: conv block, linear block and direct
// conv weight gradients, the direct conv's bias gradient, the plain and the smoothed loss) —
// each checked on every instruction set against "initial contents + reference"
// (kernelcases.CheckAccumulates, whose tolerance says why), as codegen's TestAccumulatingKernels
// checks CUDA's.
func TestAccumulatingKernels(t *testing.T) {
	const batch = 3
	nodes := kernelcases.AccumulatingNodes(t)
	acc := map[*ir.Node]bool{}
	for _, n := range nodes {
		acc[n] = true // as in a micro-batch loop's steps
	}
	prog, err := cpu.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Accumulate: acc})
	require.NoError(t, err)
	for _, isa := range isas(t) {
		dev := openDevice(t, prog, native.Options{ISA: isa})
		rng := rand.New(rand.NewPCG(12, 13))
		for _, n := range nodes {
			kernelcases.CheckAccumulates(t, dev, prog, n, rng)
		}
	}
}
