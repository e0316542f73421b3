package trainergen_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/fakenccl"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/nccl"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// A sharded optimizer (ZeRO stage 1) trains bit for bit as one process
// with accumulate = N, for SGD with momentum and Adam over 2 and 4 ranks:
// each rank updates its own parameters with the summed gradient (the same
// kernels on the same bits as the unsharded step, see
// TestDataParallelRanksEqualAccumulate) and broadcasts them, which copies
// bits. h.weight (768 of the model's 885 parameters) has its state split in
// element ranges over the ranks — each rank runs its update on its range —
// so the largest share is about 1/N of the state: within the even share
// plus the largest whole parameter's (aligned) state. A checkpoint written by rank 0 after gathering holds the whole
// state, the same bits as the one process's; resumed from it on fresh
// ranks, each loading its own share, the run goes on bit for bit (a
// partial last batch included). So no tolerance.
func TestShardedOptimizerEqualsAccumulate(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, fakenccl.Build(dir))
	lib, err := nccl.Open(filepath.Join(dir, fakenccl.LibName))
	require.NoError(t, err)
	const global = 8
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9)", "adam(lr=0.01, weight_decay=0.01)"} {
		for _, ranks := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/%d", opt[:4], ranks), func(t *testing.T) {
				one := newSession(t, compileTrainerSrc(t, fmt.Sprintf(accumulateModel, opt, global/ranks, fmt.Sprintf(" accumulate = %d", ranks))), 5)
				res, err := compiler.CompileSource("d.cnn", []byte(fmt.Sprintf(accumulateModel, opt, global, "")), compiler.Options{})
				require.NoError(t, err)
				dp := compileTrainer(t, res, plan.Config{Ranks: ranks, ShardOptimizer: true})
				sh := dp.Spec.DataParallel.Shard
				require.NotNil(t, sh)
				cost := dp.Plan.DataParallel.Shard
				assert.Less(t, cost.ShardBytes, cost.StateBytes, "the state is shared out")
				assert.Equal(t, []string{"h.weight"}, cost.SplitParams)
				var largest int64
				for i, p := range dp.Spec.Params {
					if p.Name == "h.weight" {
						assert.Equal(t, int64(768/ranks), sh.Split[i], "ranges of ⌈768/%d⌉ elements, a multiple of %d", ranks, plan.RangeAlignElems)
						assert.Equal(t, -1, sh.Owners[i])
						continue
					}
					assert.Zero(t, sh.Split[i], p.Name)
					assert.True(t, sh.Owners[i] >= 0 && sh.Owners[i] < ranks, "%s: rank %d", p.Name, sh.Owners[i])
					opts := int64(1 + strings.Count(opt, "adam"))
					largest = max(largest, opts*((p.Bytes()+dp.Plan.Alignment-1)/dp.Plan.Alignment*dp.Plan.Alignment))
				}
				assert.LessOrEqual(t, cost.ShardBytes, (cost.StateBytes+int64(ranks)-1)/int64(ranks)+largest, "about 1/%d of the state: %v", ranks, cost.RankBytes)

				rng := rand.New(rand.NewPCG(7, uint64(ranks)))
				sessions := shardedRanks(t, lib, dp, ranks)
				for step, valid := range []int{global, global} {
					stepAll(t, one, sessions, randomBatch(rng, valid), step)
				}
				compareShards(t, one, sessions)

				err = sessions[1].Encode(&bytes.Buffer{}, nil)
				require.Error(t, err, "rank 1 alone cannot save another rank's state")
				gatherAll(t, sessions)
				var saved, want bytes.Buffer
				require.NoError(t, sessions[0].Encode(&saved, nil))
				require.NoError(t, one.Encode(&want, nil))
				sameTensors(t, want.Bytes(), saved.Bytes())

				lone := newSession(t, dp, 5)
				_, err = lone.Decode(bytes.NewReader(saved.Bytes()), true)
				require.ErrorContains(t, err, "a sharded optimizer's state loads on a rank (after SetParallel)")
				bad, badDP, badShard := *dp.Spec, *dp.Spec.DataParallel, *sh
				badShard.Owners = append([]int(nil), sh.Owners...)
				badShard.Owners[0] = ranks
				badDP.Shard, bad.DataParallel = &badShard, &badDP
				require.ErrorContains(t, bad.Validate(), fmt.Sprintf("optimizer state lies with rank %d of %d", ranks, ranks))
				badShard.Owners = sh.Owners
				badShard.Split = slices.Clone(sh.Split)
				for i, k := range badShard.Split {
					if k > 0 {
						badShard.Split[i] = k - plan.RangeAlignElems // ranges that miss the tensor's end
					}
				}
				require.ErrorContains(t, bad.Validate(), "h.weight's optimizer state lies with rank -1")

				resumed := shardedRanks(t, lib, dp, ranks)
				for _, s := range resumed {
					_, err := s.Decode(bytes.NewReader(saved.Bytes()), true)
					require.NoError(t, err)
					assert.Equal(t, int64(2), s.Step)
				}
				for step, valid := range []int{global, global - 3} {
					stepAll(t, one, resumed, randomBatch(rng, valid), 2+step)
				}
				compareShards(t, one, resumed)
			})
		}
	}
}

// shardedRanks opens the ranks of c and joins them.
func shardedRanks(t *testing.T, lib *nccl.Library, dp *trainergen.Compiled, ranks int) []*trainer.Session {
	t.Helper()
	sessions := make([]*trainer.Session, ranks)
	for r := range sessions {
		sessions[r] = newSession(t, dp, 5)
	}
	joinRanks(t, lib, sessions)
	return sessions
}

// stepAll trains one step of the one process and of the ranks, and
// compares the losses and correct counts.
func stepAll(t *testing.T, one *trainer.Session, sessions []*trainer.Session, b trainer.Batch, step int) {
	t.Helper()
	wantLoss, wantCorrect, err := one.TrainStep(b)
	require.NoError(t, err)
	losses, corrects := trainRanks(t, sessions, b)
	for r := range sessions {
		assert.Equal(t, math.Float32bits(wantLoss), math.Float32bits(losses[r]), "step %d rank %d loss %g, want %g", step, r, losses[r], wantLoss)
		assert.Equal(t, wantCorrect, corrects[r], "step %d rank %d", step, r)
	}
}

// compareShards compares every parameter on every rank, and each state
// tensor on the rank that holds it, with the one process's.
func compareShards(t *testing.T, one *trainer.Session, sessions []*trainer.Session) {
	t.Helper()
	sh := sessions[0].Spec.DataParallel.Shard
	read := func(s *trainer.Session, name string, ts []trainer.Tensor) []uint32 {
		for _, u := range ts {
			if u.Name == name {
				v, err := s.ReadTensor(u)
				require.NoError(t, err)
				return bitsOf(v)
			}
		}
		t.Fatalf("no tensor %s", name)
		return nil
	}
	for _, p := range sessions[0].Spec.Params {
		w := read(one, p.Name, one.Spec.Params)
		for r, s := range sessions {
			require.Equal(t, w, read(s, p.Name, s.Spec.Params), "%s on rank %d", p.Name, r)
		}
	}
	for j, st := range sessions[0].Spec.State {
		want := read(one, st.Name, one.Spec.State)
		if st.RankElems > 0 { // each rank's range
			for r, s := range sessions {
				lo, hi := st.RankRange(r)
				require.Equal(t, want[lo:hi], read(s, st.Name, s.Spec.State), "%s's elements [%d, %d) on rank %d", st.Name, lo, hi, r)
			}
			continue
		}
		o := sh.Owners[sh.StateParams[j]]
		require.Equal(t, want, read(sessions[o], st.Name, sessions[o].Spec.State), "%s on its rank %d", st.Name, o)
	}
}

// gatherAll gathers the state to rank 0, every rank at once.
func gatherAll(t *testing.T, sessions []*trainer.Session) {
	t.Helper()
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for r, s := range sessions {
		wg.Go(func() { errs[r] = s.GatherOptimizerState() })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// sameTensors compares two checkpoints' tensors bit for bit.
func sameTensors(t *testing.T, want, got []byte) {
	t.Helper()
	w, err := checkpoint.Decode(want)
	require.NoError(t, err)
	g, err := checkpoint.Decode(got)
	require.NoError(t, err)
	require.Equal(t, len(w.Tensors), len(g.Tensors))
	for _, wt := range w.Tensors {
		gt, ok := g.Tensor(wt.Name)
		require.True(t, ok, wt.Name)
		assert.Equal(t, wt.Shape, gt.Shape, wt.Name)
		assert.True(t, bytes.Equal(wt.Data, gt.Data), "%s differs", wt.Name)
	}
}

// The same on the CUDA target's kernels (on the emulator, the kernels'
// oracle): each rank runs the CUDA update kernel of h.weight on its own
// element range, its state buffer holding the range only, and the
// updates of its whole parameters, on a device with a second stream
// (sideDevice: its all-reduces run as late as the events allow), so that
// the rank sums its buckets overlapped as on a GPU — the buckets' launch
// numbers counted in the launches the sharded rank runs — and broadcasts
// its parameters after its updates. Bit for bit the one
// process's with accumulate = 2 on the same kernels, gathered checkpoint
// and resumed run included (the per-element argument above).
func TestShardedOptimizerOnCUDAKernelsEqualsAccumulate(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, fakenccl.Build(dir))
	lib, err := nccl.Open(filepath.Join(dir, fakenccl.LibName))
	require.NoError(t, err)
	const global, ranks = 8, 2
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9)", "adam(lr=0.01, weight_decay=0.01)"} {
		t.Run(opt[:4], func(t *testing.T) {
			one := newSession(t, compileSrc(t, fmt.Sprintf(accumulateModel, opt, global/ranks, fmt.Sprintf(" accumulate = %d", ranks))), 5)
			res, err := compiler.CompileSource("d.cnn", []byte(fmt.Sprintf(accumulateModel, opt, global, "")), compiler.Options{})
			require.NoError(t, err)
			// small buckets, one or two gradients each: some skipped updates come
			// before a later bucket's first reader
			dp, err := driver.Compile(res, plan.Config{Ranks: ranks, ShardOptimizer: true, FirstBucketBytes: 64, BucketBytes: 256}, driver.CUDA)
			require.NoError(t, err)
			require.Equal(t, []string{"h.weight"}, dp.Plan.DataParallel.Shard.SplitParams)
			require.Greater(t, len(dp.Spec.DataParallel.Buckets), 2)
			open := func() ([]*trainer.Session, []*sideDevice) {
				sessions, devs := make([]*trainer.Session, ranks), make([]*sideDevice, ranks)
				for r := range sessions {
					devs[r] = &sideDevice{Device: openDevice(t, dp)}
					sessions[r], err = trainer.NewSession(dp.Spec, devs[r], 5)
					require.NoError(t, err)
					t.Cleanup(func() { sessions[r].Close() })
				}
				joinRanks(t, lib, sessions)
				return sessions, devs
			}
			rng := rand.New(rand.NewPCG(9, ranks))
			sessions, devs := open()
			for _, d := range devs {
				d.syncs = 0
			}
			for step := range 2 {
				stepAll(t, one, sessions, randomBatch(rng, global), step)
			}
			compareShards(t, one, sessions)
			for r, d := range devs {
				assert.Equal(t, 2*len(dp.Spec.DataParallel.Buckets), d.sums, "rank %d sums every bucket on the second stream", r)
				// the one wait of a step is its end's, for the loss: the
				// broadcasts are queued behind the updates without one
				assert.Equal(t, 2, d.syncs, "rank %d waits on the host once a step", r)
			}
			gatherAll(t, sessions)
			var saved, want bytes.Buffer
			require.NoError(t, sessions[0].Encode(&saved, nil))
			require.NoError(t, one.Encode(&want, nil))
			sameTensors(t, want.Bytes(), saved.Bytes())

			resumed, _ := open()
			for _, s := range resumed {
				_, err := s.Decode(bytes.NewReader(saved.Bytes()), true)
				require.NoError(t, err)
			}
			for step, valid := range []int{global, global - 3} {
				stepAll(t, one, resumed, randomBatch(rng, valid), 2+step)
			}
			compareShards(t, one, resumed)
		})
	}
}

// sideDevice is a device with a second stream that runs its work as late
// as the ordering calls allow: an all-reduce queued there runs only when
// the device's stream waits for a mark placed after it (the emulator's own
// launches finish before they return, so the side stream's wait for the
// device always holds). A rank that launched a bucket's reader before
// waiting for its mark would read the unsummed gradient; one that never
// waits leaves the all-reduce pending at Close, an error. sums counts the
// all-reduces queued there, syncs the host's waits for the device.
type sideDevice struct {
	device.Device
	sums, syncs int
}

func (d *sideDevice) Sync() error {
	d.syncs++
	return d.Device.Sync()
}

func (d *sideDevice) NewSideStream(marks int) (device.SideStream, error) {
	return &lateSide{d: d, marks: make([]int, marks)}, nil
}

// lateSide is sideDevice's stream: pending work, run up to marks[i] (a
// count of pending work) when the device waits for mark i.
type lateSide struct {
	d       *sideDevice
	pending []func() error
	done    int
	marks   []int
}

func (s *lateSide) WaitForDevice() error { return nil }
func (s *lateSide) Run(f func(stream uintptr) error) error {
	s.d.sums++
	s.pending = append(s.pending, func() error { return f(0) })
	return nil
}
func (s *lateSide) Mark(i int) error {
	s.marks[i] = len(s.pending)
	return nil
}
func (s *lateSide) DeviceWaits(i int) error {
	for ; s.done < s.marks[i]; s.done++ {
		if err := s.pending[s.done](); err != nil {
			return err
		}
	}
	return nil
}
func (s *lateSide) Close() error {
	if s.done < len(s.pending) {
		return fmt.Errorf("%d all-reduces of the side stream were never waited for", len(s.pending)-s.done)
	}
	return nil
}
