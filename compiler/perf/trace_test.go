package perf

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/runtime/emu"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// sampleWith samples every launch with the given interior counts.
func sampleWith(interior [3]int) func(trainer.Launch) []emu.BlockSample {
	return func(l trainer.Launch) []emu.BlockSample {
		return emu.SampleBlocks(emu.Dim3{X: l.Grid[0], Y: l.Grid[1], Z: l.Grid[2]}, interior)
	}
}

// everyBlock traces every block of every launch.
func everyBlock(trainer.Launch) []emu.BlockSample { return nil }

// twoBlocks is a small ResNet: a stem and two identical BasicBlocks, so
// its step repeats launches (the blocks' convs, batch norms, ReLUs and
// their gradients) as ResNet-18's stages do.
const twoBlocks = `model TwoBlocks(image: f32[3,8,8], label: class[4]) {
    stem  = conv2d(image, out=8, kernel=3, padding=1, bias=false)
    sbn   = batchnorm2d(stem)
    srelu = relu(sbn)
    a1    = conv2d(srelu, out=8, kernel=3, padding=1, bias=false)
    abn1  = batchnorm2d(a1)
    arelu = relu(abn1)
    a2    = conv2d(arelu, out=8, kernel=3, padding=1, bias=false)
    abn2  = batchnorm2d(a2)
    aadd  = add(abn2, srelu)
    aout  = relu(aadd)
    b1    = conv2d(aout, out=8, kernel=3, padding=1, bias=false)
    bbn1  = batchnorm2d(b1)
    brelu = relu(bbn1)
    b2    = conv2d(brelu, out=8, kernel=3, padding=1, bias=false)
    bbn2  = batchnorm2d(b2)
    badd  = add(bbn2, aout)
    bout  = relu(badd)
    pool  = global_avgpool(bout)
    fc    = linear(pool, out=4)
    loss  = cross_entropy(fc, label)
}
train {
    optimizer = sgd(lr=0.1, momentum=0.9)
    batch = 4
}
`

// compileTwoBlocks compiles TwoBlocks' step at batch 4, or with ranks > 1
// one data-parallel rank's step of batch 4 (the global batch 4 × ranks).
func compileTwoBlocks(t *testing.T, ranks int) *trainergen.Compiled {
	t.Helper()
	res, err := compiler.CompileSource("twoblocks.cnn", []byte(twoBlocks), compiler.Options{Batch: 4 * int64(max(ranks, 1))})
	require.NoError(t, err)
	comp, err := driver.Compile(res, plan.Config{Ranks: ranks}, driver.CUDA)
	require.NoError(t, err)
	return comp
}

// A conv launch that repeats an earlier one's kernel, geometry and
// arguments (launchKey) counts what that one counted: on a whole step of a
// net with two identical BasicBlocks, the trace that runs each distinct
// conv launch once equals, launch by launch, the trace that runs them all —
// but for relu_grad, which loads dy only where y > 0: a launch not run
// writes nothing (as the blocks a sample leaves out write nothing), so the
// launches after it see other leftover data, and a count that depends on
// the data moves (here by up to a quarter of relu_grad's accesses; the
// arena is random either way, not the model's data).
// Equal up to rounding: a count adds up its sampled blocks' weighted counts
// in the order the emulator's workers finish, each sum of at most 10^4
// terms off by at most 10^4 × 2^-53 < 10^-12 of itself.
func TestTraceReuseMatchesEveryLaunch(t *testing.T) {
	comp := compileTwoBlocks(t, 0)
	launches := comp.Spec.Train.Launches
	isConv := func(l trainer.Launch) bool { return strings.HasPrefix(l.Kernel, "conv_") }
	distinct, convs := map[string]bool{}, 0
	for _, l := range launches {
		if isConv(l) {
			distinct[launchKey(l)] = true
			convs++
		}
	}
	require.Less(t, len(distinct)+5, convs, "the net repeats conv launches, else the test shows nothing")
	reused, err := traceStep(comp, sampleWith(traceSample), isConv, newTraceMemo(), false)
	require.NoError(t, err)
	all, err := traceStep(comp, sampleWith(traceSample), nil, nil, false)
	require.NoError(t, err)
	requireSameCounts(t, launches, all, reused)
}

// A data-parallel rank's step takes the counts of the conv launches the
// one-GPU step traced before it (the same kernels, geometry and arguments):
// its trace then equals, launch by launch, its trace run alone, as above.
func TestTraceReuseAcrossSteps(t *testing.T) {
	isConv := func(l trainer.Launch) bool { return strings.HasPrefix(l.Kernel, "conv_") }
	one, rank := compileTwoBlocks(t, 0), compileTwoBlocks(t, 2)
	memo := newTraceMemo()
	_, err := traceStep(one, sampleWith(traceSample), isConv, memo, false)
	require.NoError(t, err)
	hits := 0
	for _, l := range rank.Spec.Train.Launches {
		if _, ok := memo.get(reuseKey(rank, l)); ok && isConv(l) {
			hits++
		}
	}
	require.Greater(t, hits, 5, "the rank's step repeats the one-GPU step's conv launches, else the test shows nothing")
	reused, err := traceStep(rank, sampleWith(traceSample), isConv, memo, false)
	require.NoError(t, err)
	alone, err := traceStep(rank, sampleWith(traceSample), nil, nil, false)
	require.NoError(t, err)
	requireSameCounts(t, rank.Spec.Train.Launches, alone, reused)
}

// requireSameCounts checks that reused counts equal all's up to rounding,
// launch by launch, but for relu_grad's (see above).
func requireSameCounts(t *testing.T, launches []trainer.Launch, all, reused []Accesses) {
	t.Helper()
	require.Len(t, reused, len(all))
	reads, masked := 0, 0
	for i := range all {
		if strings.HasPrefix(launches[i].Kernel, "relu_grad") {
			masked++
			continue
		}
		reads++
		a, r := all[i], reused[i]
		for _, q := range []struct {
			what      string
			all, used float64
		}{
			{"shared accesses", a.SharedAccesses, r.SharedAccesses},
			{"shared wavefronts", a.SharedWavefronts, r.SharedWavefronts},
			{"shared ideal", a.SharedIdeal, r.SharedIdeal},
			{"global accesses", a.GlobalAccesses, r.GlobalAccesses},
			{"global sectors", a.GlobalSectors, r.GlobalSectors},
			{"global bytes", a.GlobalBytes, r.GlobalBytes},
			{"tiles", a.Tiles, r.Tiles},
		} {
			assert.InEpsilon(t, q.all+1, q.used+1, 1e-12, "launch %d (%s): %s", i, launches[i].Kernel, q.what)
		}
	}
	assert.Less(t, masked, reads/4, "few launches read by a mask")
}

// The key tells apart what changes the counts: another kernel or
// geometry, an integer argument, a buffer moved by part of a sector, a
// buffer in place of another; a buffer moved by whole sectors does not.
func TestLaunchKey(t *testing.T) {
	l := comp0(t)
	same := cloneLaunch(l)
	same.Args[0].Offset += 32 * 1000
	assert.Equal(t, launchKey(l), launchKey(same), "moved by whole sectors")
	for name, change := range map[string]func(*trainer.Launch){
		"kernel":       func(c *trainer.Launch) { c.Kernel += "x" },
		"grid":         func(c *trainer.Launch) { c.Grid[0]++ },
		"block":        func(c *trainer.Launch) { c.Block[0] *= 2 },
		"shared":       func(c *trainer.Launch) { c.SharedBytes += 16 },
		"part sector":  func(c *trainer.Launch) { c.Args[0].Offset += 16 },
		"in place":     func(c *trainer.Launch) { c.Args[1].Offset = c.Args[0].Offset },
		"int argument": func(c *trainer.Launch) { c.Args = append(c.Args, trainer.Arg{Int: 7}) },
	} {
		c := cloneLaunch(l)
		change(&c)
		assert.NotEqual(t, launchKey(l), launchKey(c), name)
	}
}

// comp0 is TwoBlocks' first launch with two buffer arguments.
func comp0(t *testing.T) trainer.Launch {
	for _, l := range compileTwoBlocks(t, 0).Spec.Train.Launches {
		n := 0
		for _, a := range l.Args {
			if a.Kind == 0 {
				n++
			}
		}
		if n >= 2 && l.Args[0].Offset != l.Args[1].Offset {
			return l
		}
	}
	t.Fatal("no launch with two buffers")
	return trainer.Launch{}
}

func cloneLaunch(l trainer.Launch) trainer.Launch {
	l.Args = append([]trainer.Arg(nil), l.Args...)
	return l
}

// dumpSites (CNNC_PERF_SITES) lists shared sites before global ones, the
// most wavefronts first, with the launch's totals.
func TestDumpSitesOrder(t *testing.T) {
	var b strings.Builder
	dumpSites(&b, "/nonexistent.so", 3, "k", []emu.AccessSite{
		{PC: 1, Space: emu.Global, Accesses: 10, Lanes: 320, Transactions: 90, Bytes: 1280},
		{PC: 2, Space: emu.Shared, Accesses: 4, Lanes: 128, Transactions: 4, Bytes: 512},
		{PC: 3, Space: emu.Shared, Store: true, Matrix: true, Accesses: 2, Lanes: 64, Transactions: 16, Bytes: 2048},
	})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 4)
	assert.Equal(t, "launch 3 k: shared 6 accesses, 20 wavefronts (ideal 20)", lines[0])
	assert.Contains(t, lines[1], "shared store matrix")
	assert.Contains(t, lines[1], "(8.00/acc)")
	assert.Contains(t, lines[2], "shared load")
	assert.Contains(t, lines[3], "global load")
}
