package codegen_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
)

// A data-parallel rank runs the loss node as one micro-batch of the global
// batch, adding to its unbatched outputs: each is zero-filled just before
// it — the classifier tail's weight and bias gradients as well as the loss
// and correct count (the tail once added its dW, dB to the last step's
// buffers, and the ranks trained apart from accumulate = N).
func TestDataParallelLossZeroesWhatItAdds(t *testing.T) {
	res, _ := exampleProgram(t, "../examples/simplecnn.cnn", 32)
	c, err := driver.Compile(res, plan.Config{Ranks: 2}, driver.CUDA)
	require.NoError(t, err)
	require.NotNil(t, c.Plan.DataParallel)
	loss := c.Plan.Graph.Loss.Def
	require.Equal(t, ops.LinearCrossEntropyOp, loss.Op, "SimpleCNN's fc2 and loss are the classifier tail at a rank's batch of 16")
	var unbatched []*ir.Value
	for _, v := range loss.Outs {
		if !v.Type.Batched {
			unbatched = append(unbatched, v)
		}
	}
	require.Len(t, unbatched, 4, "loss, correct, dW, dB")
	zeroed := map[*ir.Value]bool{}
	for _, l := range c.Train.Launches {
		if l.Node != loss {
			continue
		}
		if strings.HasPrefix(l.Kernel, "fill_zero_") {
			zeroed[l.Args[0].Value] = true
			continue
		}
		for _, v := range unbatched {
			require.True(t, zeroed[v], "%s is zeroed before %s adds to it", v.Name, l.Kernel)
		}
	}
}
