//go:build cuda

package cuda_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/fakenccl"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/internal/syncbuf"
	"github.com/cnnc/cnnc/runtime/cuda"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/dist"
	"github.com/cnnc/cnnc/runtime/nccl"
	"github.com/cnnc/cnnc/runtime/trainer"
)

const (
	shardChild     = "CNNC_CUDA_TEST_SHARD_CHILD" // the directory the ranks write to
	broadcastMark  = "# broadcast group"
	shardStepMark  = "# shard step"
	shardStepsSeen = 1 // steps before the steady state: the first allocates and loads
)

// hostWaits are the driver calls with which the trainer's host waits for
// the device. (The fake libnccl's own synchronous copies, cuMemcpyDtoH and
// cuMemcpyHtoD inside each collective, are how it emulates NCCL without a
// GPU, not the trainer's waits; NVIDIA's NCCL runs its collectives on the
// stream.)
var hostWaits = []string{"cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"}

// shardCompile compiles dpModel's rank of 2 with a sharded optimizer.
func shardCompile(t *testing.T) (*trainergen.Compiled, []byte) {
	t.Helper()
	res, err := compiler.CompileSource("d.cnn", []byte(fmt.Sprintf(dpModel, dpGlobal, "")), compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{Ranks: dpRanks, ShardOptimizer: true}, driver.CUDA)
	require.NoError(t, err)
	fb, err := trainergen.CompileFatbin(c.Kernels)
	require.NoError(t, err)
	return c, fb
}

// A sharded rank's step on the device (runtime/trainer/shard.go): under
// the fake driver each rank's driver calls are traced, and in every
// steady-state step the host waits for the device once — the wait before
// it reads the step's loss — and the parameters' broadcasts are queued as
// one group after the step's last launch, with no wait of the host before
// them. Both ranks end with the same losses and parameters.
func TestShardedRankStepWaitsOnceOnTheHost(t *testing.T) {
	if fakecuda.Dir() == "" {
		t.Skip("counts the fake driver's calls (make test-fakecuda)")
	}
	nvcc.Require(t)
	ncclDir := t.TempDir()
	require.NoError(t, fakenccl.Build(ncclDir))
	env := append(fakenccl.Environ(ncclDir, os.Environ()), fmt.Sprintf("%s=%d", fakecuda.DevicesEnv, dpRanks))
	c, _ := shardCompile(t) // compiled here once: the ranks find nvcc's output cached
	require.NotNil(t, c.Spec.DataParallel.Shard)

	dir := t.TempDir()
	script := fmt.Sprintf(`%s="$1/trace.$RANK" exec "$2" -test.run='^TestShardedRankChild$' -test.v`, fakecuda.TraceEnv)
	var out syncbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	err := dist.Launch(ctx, dist.LaunchOptions{
		Procs: dpRanks, Exe: "/bin/sh", Args: []string{"-c", script, "sh", dir, os.Args[0]},
		Env:    append(env, shardChild+"="+dir, fakenccl.TimeoutEnv+"=120"),
		Stdout: &out, Stderr: &out,
	})
	t.Logf("ranks:\n%s", out.String())
	require.NoError(t, err)
	var results [dpRanks]dpResult
	for r := range dpRanks {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("result.%d", r)))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &results[r]))
		steps := shardTraceSteps(t, filepath.Join(dir, fmt.Sprintf("trace.%d", r)))
		require.Len(t, steps, len(dpValid))
		for s, calls := range steps[shardStepsSeen:] {
			var waits []string
			lastLaunch, group := -1, -1
			for i, c := range calls {
				switch {
				case slices.Contains(hostWaits, c):
					waits = append(waits, c)
					assert.Greater(t, i, group, "rank %d step %d: the host waits only after the broadcasts are queued", r, s+shardStepsSeen)
				case c == "cuLaunchKernel":
					lastLaunch = i
				case c == broadcastMark:
					assert.Equal(t, -1, group, "rank %d step %d: one group of broadcasts", r, s+shardStepsSeen)
					group = i
				}
			}
			assert.Len(t, waits, 1, "rank %d step %d waits on the host once: %v", r, s+shardStepsSeen, calls)
			assert.Greater(t, group, lastLaunch, "rank %d step %d: the broadcasts follow the step's launches", r, s+shardStepsSeen)
		}
	}
	assert.Equal(t, results[0].Losses, results[1].Losses)
	assert.Equal(t, results[0].Tensors, results[1].Tensors, "every rank holds every parameter after the broadcasts")
}

// shardTraceSteps cuts a rank's trace at its step marks.
func shardTraceSteps(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var steps [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, shardStepMark):
			steps = append(steps, []string{})
		case line == "# end":
			return steps
		case len(steps) > 0:
			steps[len(steps)-1] = append(steps[len(steps)-1], line)
		}
	}
	require.NoError(t, sc.Err())
	return steps
}

// markingBroadcaster is a rank's nccl.Reducer that marks its broadcast
// groups in the trace as it queues them (on the device's thread).
type markingBroadcaster struct {
	nccl.Reducer
	trace *os.File
}

func (m *markingBroadcaster) BroadcastGroup(queue func(broadcast func(from, to device.Ptr, count, root int) error) error) error {
	return m.Reducer.BroadcastGroup(func(broadcast func(from, to device.Ptr, count, root int) error) error {
		if _, err := fmt.Fprintln(m.trace, broadcastMark); err != nil {
			return err
		}
		return queue(broadcast)
	})
}

// TestShardedRankChild is one rank of TestShardedRankStepWaitsOnceOnTheHost.
func TestShardedRankChild(t *testing.T) {
	dir := os.Getenv(shardChild)
	if dir == "" {
		t.Skip("run by TestShardedRankStepWaitsOnceOnTheHost")
	}
	cfg, _, err := dist.FromEnv(os.Getenv)
	require.NoError(t, err)
	c, fb := shardCompile(t)
	d, err := cuda.New(fb) // GPU LOCAL_RANK
	require.NoError(t, err)
	defer d.Close()
	s, err := trainer.NewSession(c.Spec, d, dpSeed)
	require.NoError(t, err)
	defer s.Close()

	comm, leave := joinJob(t, d, cfg)
	defer leave()
	trace, err := os.OpenFile(os.Getenv(fakecuda.TraceEnv), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer trace.Close()
	require.NoError(t, s.SetParallel(cfg.Rank, &markingBroadcaster{Reducer: nccl.Reducer{Comm: comm, On: d.OnStream}, trace: trace}))

	share := c.Spec.Batch
	var res dpResult
	for step, b := range dpBatches(c.Spec) {
		n := len(b.Pixels) / b.Valid
		lo, hi := min(cfg.Rank*share, b.Valid), min((cfg.Rank+1)*share, b.Valid)
		part := trainer.Batch{Valid: hi - lo, GlobalValid: b.Valid, Pixels: b.Pixels[lo*n : hi*n], Labels: b.Labels[lo:hi]}
		_, err := fmt.Fprintf(trace, "%s %d\n", shardStepMark, step)
		require.NoError(t, err)
		loss, _, err := s.TrainStep(part)
		require.NoError(t, err)
		res.Losses = append(res.Losses, math.Float32bits(loss))
	}
	_, err = fmt.Fprintln(trace, "# end")
	require.NoError(t, err)
	res.Tensors = map[string][]uint32{}
	for _, ten := range s.Spec.Params {
		v, err := s.ReadTensor(ten)
		require.NoError(t, err)
		bits := make([]uint32, len(v))
		for i, x := range v {
			bits[i] = math.Float32bits(x)
		}
		res.Tensors[ten.Name] = bits
	}
	b, err := json.Marshal(res)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("result.%d", cfg.Rank)), b, 0o644))
	fmt.Println("RANK DONE")
}
