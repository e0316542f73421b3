package codegen

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/cpu"
)

// The zero fill that clears micro-batch accumulators writes every word of
// odd-sized buffers (an out-of-bounds write fails under make test-asan).
func TestZeroFillClearsEveryWord(t *testing.T) {
	g := ir.NewGraph("T")
	vals := []*ir.Value{
		g.NewValue("w", ir.F32Fixed(37, 3), ir.RoleGrad, dsl.Pos{}),
		g.NewValue("b", ir.F32Fixed(1), ir.RoleGrad, dsl.Pos{}),
		g.NewValue("big", ir.F32Fixed(70001), ir.RoleGrad, dsl.Pos{}),
	}
	n := g.NewNode(ir.OpReLU, "r", ir.Forward, dsl.Pos{}, []*ir.Value{g.NewValue("x", ir.F32Batched(5), ir.RoleActivation, dsl.Pos{})}, []string{"y"}, ir.RoleActivation)
	n.Out().Type = ir.F32Batched(5)
	p, err := generate("T", []genItem{{node: n, batch: 2, zero: vals}}, Options{Batch: 2})
	require.NoError(t, err)
	dev, err := cpu.New(p.Source, "zero.cu", cpu.Options{})
	require.NoError(t, err)
	defer dev.Close()
	filled := 0
	for _, l := range p.Launches {
		if l.Node != n || len(l.Args) != 1 {
			continue
		}
		filled++
		v := l.Args[0].Value
		size := v.Type.Bytes(2)
		ptr, err := dev.Alloc(size)
		require.NoError(t, err)
		junk := make([]byte, size)
		for i := range junk {
			junk[i] = byte(i*7 + 1)
		}
		require.NoError(t, dev.CopyIn(ptr, junk))
		require.NoError(t, dev.Launch(l.Kernel, l.Grid, l.Block, l.SharedBytes, []uint64{uint64(ptr)}))
		out := make([]byte, size)
		require.NoError(t, dev.CopyOut(out, ptr))
		require.Equal(t, make([]byte, size), out, v.Name)
		require.NoError(t, dev.Free(ptr))
	}
	require.Equal(t, len(vals), filled, "one fill per accumulator")
}
