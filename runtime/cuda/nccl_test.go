//go:build cuda

package cuda_test

// NCCL on the device's stream: ranks are processes of this test binary, each with its Device,
// joined by runtime/dist (launcher, TCP rendezvous) and runtime/nccl. Under the fake driver
// (make test-fakecuda) NCCL is the fake libnccl, built here, reading and writing the fake
// driver's device memory through its copies; on GPUs it is NVIDIA's NCCL, one rank per GPU.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/cu"

	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/fakenccl"
	"github.com/cnnc/cnnc/internal/syncbuf"
	"github.com/cnnc/cnnc/runtime/cuda"
	"github.com/cnnc/cnnc/runtime/dist"
	"github.com/cnnc/cnnc/runtime/nccl"
)

const (
	ncclChild     = "CNNC_CUDA_TEST_NCCL_CHILD" // the directory the ranks write to
	ncclFatbinEnv = "CNNC_CUDA_TEST_FATBIN"
)

// ncclCases are the all-reduces of every rank: float32 across two of the fake's 1 MiB chunks,
// and bfloat16.
var ncclCases = []struct {
	name  string
	t     nccl.DataType
	count int
}{{"f32", nccl.Float32, 300_001}, {"bf16", nccl.Bfloat16, 1001}}

// ncclInput is rank r's buffer of case k: both signs, magnitudes 2^-8..2^8.
func ncclInput(k, r int) []byte {
	c := ncclCases[k]
	b := make([]byte, c.count*c.t.Size())
	for i := range c.count {
		v := float32(math.Ldexp(1+float64((i*7919+r*104729+k*31)%1000)/1000, (i+3*r)%17-8))
		if (i+r)%3 == 0 {
			v = -v
		}
		if c.t == nccl.Bfloat16 {
			binary.LittleEndian.PutUint16(b[2*i:], fakenccl.Bfloat16(v))
		} else {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	}
	return b
}

// TestNCCLRankChild is one rank of TestNCCLOnDevices.
func TestNCCLRankChild(t *testing.T) {
	out := os.Getenv(ncclChild)
	if out == "" {
		t.Skip("run by TestNCCLOnDevices")
	}
	cfg, _, err := dist.FromEnv(os.Getenv)
	require.NoError(t, err)
	lib, err := nccl.Load()
	require.NoError(t, err)
	fb, err := os.ReadFile(os.Getenv(ncclFatbinEnv))
	require.NoError(t, err)
	ordinal := cfg.LocalRank
	if fakecuda.Dir() != "" {
		ordinal = 0 // the fake driver has one device, which every process has to itself
	}
	d, err := cuda.NewWithOptions(fb, cuda.Options{Ordinal: ordinal})
	require.NoError(t, err)
	defer d.Close()
	s, err := dist.Rendezvous(context.Background(), cfg, func() ([]byte, error) {
		id, err := lib.UniqueID()
		return id[:], err
	}, time.Minute)
	require.NoError(t, err)
	defer s.Close()
	var id nccl.UniqueID
	copy(id[:], s.ID)

	if fakecuda.Dir() != "" {
		// off the device's thread no context is current: NCCL cannot tell which device is meant
		_, err := lib.CommInitRank(id, cfg.WorldSize, cfg.Rank)
		require.ErrorContains(t, err, "no CUDA context is current on the thread calling NCCL")
	}
	var comm *nccl.Comm
	require.NoError(t, d.OnStream(func(uintptr) error {
		var err error
		comm, err = lib.CommInitRank(id, cfg.WorldSize, cfg.Rank)
		return err
	}))
	for k, c := range ncclCases {
		in := ncclInput(k, cfg.Rank)
		send, err := d.Alloc(int64(len(in)))
		require.NoError(t, err)
		recv, err := d.Alloc(int64(len(in)))
		require.NoError(t, err)
		require.NoError(t, d.CopyIn(send, in))
		require.NoError(t, d.OnStream(func(stream uintptr) error {
			return comm.AllReduce(uintptr(send), uintptr(recv), c.count, c.t, nccl.Sum, stream)
		}))
		require.NoError(t, d.Sync())
		got := make([]byte, len(in))
		require.NoError(t, d.CopyOut(got, recv))
		require.NoError(t, os.WriteFile(filepath.Join(out, fmt.Sprintf("%s.rank%d", c.name, cfg.Rank)), got, 0o644))
		require.NoError(t, d.Free(send))
		require.NoError(t, d.Free(recv))
	}
	if fakecuda.Dir() != "" {
		// a buffer past its allocation is caught by the driver's copy, as a GPU would fault
		p, err := d.Alloc(64)
		require.NoError(t, err)
		err = d.OnStream(func(stream uintptr) error {
			return comm.AllReduce(uintptr(p), uintptr(p), 1000, nccl.Float32, nccl.Sum, stream)
		})
		assert.ErrorContains(t, err, "cuMemcpyDtoH of the send buffer: CUDA_ERROR_INVALID_VALUE")
	}
	require.NoError(t, d.OnStream(func(uintptr) error { return comm.Abort() }))
	fmt.Println("RANK DONE")
}

// Two ranks (under the fake driver; on GPUs as many as there are, up to 2) sum buffers in
// device memory on their devices' streams: the sums are the sums in rank order, bit for bit, on
// every rank. With at most 2 ranks that holds for NVIDIA's NCCL too, whatever its algorithm: one
// correctly rounded addition, x0 + x1 == x1 + x0 (bfloat16 too: NCCL adds with __hadd).
func TestNCCLOnDevices(t *testing.T) {
	fb := testFatbin(t)
	n, env := 2, os.Environ()
	if fakecuda.Dir() != "" {
		dir := t.TempDir()
		require.NoError(t, fakenccl.Build(dir))
		env = fakenccl.Environ(dir, env)
	} else {
		if _, err := nccl.Load(); err != nil {
			t.Skipf("!!! SKIPPING: no NCCL on this GPU machine: %v", err)
		}
		gpus, err := cu.NumDevices()
		require.NoError(t, err)
		n = min(gpus, 2)
	}
	dir := t.TempDir()
	fbFile := filepath.Join(dir, "kernels.fatbin")
	require.NoError(t, os.WriteFile(fbFile, fb, 0o644))
	var out syncbuf.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := dist.Launch(ctx, dist.LaunchOptions{
		Procs: n, Exe: os.Args[0], Args: []string{"-test.run=^TestNCCLRankChild$", "-test.v"},
		Env:    append(env, ncclChild+"="+dir, ncclFatbinEnv+"="+fbFile, fakenccl.TimeoutEnv+"=60"),
		Stdout: &out, Stderr: &out,
	})
	t.Logf("ranks:\n%s", out.String())
	require.NoError(t, err)
	assert.Equal(t, n, strings.Count(out.String(), "RANK DONE"))
	for k, c := range ncclCases {
		inputs := make([][]byte, n)
		for r := range n {
			inputs[r] = ncclInput(k, r)
		}
		want := fakenccl.SumFloat32(inputs, false)
		if c.t == nccl.Bfloat16 {
			want = fakenccl.SumBfloat16(inputs, false)
		}
		for r := range n {
			got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%s.rank%d", c.name, r)))
			require.NoError(t, err)
			assert.True(t, string(want) == string(got), "%s: rank %d's sum is not the sum in rank order", c.name, r)
		}
	}
}
