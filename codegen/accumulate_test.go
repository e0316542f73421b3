package codegen_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// The accumulating variants micro-batch loops use add their share to what
// their outputs hold: weight gradients (conv blocks, linear blocks, direct
// convs), a direct conv's bias gradient, and the loss and correct count
// (plain and label-smoothed): kernelcases.AccumulatingNodes, each checked
// against "initial contents + reference" (kernelcases.CheckAccumulates).
func TestAccumulatingKernels(t *testing.T) {
	const batch = 3
	nodes := kernelcases.AccumulatingNodes(t)
	acc := map[*ir.Node]bool{}
	for _, n := range nodes {
		acc[n] = true // as in a micro-batch loop's steps
	}
	prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch, Accumulate: acc})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "acc.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	rng := rand.New(rand.NewPCG(12, 13))
	for _, n := range nodes {
		kernelcases.CheckAccumulates(t, dev, prog, n, rng)
	}
}
