//go:build cuda

package cuda_test

// The data-parallel rank's step on the device (runtime/trainer's
// launchOverlapped): ranks are processes of this test binary, each on GPU
// LOCAL_RANK (cuda.New; the fake driver is given a device per rank),
// joined by runtime/dist and NCCL (under the fake driver, the fake
// libnccl), summing their gradient buckets on a second stream while the
// backward pass goes on.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/cu"

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
	dpChild = "CNNC_CUDA_TEST_DP_CHILD" // the directory the ranks write to
	// dpModel: dropout (its masks keyed by the global batch's elements),
	// SGD with momentum, a global batch of 8 (%s: accumulate = 2 for the
	// one-device reference)
	dpModel = `model D(image: f32[1,9,8], label: class[5]) {
    c    = conv2d(image, out=4, kernel=3, padding=1)
    p    = maxpool(relu(c), kernel=2)
    h    = linear(flatten(p), out=12)
    d    = dropout(relu(h), p=0.3)
    out  = linear(d, out=5)
    loss = cross_entropy(out, label)
}
train { optimizer = sgd(lr=0.1, momentum=0.9) batch = %d%s }
`
	dpRanks, dpGlobal, dpSeed = 2, 8, 5
)

// dpConfig plans a rank with buckets small enough that the model's
// gradients fill several (PyTorch's defaults, 1 and 25 MiB, would put them
// all in one).
var dpConfig = plan.Config{Ranks: dpRanks, FirstBucketBytes: 256, BucketBytes: 1024}

// dpValid are the steps' global batches: a partial last one, in which
// rank 1 has 1 sample of 5.
var dpValid = []int{dpGlobal, dpGlobal, dpGlobal - 3}

// dpCompile compiles the model for the CUDA target: the one-device
// reference at batch 4 with accumulate = 2, or a rank of 2 at batch 8.
func dpCompile(t *testing.T, rank bool) (*trainergen.Compiled, []byte) {
	t.Helper()
	src, cfg := fmt.Sprintf(dpModel, dpGlobal/dpRanks, fmt.Sprintf(" accumulate = %d", dpRanks)), plan.Config{}
	if rank {
		src, cfg = fmt.Sprintf(dpModel, dpGlobal, ""), dpConfig
	}
	res, err := compiler.CompileSource("d.cnn", []byte(src), compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, cfg, driver.CUDA)
	require.NoError(t, err)
	fb, err := trainergen.CompileFatbin(c.Kernels)
	require.NoError(t, err)
	return c, fb
}

// dpBatches are the global batches of the steps.
func dpBatches(sp *trainer.Spec) []trainer.Batch {
	rng := rand.New(rand.NewPCG(7, 8))
	n := sp.H * sp.W * sp.C
	var bs []trainer.Batch
	for _, valid := range dpValid {
		b := trainer.Batch{Valid: valid, Pixels: make([]uint8, valid*n), Labels: make([]int32, valid)}
		for i := range b.Pixels {
			b.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range b.Labels {
			b.Labels[i] = int32(rng.IntN(sp.Classes))
		}
		bs = append(bs, b)
	}
	return bs
}

// dpResult is what a run ends with, as bits: the steps' losses and
// correct counts, the parameters and optimizer state by name.
type dpResult struct {
	Losses   []uint32
	Corrects []int
	Tensors  map[string][]uint32
}

func dpRead(t *testing.T, s *trainer.Session, r *dpResult) {
	t.Helper()
	r.Tensors = map[string][]uint32{}
	for _, ten := range append(append([]trainer.Tensor{}, s.Spec.Params...), s.Spec.State...) {
		v, err := s.ReadTensor(ten)
		require.NoError(t, err)
		bits := make([]uint32, len(v))
		for i, x := range v {
			bits[i] = math.Float32bits(x)
		}
		r.Tensors[ten.Name] = bits
	}
}

// Two ranks, each on its device with the CUDA kernels, summing their
// buckets through NCCL on the all-reduce's stream, train bit for bit as
// one device with accumulate = 2 at the rank's batch: rank r's loss kernel
// computes rows r·4.. of the global batch scaled by 1/8 and rounds its
// share before adding it (__fmul_rn), as micro-batch r of the accumulating
// step does; dropout's masks are keyed by the global batch's elements;
// each weight-gradient kernel writes a rank's partial gradient p_r, which
// the fake libnccl sums in rank order, p0 + p1 — the accumulating step
// adds p1 to the zeroed accumulator's p0, one correctly rounded addition
// either way (on GPUs NVIDIA's NCCL adds two ranks' values the same way,
// whatever its algorithm: x0 + x1 == x1 + x0). So no tolerance: losses,
// correct counts, parameters and momentum are the same bits, the partial
// last batch (rank 1: 1 sample of 5) included.
//
// Under the fake driver each rank's driver calls are traced and checked
// against the plan's bucket windows: every bucket's all-reduce is queued
// on the second stream right after the launch that writes its last
// gradient — before the backward pass's last launch for all but the last
// bucket (overlap) — behind an event the device's stream records; and the
// device's stream waits for the event after the all-reduce right before
// the first launch that reads the bucket (its update), so no update can
// run before its sum has arrived.
func TestDataParallelOnDevices(t *testing.T) {
	nvcc.Require(t)
	env := os.Environ()
	if fakecuda.Dir() != "" {
		dir := t.TempDir()
		require.NoError(t, fakenccl.Build(dir))
		env = append(fakenccl.Environ(dir, env), fmt.Sprintf("%s=%d", fakecuda.DevicesEnv, dpRanks)) // a device per rank
	} else {
		if _, err := nccl.Load(); err != nil {
			t.Skipf("!!! SKIPPING: no NCCL on this GPU machine: %v", err)
		}
		if n, err := cu.NumDevices(); err != nil || n < dpRanks {
			t.Skipf("!!! SKIPPING: %d ranks need %d GPUs (%d, %v)", dpRanks, dpRanks, n, err)
		}
	}
	rank, _ := dpCompile(t, true) // compiled here once: the ranks find nvcc's output cached
	dp := rank.Spec.DataParallel
	require.NotNil(t, dp)
	require.GreaterOrEqual(t, len(dp.Buckets), 3, "the test wants several buckets")
	require.Less(t, dp.Buckets[0].ReadyAfter, dp.ReduceAfter, "the first bucket is complete before the backward pass ends")

	// the reference: one device, accumulate = 2
	one, fb := dpCompile(t, false)
	s, err := trainer.NewSession(one.Spec, open(t, fb), dpSeed)
	require.NoError(t, err)
	var want dpResult
	for _, b := range dpBatches(rank.Spec) {
		loss, correct, err := s.TrainStep(b)
		require.NoError(t, err)
		want.Losses, want.Corrects = append(want.Losses, math.Float32bits(loss)), append(want.Corrects, correct)
	}
	dpRead(t, s, &want)
	require.NoError(t, s.Close())

	dir := t.TempDir()
	// each rank's trace in a file of its own: the fake opens it at the
	// process's first driver call, so the rank's command line sets it
	script := fmt.Sprintf(`%s="$1/trace.$RANK" exec "$2" -test.run='^TestDataParallelRankChild$' -test.v`, fakecuda.TraceEnv)
	var out syncbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	err = dist.Launch(ctx, dist.LaunchOptions{
		Procs: dpRanks, Exe: "/bin/sh", Args: []string{"-c", script, "sh", dir, os.Args[0]},
		Env:    append(env, dpChild+"="+dir, fakenccl.TimeoutEnv+"=120"),
		Stdout: &out, Stderr: &out,
	})
	t.Logf("ranks:\n%s", out.String())
	require.NoError(t, err)
	for r := range dpRanks {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("result.%d", r)))
		require.NoError(t, err)
		var got dpResult
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, want.Losses, got.Losses, "rank %d's losses", r)
		assert.Equal(t, want.Corrects, got.Corrects, "rank %d's correct counts", r)
		require.Len(t, got.Tensors, len(want.Tensors))
		for name, w := range want.Tensors {
			assert.Equal(t, w, got.Tensors[name], "rank %d's %s", r, name)
		}
		if fakecuda.Dir() != "" {
			checkOverlapTrace(t, filepath.Join(dir, fmt.Sprintf("trace.%d", r)), rank.Spec)
		}
	}
}

// checkOverlapTrace checks every step of a rank's driver calls (the
// launches, event records and stream waits, and the rank's marks of its
// all-reduces) against the order the bucket windows give.
func checkOverlapTrace(t *testing.T, path string, sp *trainer.Spec) {
	t.Helper()
	dp := sp.DataParallel
	var want []string
	for i := 0; i <= len(sp.Train.Launches); i++ {
		for k, b := range dp.Buckets {
			if b.ReadyAfter == i {
				// the device's stream records an event, the side stream waits for it, the
				// all-reduce is queued there, the side stream records the bucket's event
				want = append(want, "cuEventRecord", "cuStreamWaitEvent", fmt.Sprintf("%s %d", allReduceMark, k), "cuEventRecord")
			}
		}
		for _, b := range dp.Buckets {
			if b.NeededAt == i {
				want = append(want, "cuStreamWaitEvent") // the device's stream waits for the bucket's event
			}
		}
		if i < len(sp.Train.Launches) {
			want = append(want, "cuLaunchKernel")
		}
	}
	steps := dpTraceSteps(t, path)
	require.Len(t, steps, len(dpValid))
	for s, got := range steps {
		// after the step's launches: the event the host waits for before reusing the step's
		// staging buffer
		assert.Equal(t, append(append([]string{}, want...), "cuEventRecord"), got, "step %d", s)
	}
	// the overlap itself: bucket 0's all-reduce is queued before the backward pass's last
	// launch, and its update waits for it
	first := dp.Buckets[0]
	assert.Less(t, first.ReadyAfter, dp.ReduceAfter)
	at := -1
	for i, c := range want {
		if c == allReduceMark+" 0" {
			at = i
		}
	}
	launches := 0
	for _, c := range want[:at] {
		if c == "cuLaunchKernel" {
			launches++
		}
	}
	assert.Equal(t, first.ReadyAfter, launches, "bucket 0's all-reduce is queued right after launch %d", first.ReadyAfter-1)
}

const (
	allReduceMark = "# all-reduce"
	dpStepMark    = "# dp step"
)

// dpTraceSteps cuts a rank's trace at its step marks and keeps the calls
// that order the step.
func dpTraceSteps(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var steps [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, dpStepMark):
			steps = append(steps, []string{})
		case line == "# end":
			return steps
		case len(steps) > 0 && (line == "cuLaunchKernel" || line == "cuEventRecord" || line == "cuStreamWaitEvent" || strings.HasPrefix(line, allReduceMark)):
			steps[len(steps)-1] = append(steps[len(steps)-1], line)
		}
	}
	require.NoError(t, sc.Err())
	return steps
}

// markingReducer is a rank's nccl.Reducer that marks each all-reduce in
// the trace as it queues it (on the device's thread, between its driver
// calls).
type markingReducer struct {
	nccl.Reducer
	trace   *os.File
	buckets int
	calls   int
}

func (m *markingReducer) AllReduceOn(stream uintptr, p device.Ptr, count int) error {
	if m.trace != nil {
		if _, err := fmt.Fprintf(m.trace, "%s %d\n", allReduceMark, m.calls%m.buckets); err != nil {
			return err
		}
	}
	m.calls++
	return m.Reducer.AllReduceOn(stream, p, count)
}

// joinJob makes this process rank cfg.Rank of a job under the fake NCCL: the rendezvous (the
// unique id from rank 0), then the communicator, created on the device's thread. leave
// destroys the communicator and closes the rendezvous; call it before closing the device.
func joinJob(t *testing.T, d *cuda.Device, cfg dist.Config) (comm *nccl.Comm, leave func()) {
	t.Helper()
	lib, err := nccl.Load()
	require.NoError(t, err)
	rv, err := dist.Rendezvous(context.Background(), cfg, func() ([]byte, error) {
		id, err := lib.UniqueID()
		return id[:], err
	}, time.Minute)
	require.NoError(t, err)
	var id nccl.UniqueID
	copy(id[:], rv.ID)
	if err := d.OnStream(func(uintptr) error {
		comm, err = lib.CommInitRank(id, cfg.WorldSize, cfg.Rank)
		return err
	}); err != nil {
		rv.Close()
		require.NoError(t, err)
	}
	return comm, func() {
		comm.Destroy()
		rv.Close()
	}
}

// TestDataParallelRankChild is one rank of TestDataParallelOnDevices.
func TestDataParallelRankChild(t *testing.T) {
	dir := os.Getenv(dpChild)
	if dir == "" {
		t.Skip("run by TestDataParallelOnDevices")
	}
	cfg, _, err := dist.FromEnv(os.Getenv)
	require.NoError(t, err)
	c, fb := dpCompile(t, true)
	d, err := cuda.New(fb) // GPU LOCAL_RANK
	require.NoError(t, err)
	defer d.Close()
	s, err := trainer.NewSession(c.Spec, d, dpSeed)
	require.NoError(t, err)
	defer s.Close()

	comm, leave := joinJob(t, d, cfg)
	defer leave()
	red := &markingReducer{Reducer: nccl.Reducer{Comm: comm}, buckets: len(c.Spec.DataParallel.Buckets)}
	if path := os.Getenv(fakecuda.TraceEnv); path != "" {
		red.trace, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		defer red.trace.Close()
	}
	require.NoError(t, s.SetParallel(cfg.Rank, red))

	share := c.Spec.Batch
	var res dpResult
	for step, b := range dpBatches(c.Spec) {
		n := len(b.Pixels) / b.Valid
		lo, hi := min(cfg.Rank*share, b.Valid), min((cfg.Rank+1)*share, b.Valid)
		part := trainer.Batch{Valid: hi - lo, GlobalValid: b.Valid, Pixels: b.Pixels[lo*n : hi*n], Labels: b.Labels[lo:hi]}
		if red.trace != nil {
			_, err := fmt.Fprintf(red.trace, "%s %d\n", dpStepMark, step)
			require.NoError(t, err)
		}
		loss, correct, err := s.TrainStep(part)
		require.NoError(t, err)
		res.Losses, res.Corrects = append(res.Losses, math.Float32bits(loss)), append(res.Corrects, correct)
	}
	if red.trace != nil {
		_, err := fmt.Fprintln(red.trace, "# end")
		require.NoError(t, err)
	}
	dpRead(t, s, &res)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("result.%d", cfg.Rank)), b, 0o644))
	fmt.Println("RANK DONE")
}
