package codegen_test

import (
	"fmt"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// A partial last batch is padded to the compiled batch: the loss kernel
// averages over the real rows only and gives the padding zero gradient, as
// PyTorch does with a smaller last batch (with label smoothing too).
func TestSoftmaxCrossEntropyPartialBatch(t *testing.T) {
	for _, eps := range []float64{0, 0.2} {
		t.Run(fmt.Sprint("label_smoothing=", eps), func(t *testing.T) { partialBatchCE(t, eps) })
	}
}

func partialBatchCE(t *testing.T, eps float64) {
	const batch, valid, classes = 5, 3, 7
	g := ir.NewGraph("T")
	logits := g.NewValue("logits", ir.F32Batched(classes), ir.RoleActivation, dsl.Pos{})
	label := g.NewValue("label", ir.Type{DType: ir.Class, Batched: true, Classes: classes}, ir.RoleLabel, dsl.Pos{})
	n := kernelcases.Typed(t, g, ir.OpSoftmaxCrossEntropy, "loss", ir.Attrs{Smoothing: eps}, []*ir.Value{logits, label}, "loss", "dlogits", "correct")
	prog, err := codegen.GenerateNodes("T", []*ir.Node{n}, codegen.Options{Batch: batch})
	require.NoError(t, err)
	dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()

	ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(3, 4)))
	ptr := func(b []byte) device.Ptr {
		p, err := dev.Alloc(int64(len(b)))
		require.NoError(t, err)
		require.NoError(t, dev.CopyIn(p, b))
		return p
	}
	nan := func(elems int) []byte {
		return kernelcheck.Encode(ir.F32Fixed(int64(elems)), func() []float64 {
			v := make([]float64, elems)
			for i := range v {
				v[i] = math.NaN()
			}
			return v
		}(), 1)
	}
	bufs := []device.Ptr{ptr(kernelcheck.Encode(logits.Type, ins[0], batch)), ptr(kernelcheck.Encode(label.Type, ins[1], batch)),
		ptr(nan(1)), ptr(nan(batch * classes)), ptr(nan(1))}
	l := prog.Launches[0]
	block, err := kernelcheck.ScalarBlock(dev, kernelcheck.Scalars{Valid: valid}, batch)
	require.NoError(t, err)
	var params []uint64
	for i, a := range l.Args {
		switch a.Kind {
		case kernelarg.Scalars:
			params = append(params, uint64(block))
		case kernelarg.Int:
			params = append(params, uint64(a.Int))
		default:
			params = append(params, uint64(bufs[i]))
		}
	}
	require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params))
	read := func(p device.Ptr, elems int) []float64 {
		b := make([]byte, 4*elems)
		require.NoError(t, dev.CopyOut(b, p))
		return kernelcheck.Decode(ir.F32Fixed(int64(elems)), b, 1)
	}
	want, err := reference.RunNode(n, [][]float64{ins[0][:valid*classes], ins[1][:valid]}, valid, reference.NodeOptions{})
	require.NoError(t, err)
	assert.InDelta(t, want[0][0], read(bufs[2], 1)[0], 1e-5)
	assert.Equal(t, want[2][0], read(bufs[4], 1)[0])
	d := read(bufs[3], batch*classes)
	for i, w := range want[1] {
		assert.InDelta(t, w, d[i], 1e-6, "dlogits[%d]", i)
	}
	for i := valid * classes; i < batch*classes; i++ {
		assert.Zero(t, d[i], "padding row element %d", i)
	}
}
