package trainer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/trainertest"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/kernelarg"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A spec's data-parallel side that does not fit its step is refused before
// anything runs; a session of a one-device spec cannot become a rank.
// (The rank's step itself: TestDataParallelRanksEqualAccumulate in
// codegen/trainergen and TestBuiltDataParallelTrainer in cmd/cnnc.)
func TestSpecChecksTheDataParallelSide(t *testing.T) {
	m := trainertest.Tiny(t)
	intArg := -1
	for i, a := range m.Spec.Train.Launches[0].Args {
		if a.Kind != kernelarg.Int {
			intArg = i
		}
	}
	good := trainer.DataParallel{Ranks: 2, GlobalBatch: 2 * m.Spec.Batch, ReduceAfter: 1,
		Buckets: []trainer.Bucket{{Offset: m.Spec.Params[0].Offset, Bytes: 8, ReadyAfter: 1, NeededAt: 1}}}
	sp := *m.Spec
	sp.DataParallel = &good
	require.NoError(t, sp.Validate())
	for name, c := range map[string]struct {
		edit func(*trainer.DataParallel)
		want string
	}{
		"one rank":                   {func(d *trainer.DataParallel) { d.Ranks = 1 }, "do not make the global batch"},
		"global batch":               {func(d *trainer.DataParallel) { d.GlobalBatch++ }, "do not make the global batch"},
		"reduce after":               {func(d *trainer.DataParallel) { d.ReduceAfter = len(m.Spec.Train.Launches) + 1 }, "the all-reduce after launch"},
		"bucket outside":             {func(d *trainer.DataParallel) { d.Buckets[0].Offset = m.Spec.ArenaBytes - 4 }, "is not float32 values inside the arena"},
		"bucket of 6 bytes":          {func(d *trainer.DataParallel) { d.Buckets[0].Bytes = 6 }, "is not float32 values inside the arena"},
		"bucket read before written": {func(d *trainer.DataParallel) { d.Buckets[0].NeededAt = 0 }, "is written by launch 0 and read by launch 0"},
		"bucket never written":       {func(d *trainer.DataParallel) { d.Buckets[0].ReadyAfter = 0 }, "is written by launch -1"},
		"first argument": {func(d *trainer.DataParallel) {
			d.FirstArgs = []trainer.FirstArg{{Launch: 0, Arg: intArg, PerSample: 1}}
		}, "is no integer argument"},
	} {
		d := good
		d.Buckets = append([]trainer.Bucket{}, good.Buckets...)
		c.edit(&d)
		sp.DataParallel = &d
		assert.ErrorContains(t, sp.Validate(), c.want, name)
	}

	s := m.Session(t, 1)
	assert.ErrorContains(t, s.SetParallel(0, nilReducer{}), "was not compiled for data-parallel ranks")
}

type nilReducer struct{}

func (nilReducer) AllReduce(device.Ptr, int) error { return nil }
