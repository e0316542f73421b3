package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/checkpoint"
)

// A trainer built with --target cuda, run without a GPU under the fake
// driver (internal/fakecuda: the real binary, gorgonia.org/cu, the cgo shim
// and the embedded fatbin's kernels run on the CPU emulator): its CUDA
// device — planned arena, launches, the step replayed as a CUDA graph from
// the second step — trains exactly as its CPU device does, and an arena
// that does not fit the device stops it before training with both numbers.
func TestCUDATrainerUnderFakeDriver(t *testing.T) {
	nvcc.Require(t)
	if testing.Short() {
		t.Skip("builds a CUDA trainer")
	}
	mnist, err := datasets.MNISTDir()
	require.NoError(t, err)
	model := "../../examples/mnist.cnn" // relative: the same generated source in every checkout (see built)
	fake := t.TempDir()
	require.NoError(t, fakecuda.Build(fake))
	t.Setenv(fakecuda.Env, fake) // cnnc build registers the fatbin's kernels with the fake

	dir := t.TempDir()
	bin := filepath.Join(dir, "mnist-cuda")
	code, out, errOut := cnnc("build", model, "-o", bin, "--target", "cuda", "--batch", "32")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	env := fakecuda.Environ(fake, os.Environ())

	runLogged := func(name string, args ...string) (string, []float64) {
		log := filepath.Join(dir, name+".jsonl")
		ck := filepath.Join(dir, name+".safetensors")
		cmd := exec.Command(bin, append([]string{"--data", mnist, "--test", "", "--max-steps", "5", "--batch", "32",
			"--quiet", "--log", log, "--checkpoint", ck}, args...)...)
		cmd.Env = env
		var o bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &o
		require.NoError(t, cmd.Run(), o.String())
		f, err := os.Open(log)
		require.NoError(t, err)
		defer f.Close()
		var losses []float64
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var rec map[string]any
			require.NoError(t, json.Unmarshal(sc.Bytes(), &rec))
			if l, ok := rec["loss"].(float64); ok && rec["step"] != nil {
				losses = append(losses, l)
			}
		}
		return o.String(), losses
	}
	cudaOut, cudaLoss := runLogged("cuda", "--device", "cuda")
	t.Log(cudaOut)
	assert.Contains(t, cudaOut, "cnnc fake CUDA device (CPU emulator)")
	assert.Contains(t, cudaOut, "device memory:")
	assert.NotContains(t, cudaOut, "warning")
	_, plainLoss := runLogged("cuda-plain", "--device", "cuda", "--cuda-graph=false")
	_, cpuLoss := runLogged("cpu", "--device", "cpu")
	require.Len(t, cpuLoss, 5)
	assert.Equal(t, cpuLoss, cudaLoss, "CUDA device with graphs vs CPU device")
	assert.Equal(t, cpuLoss, plainLoss, "CUDA device launching kernel by kernel vs CPU device")
	// 3 steps, then --resume for 2 more: the graph is captured again in
	// the resumed run, its step-dependent arguments from the checkpoint
	_, first := runLogged("part", "--device", "cuda", "--max-steps", "3")
	_, rest := runLogged("resumed", "--device", "cuda", "--max-steps", "5", "--resume", filepath.Join(dir, "part.safetensors")) // 5 in all
	assert.Equal(t, cpuLoss, append(first, rest...), "3 steps and 2 resumed vs 5 on the CPU")
	sameTensors := func(x, y string) {
		a, err := checkpoint.Read(filepath.Join(dir, x+".safetensors"))
		require.NoError(t, err)
		b, err := checkpoint.Read(filepath.Join(dir, y+".safetensors"))
		require.NoError(t, err)
		require.Equal(t, len(b.Tensors), len(a.Tensors))
		for i := range b.Tensors {
			assert.Equal(t, b.Tensors[i].Name, a.Tensors[i].Name)
			assert.Equal(t, b.Tensors[i].Data, a.Tensors[i].Data, "%s vs %s: %s", x, y, b.Tensors[i].Name)
		}
	}
	sameTensors("cuda", "cpu")
	sameTensors("resumed", "cpu")

	// a GPU that cannot load the kernels (the fake has no library for this
	// fatbin): --device auto warns and trains on the CPU emulator, --device
	// cuda stops, naming what failed
	bare := t.TempDir()
	require.NoError(t, fakecuda.Build(bare))
	cmd := exec.Command(bin, "--bench", "1")
	cmd.Env = fakecuda.Environ(bare, os.Environ())
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, string(o))
	assert.Contains(t, string(o), "warning: no CUDA device (cuda: loading the kernels")
	assert.Contains(t, string(o), "bench: MNISTNet on cpu")
	cmd = exec.Command(bin, "--bench", "1", "--device", "cuda")
	cmd.Env = fakecuda.Environ(bare, os.Environ())
	o, err = cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(o), "InvalidImage")
	assert.Contains(t, string(o), "cnnc compiles for sm_80 and sm_90")

	// no GPU: the driver cannot start, and the trainer says what to do
	// before gorgonia.org/cu's init would exit with a bare message
	cmd = exec.Command(bin, "--bench", "1")
	cmd.Env = append(env, "CNNC_FAKECUDA_NODEVICE=1")
	o, err = cmd.CombinedOutput()
	require.Error(t, err, string(o))
	assert.Contains(t, string(o), "mnist-cuda: this program was built for NVIDIA GPUs")
	assert.Contains(t, string(o), "cuInit: CUDA_ERROR_NO_DEVICE (100: no CUDA-capable device is detected)")
	assert.NotContains(t, string(o), "Error in initialization")
	// --help and --version need no device: answered before the driver starts
	for _, arg := range []string{"-h", "--version"} {
		cmd = exec.Command(bin, arg)
		cmd.Env = append(env, "CNNC_FAKECUDA_NODEVICE=1")
		o, err = cmd.CombinedOutput()
		require.NoError(t, err, "%s: %s", arg, o)
		assert.NotContains(t, string(o), "cuInit")
	}
	assert.Contains(t, string(o), "trainer of model MNISTNet")
	cmd = exec.Command(bin, "--log", "-h", "--bench", "1") // -h is --log's value here
	cmd.Env = append(env, "CNNC_FAKECUDA_NODEVICE=1")
	o, _ = cmd.CombinedOutput()
	assert.Contains(t, string(o), "cuInit: CUDA_ERROR_NO_DEVICE")

	// a device with less memory than the plan: stop at start, both numbers
	cmd = exec.Command(bin, "--bench", "1", "--device", "cuda")
	cmd.Env = append(env, fakecuda.MemoryEnv+"=1000000")
	o, err = cmd.CombinedOutput()
	require.Error(t, err, string(o))
	t.Log(string(o))
	assert.Contains(t, string(o), "1000000")
	assert.Contains(t, string(o), "memory plan needs 1.23 MB (1227012 bytes)")
	assert.Contains(t, string(o), "rebuild it to fit: cnnc build --memory-budget 1000000B")
}
