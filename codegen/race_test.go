package codegen_test

import (
	"fmt"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"hash/maphash"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/emu"
)

// The emulator runs a block's threads one after another, so a kernel that
// reads what another thread wrote without a barrier in between can be right
// by luck in its default order. Race mode (emu.Module.SetSchedule) runs the
// threads of every barrier interval in reverse and in seeded random orders
// (and the grid's blocks in reverse and in seeded permutations), with
// shared memory poisoned at every block: every kernel family of the
// examples — their planned training steps, in-place aliasing and
// micro-batch loops included — must give the same bits in every order,
// launch by launch. (runtime/emu's race tests show that a kernel missing a
// barrier does not.)
func TestKernelsAreRaceFree(t *testing.T) {
	simple, err := os.ReadFile("../examples/simplecnn.cnn")
	require.NoError(t, err)
	mnist, err := os.ReadFile("../examples/mnist.cnn")
	require.NoError(t, err)
	lenet, err := os.ReadFile("../examples/lenet5.cnn")
	require.NoError(t, err)
	// pools after activations whose gradients read z: the pool epilogues
	// write z at the argmax (the second one's windows overlap)
	actPool := []byte(`model ActPool(image: f32[1,13,11], label: class[10]) {
    c1 = conv2d(image, out=6, kernel=3, padding=1)
    p1 = maxpool(gelu(c1), kernel=2)
    c2 = conv2d(p1, out=10, kernel=3, padding=1)
    p2 = maxpool(silu(c2), kernel=3, stride=2, padding=1)
    o  = linear(flatten(p2), out=10)
    loss = cross_entropy(o, label)
}
train { optimizer = sgd(lr=0.05, momentum=0.9) }
`)
	for _, c := range []struct {
		name  string
		src   []byte
		batch int64
		cfg   plan.Config
		prec  codegen.Precision
		sms   int64 // the GPU's SMs the geometry is sized for (0: none named)
	}{
		{"simplecnn.cnn", simple, 2, plan.Config{}, codegen.FP32, 0},
		{"mnist.cnn", mnist, 3, plan.Config{}, codegen.FP32, 0},
		// a micro-batched trunk: accumulating weight gradients, the loss's
		// accumulating variant, zero fills, sliced operands
		{"mnist.cnn", mnist, 5, plan.Config{MicroBatch: 2, Trunk: "conv2"}, codegen.FP32, 0},
		// the tensor-core kernels (whose fragment layouts the race orders
		// also permute; the staged-region weight gradients of f32 and u8
		// inputs among them)
		{"mnist.cnn", mnist, 3, plan.Config{}, codegen.TF32, 0},
		{"mnist.cnn", mnist, 3, plan.Config{}, codegen.BF16, 0},
		// convs without a fused pool (tanh between): the tensor-core forward
		// over output regions, its halo staged by cp.async
		{"lenet5.cnn", lenet, 3, plan.Config{}, codegen.TF32, 0},
		{"actpool.cnn", actPool, 3, plan.Config{}, codegen.FP32, 0},
		{"actpool.cnn", actPool, 3, plan.Config{}, codegen.TF32, 0},
		// the geometry of a GPU named, one SM (so that batch 2 fills it):
		// the 16-row input-gradient tiles as 2 warps of 4 fragments
		{"simplecnn.cnn", simple, 2, plan.Config{}, codegen.TF32, 1},
	} {
		name := fmt.Sprintf("%s_b%d_mb%d_%s", c.name, c.batch, c.cfg.MicroBatch, c.prec)
		if c.sms > 0 {
			name += fmt.Sprintf("_sm%d", c.sms)
		}
		t.Run(name, func(t *testing.T) {
			checkRaceFree(t, c.name, c.src, c.batch, c.cfg, c.prec, c.sms)
		})
	}
}

// raceSchedules are the orders compared with the forward one.
var raceSchedules = []emu.Schedule{{Order: emu.OrderReverse}, {Order: emu.OrderShuffle, Seed: 1}, {Order: emu.OrderShuffle, Seed: 77}}

func checkRaceFree(t *testing.T, name string, src []byte, batch int64, cfg plan.Config, prec codegen.Precision, sms int64) {
	res, err := compiler.CompileSource(name, src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	res.Train.Precision, res.Train.SMs = string(prec), sms
	comp, err := driver.Compile(res, cfg, driver.CUDA)
	require.NoError(t, err)
	spec := comp.Spec
	mod, err := emu.Compile(comp.Train.Source, "race.cu", emu.Options{})
	require.NoError(t, err)
	defer mod.Close()
	arena, err := emu.Alloc(int(spec.ArenaBytes))
	require.NoError(t, err)
	defer emu.Free(arena)

	// the arena starts as random floats in [-1, 1) (parameters, state,
	// pixels alike), the labels valid classes; the scalar block as main's
	// race test set it (step 0, the first step's branches)
	init := perf.InitArena(spec, uint64(batch))
	device.StepScalars{Step: 0, Seed: 5, Valid: int64(spec.Batch), LR: 0.01}.Put(init[spec.Scalars:])

	// run returns, per launch, a hash of every buffer argument after it,
	// and the whole arena after the step
	seed := maphash.MakeSeed()
	run := func() ([]uint64, []byte) {
		require.NoError(t, emu.CopyIn(arena, init))
		var hashes []uint64
		for i, l := range spec.Train.Launches {
			require.NoError(t, mod.Launch(l.Kernel, emu.Dim3{X: l.Grid[0], Y: l.Grid[1], Z: l.Grid[2]},
				emu.Dim3{X: l.Block[0], Y: l.Block[1], Z: l.Block[2]}, l.SharedBytes, perf.StepParams(spec, l, arena)), "launch %d", i)
			var h maphash.Hash
			h.SetSeed(seed)
			for j, a := range l.Args {
				if a.Kind != kernelarg.Buffer {
					continue
				}
				v := comp.Train.Launches[i].Args[j].Value
				n := v.Type.Bytes(launchSamples(comp.Plan, comp.Train.Launches[i]))
				buf := make([]byte, n)
				require.NoError(t, emu.CopyOut(buf, arena+emu.Ptr(a.Offset)))
				h.Write(buf)
			}
			hashes = append(hashes, h.Sum64())
		}
		final := make([]byte, spec.ArenaBytes)
		require.NoError(t, emu.CopyOut(final, arena))
		return hashes, final
	}
	mod.SetSchedule(emu.Schedule{Order: emu.OrderForward})
	want, wantArena := run()
	for _, s := range raceSchedules {
		mod.SetSchedule(s)
		got, gotArena := run()
		for i := range want {
			l := comp.Train.Launches[i]
			require.Equal(t, want[i], got[i], "%s order: launch %d (%s, %s) gives other bits than the forward order: a race",
				s.Order, i, l.Kernel, l.Node.Text())
		}
		require.True(t, string(wantArena) == string(gotArena), "%s order: the arena after the step differs", s.Order)
	}
	t.Logf("%s at batch %d: %d launches of %d kernels give the same bits in the forward order and %d race orders",
		name, batch, len(spec.Train.Launches), len(comp.Train.Kernels), len(raceSchedules))
}
