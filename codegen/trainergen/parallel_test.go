package trainergen_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/internal/fakenccl"
	"github.com/cnnc/cnnc/runtime/nccl"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// N data-parallel ranks, each training on its share (batch B/N) of every
// global batch of B and summing its gradient buckets through NCCL (the
// fake libnccl, on the CPU target's host memory), train bit for bit as one
// process with accumulate = N at batch B: the loss kernel of rank r
// computes rows r·B/N.. of the global batch scaled by 1/B, as micro-batch
// r of the accumulating step does, its dropout mask is keyed by the
// global batch's element indices, and the fake sums the ranks' partial
// gradients in rank order, ((p0 + p1) + p2) + ..., as the accumulating
// step adds its micro-batches' into zeroed accumulators. So no tolerance:
// the losses, correct counts and every parameter and optimizer state
// after the steps — a partial last batch, in which the later ranks have
// fewer samples or none, included — are the same bits.
func TestDataParallelRanksEqualAccumulate(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, fakenccl.Build(dir))
	lib, err := nccl.Open(filepath.Join(dir, fakenccl.LibName))
	require.NoError(t, err)
	const global, opt = 8, "sgd(lr=0.1, momentum=0.9)"
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprint(ranks), func(t *testing.T) {
			one := newSession(t, compileTrainerSrc(t, fmt.Sprintf(accumulateModel, opt, global/ranks, fmt.Sprintf(" accumulate = %d", ranks))), 5)
			res, err := compiler.CompileSource("d.cnn", []byte(fmt.Sprintf(accumulateModel, opt, global, "")), compiler.Options{})
			require.NoError(t, err)
			dp := compileTrainer(t, res, plan.Config{Ranks: ranks})
			require.NotNil(t, dp.Spec.DataParallel)
			require.Equal(t, global/ranks, dp.Spec.Batch)
			sessions := make([]*trainer.Session, ranks)
			for r := range sessions {
				sessions[r] = newSession(t, dp, 5)
			}
			joinRanks(t, lib, sessions)

			rng := rand.New(rand.NewPCG(3, uint64(ranks)))
			n := dp.Spec.H * dp.Spec.W * dp.Spec.C
			for step, valid := range []int{global, global, global - 3} {
				b := trainer.Batch{Valid: valid, Pixels: make([]uint8, valid*n), Labels: make([]int32, valid)}
				for i := range b.Pixels {
					b.Pixels[i] = uint8(rng.IntN(256))
				}
				for i := range b.Labels {
					b.Labels[i] = int32(rng.IntN(dp.Spec.Classes))
				}
				wantLoss, wantCorrect, err := one.TrainStep(b)
				require.NoError(t, err)
				losses, corrects := trainRanks(t, sessions, b)
				for r := range sessions {
					assert.Equal(t, math.Float32bits(wantLoss), math.Float32bits(losses[r]), "step %d rank %d loss %g, want %g", step, r, losses[r], wantLoss)
					assert.Equal(t, wantCorrect, corrects[r], "step %d rank %d", step, r)
				}
			}
			for _, ten := range append(append([]trainer.Tensor{}, dp.Spec.Params...), dp.Spec.State...) {
				var want trainer.Tensor
				for _, u := range append(append([]trainer.Tensor{}, one.Spec.Params...), one.Spec.State...) {
					if u.Name == ten.Name {
						want = u
					}
				}
				require.NotEmpty(t, want.Name, ten.Name)
				w, err := one.ReadTensor(want)
				require.NoError(t, err)
				for r, s := range sessions {
					got, err := s.ReadTensor(ten)
					require.NoError(t, err)
					require.Equal(t, bitsOf(w), bitsOf(got), "%s on rank %d", ten.Name, r)
				}
			}
		})
	}
}

// joinRanks makes sessions the ranks of one NCCL communicator.
func joinRanks(t *testing.T, lib *nccl.Library, sessions []*trainer.Session) {
	t.Helper()
	id, err := lib.UniqueID()
	require.NoError(t, err)
	comms := make([]*nccl.Comm, len(sessions))
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for r := range sessions {
		wg.Go(func() { comms[r], errs[r] = lib.CommInitRank(id, len(sessions), r) })
	}
	wg.Wait()
	for r, s := range sessions {
		require.NoError(t, errs[r])
		t.Cleanup(func() { comms[r].Destroy() })
		require.NoError(t, s.SetParallel(r, nccl.Reducer{Comm: comms[r]}))
	}
}

// trainRanks runs one training step of every rank on its share of b (as
// runtime/data's rank loaders cut it), concurrently: the all-reduces wait
// for every rank.
func trainRanks(t *testing.T, sessions []*trainer.Session, b trainer.Batch) ([]float32, []int) {
	t.Helper()
	share := sessions[0].Spec.Batch
	n := len(b.Pixels) / max(b.Valid, 1)
	losses, corrects := make([]float32, len(sessions)), make([]int, len(sessions))
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for r, s := range sessions {
		lo, hi := min(r*share, b.Valid), min((r+1)*share, b.Valid)
		part := trainer.Batch{Valid: hi - lo, GlobalValid: b.Valid, Pixels: b.Pixels[lo*n : hi*n], Labels: b.Labels[lo:hi]}
		wg.Go(func() { losses[r], corrects[r], errs[r] = s.TrainStep(part) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return losses, corrects
}

// bitsOf is vals' bit patterns (so that -0 differs from 0 and NaNs compare).
func bitsOf(vals []float32) []uint32 {
	out := make([]uint32, len(vals))
	for i, v := range vals {
		out[i] = math.Float32bits(v)
	}
	return out
}

// bnModel has a batch norm: data-parallel ranks normalise by their own
// share's statistics, as PyTorch's DistributedDataParallel does without
// SyncBatchNorm.
const bnModel = `model B(image: f32[3,7,6], label: class[3]) {
    c    = conv2d(image, out=4, kernel=3, padding=1, bias=false)
    bn   = batchnorm2d(c)
    h    = linear(flatten(relu(bn)), out=3)
    loss = cross_entropy(h, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) batch = %d }
`

// Batch norm on data-parallel ranks keeps per-rank statistics (what
// docs/architecture.md says, as DDP without SyncBatchNorm): after one step
// from the same initialisation, rank r's running mean and variance are
// exactly those of a one-device trainer at the share's batch that took
// the step on rank r's share alone — the same forward kernels on the same
// samples and parameters — so the two ranks' differ, while every
// parameter is the same on both ranks (its gradient is summed).
func TestDataParallelBatchNormKeepsPerRankStatistics(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, fakenccl.Build(dir))
	lib, err := nccl.Open(filepath.Join(dir, fakenccl.LibName))
	require.NoError(t, err)
	const global, ranks = 8, 2
	res, err := compiler.CompileSource("b.cnn", []byte(fmt.Sprintf(bnModel, global)), compiler.Options{})
	require.NoError(t, err)
	dp := compileTrainer(t, res, plan.Config{Ranks: ranks})
	sessions := []*trainer.Session{newSession(t, dp, 5), newSession(t, dp, 5)}
	joinRanks(t, lib, sessions)
	single := compileTrainerSrc(t, fmt.Sprintf(bnModel, global/ranks))

	rng := rand.New(rand.NewPCG(9, 9))
	n := dp.Spec.H * dp.Spec.W * dp.Spec.C
	b := trainer.Batch{Valid: global, Pixels: make([]uint8, global*n), Labels: make([]int32, global)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(dp.Spec.Classes))
	}
	trainRanks(t, sessions, b)

	stats := 0
	for _, ten := range dp.Spec.Params {
		got := make([][]uint32, ranks)
		for r, s := range sessions {
			v, err := s.ReadTensor(ten)
			require.NoError(t, err)
			got[r] = bitsOf(v)
		}
		assert.Equal(t, got[0], got[1], "%s: the same on every rank", ten.Name)
	}
	for _, ten := range dp.Spec.Buffers {
		if !strings.HasSuffix(ten.Name, ".running_mean") && !strings.HasSuffix(ten.Name, ".running_var") {
			continue
		}
		stats++
		var per [ranks][]uint32
		for r, s := range sessions {
			one := newSession(t, single, 5)
			share := global / ranks
			_, _, err := one.TrainStep(trainer.Batch{Valid: share, Pixels: b.Pixels[r*share*n : (r+1)*share*n], Labels: b.Labels[r*share : (r+1)*share]})
			require.NoError(t, err)
			want, err := one.ReadTensor(ten)
			require.NoError(t, err)
			got, err := s.ReadTensor(ten)
			require.NoError(t, err)
			assert.Equal(t, bitsOf(want), bitsOf(got), "%s on rank %d: its own share's statistics", ten.Name, r)
			per[r] = bitsOf(got)
		}
		assert.NotEqual(t, per[0], per[1], "%s: the ranks' statistics differ (no synchronised batch norm)", ten.Name)
	}
	assert.Equal(t, 2, stats, "bn's running mean and variance")
}
