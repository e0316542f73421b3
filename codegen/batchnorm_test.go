package codegen_test

import (
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/ops"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
)

// A padded last batch through batch norm: the statistics are the valid
// samples' (and so the running statistics' update), the gradient sums over
// them and gives the padding zero — what PyTorch computes on the smaller
// batch.
func TestBatchNormPartialBatch(t *testing.T) {
	const batch, valid = 5, 3
	for _, call := range []string{"batchnorm2d(x)", "batchnorm1d(x, affine=false)"} {
		d := ops.ByDSLName(call[:len("batchnorm2d")])
		res, err := compiler.CompileSource("t.cnn", []byte(ops.ExampleModel(d, call)), compiler.Options{})
		require.NoError(t, err)
		var nodes []*ir.Node
		for _, n := range res.Graph.Nodes {
			if n.Op == ops.BatchNormStats || n.Op == ops.BatchNormGrad {
				nodes = append(nodes, n)
			}
		}
		require.Len(t, nodes, 2)
		prog, err := codegen.GenerateNodes("T", nodes, codegen.Options{Batch: batch})
		require.NoError(t, err)
		dev, err := cpu.New(prog.Source, "t.cu", cpu.Options{})
		require.NoError(t, err)
		for _, n := range nodes {
			ins := kernelcheck.RandomInputs(n, batch, rand.New(rand.NewPCG(5, 6)))
			got := launchPartial(t, dev, prog, n, ins, batch, valid)
			// the reference on the valid samples only
			refIns := make([][]float64, len(ins))
			for i, v := range n.Ins {
				refIns[i] = append([]float64(nil), ins[i]...)
				if v.Type.Batched {
					refIns[i] = refIns[i][:valid*int(v.Type.SampleElems())]
				}
			}
			want, err := reference.RunNode(n, refIns, valid, reference.NodeOptions{Training: true, Update: true})
			require.NoError(t, err)
			for i, v := range n.Outs {
				scale := 1e-30
				for _, w := range want[i] {
					scale = math.Max(scale, math.Abs(w))
				}
				for j, w := range want[i] {
					assert.LessOrEqual(t, math.Abs(got.outs[i][j]-w)/scale, kernelcheck.Tolerance, "%s: %s[%d] %g vs %g", call, v.Name, j, got.outs[i][j], w)
				}
				for j := len(want[i]); j < len(got.outs[i]); j++ {
					assert.Zero(t, got.outs[i][j], "%s: %s[%d] is padding", call, v.Name, j)
				}
			}
			for _, k := range n.MutatedInputs() { // the running statistics, moved by the valid samples
				if n.Ins[k].Type.DType == ir.I64 {
					assert.Equal(t, refIns[k], got.ins[k], "%s: %s", call, n.Ins[k].Name)
					continue
				}
				for j, w := range refIns[k] {
					assert.InDelta(t, w, got.ins[k][j], kernelcheck.Tolerance, "%s: %s[%d]", call, n.Ins[k].Name, j)
				}
			}
		}
		dev.Close()
	}
}

type launched struct{ ins, outs [][]float64 }

// launchPartial runs n's launches on dev with valid real samples of batch
// and returns its outputs and its inputs after (written in place).
func launchPartial(t *testing.T, dev device.Device, prog *codegen.Program, n *ir.Node, ins [][]float64, batch, valid int64) launched {
	ptrs := map[*ir.Value]device.Ptr{}
	alloc := func(v *ir.Value, b []byte) {
		p, err := dev.Alloc(int64(len(b)))
		require.NoError(t, err)
		require.NoError(t, dev.CopyIn(p, b))
		ptrs[v] = p
	}
	for i, v := range n.Ins {
		alloc(v, kernelcheck.Encode(v.Type, ins[i], batch))
	}
	for _, v := range n.Outs {
		nan := make([]float64, v.Type.Elems(batch))
		for i := range nan {
			nan[i] = math.NaN()
		}
		alloc(v, kernelcheck.Encode(v.Type, nan, batch))
	}
	block, err := kernelcheck.ScalarBlock(dev, kernelcheck.Scalars{Valid: valid}, batch)
	require.NoError(t, err)
	defer dev.Free(block)
	for _, l := range prog.Launches {
		if l.Node != n {
			continue
		}
		var params []uint64
		for _, a := range l.Args {
			switch a.Kind {
			case kernelarg.Buffer:
				params = append(params, uint64(ptrs[a.Value]))
			case kernelarg.Scalars:
				params = append(params, uint64(block))
			default:
				params = append(params, uint64(a.Int))
			}
		}
		require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, params))
	}
	require.NoError(t, dev.Sync())
	read := func(v *ir.Value) []float64 {
		b := make([]byte, v.Type.Bytes(batch))
		require.NoError(t, dev.CopyOut(b, ptrs[v]))
		return kernelcheck.Decode(v.Type, b, batch)
	}
	var r launched
	for _, v := range n.Ins {
		r.ins = append(r.ins, read(v))
	}
	for _, v := range n.Outs {
		r.outs = append(r.outs, read(v))
	}
	for _, p := range ptrs {
		dev.Free(p)
	}
	return r
}

// Whole training steps of a model with batch norm (maps and features,
// affine or not, a conv without bias before it, the fused blocks around
// it) on the CPU emulator against the reference: loss, parameters,
// optimizer state and running statistics after each step.
func TestBatchNormSteps(t *testing.T) {
	src, err := os.ReadFile("../compiler/plan/testdata/bn.cnn")
	require.NoError(t, err)
	checkSteps(t, "bn.cnn", src, 6, 3, 3)
}
