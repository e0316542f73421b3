package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
)

// userProgram trains a `cnnc gen` package for a few steps on fixed batches
// and prints the device and the losses.
const userProgram = `package main

import (
	"fmt"
	"os"

	"example.com/user/mnistnet"
)

func main() {
	m, err := mnistnet.New(mnistnet.Options{Seed: 3, Device: os.Args[1]})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer m.Close()
	fmt.Println("device:", m.Device())
	n := mnistnet.Height * mnistnet.Width * mnistnet.Channels
	for step := 0; step < 4; step++ {
		valid := mnistnet.BatchSize
		if step == 3 {
			valid -= 3 // a partial batch
		}
		b := mnistnet.Batch{Pixels: make([]uint8, valid*n), Labels: make([]int32, valid), Valid: valid}
		for i := range b.Pixels {
			b.Pixels[i] = uint8((i*7 + step*13) % 251)
		}
		for i := range b.Labels {
			b.Labels[i] = int32((i + step) % mnistnet.Classes)
		}
		loss, _, err := m.Step(b)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("loss %d: %.9g\n", step, loss)
	}
}
`

// A package from `cnnc gen --cuda` in a user's module: built without tags it
// trains on the CPU and never links the CUDA driver; built with -tags cuda
// it trains on the GPU — here the fake driver's — with the same losses.
func TestGenCUDAPackage(t *testing.T) {
	nvcc.Require(t)
	if testing.Short() {
		t.Skip("builds a user module twice")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	fake := t.TempDir()
	require.NoError(t, fakecuda.Build(fake))
	t.Setenv(fakecuda.Env, fake) // cnnc gen --cuda registers the fatbin's kernels with the fake

	proj := t.TempDir()
	code, out, errOut := cnnc("gen", "../../examples/mnist.cnn", "-o", filepath.Join(proj, "mnistnet"), "--cuda", "--batch", "16")
	require.Equal(t, 0, code, "%s\n%s", out, errOut)
	assert.Contains(t, out, "cuda.go cuda_emu.h kernels.cu kernels.fatbin kernels_cpu.cc kernels_cpu.go model.go spec.go")
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(proj, "go.sum"), sum, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(proj, "go.mod"), []byte("module example.com/user\n\ngo 1.26\n\nrequire github.com/cnnc/cnnc v0.0.0\n\nreplace github.com/cnnc/cnnc => "+root+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(proj, "main.go"), []byte(userProgram), 0o644))

	goIn := func(args ...string) {
		cmd := exec.Command("go", args...)
		cmd.Dir = proj
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %v\n%s", args, b)
	}
	goIn("mod", "tidy")
	goIn("build", "-o", "user-cpu", ".")
	goIn("build", "-tags", "cuda", "-o", "user-cuda", ".")
	deps, err := exec.Command("go", "version", "-m", filepath.Join(proj, "user-cpu")).Output()
	require.NoError(t, err)
	assert.NotContains(t, string(deps), "gorgonia.org/cu", "an untagged build links no CUDA driver")

	run := func(bin, device string, env []string) (string, bool) {
		cmd := exec.Command(filepath.Join(proj, bin), device)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		return string(b), err == nil
	}
	losses := func(s string) string {
		var ls []string
		for _, line := range strings.Split(s, "\n") {
			if strings.HasPrefix(line, "loss ") {
				ls = append(ls, line)
			}
		}
		return strings.Join(ls, "\n")
	}
	cpuOut, ok := run("user-cpu", "auto", os.Environ())
	require.True(t, ok, cpuOut)
	assert.Contains(t, cpuOut, "device: cpu")
	require.Len(t, strings.Split(losses(cpuOut), "\n"), 4, cpuOut)

	env := fakecuda.Environ(fake, os.Environ())
	gpuOut, ok := run("user-cuda", "auto", env)
	require.True(t, ok, gpuOut)
	assert.Contains(t, gpuOut, "device: cnnc fake CUDA device")
	assert.Equal(t, losses(cpuOut), losses(gpuOut), "the GPU build trains as the CPU one")
	out2, ok := run("user-cuda", "cpu", env)
	require.True(t, ok, out2)
	assert.Contains(t, out2, "device: cpu")

	out3, ok := run("user-cpu", "cuda", os.Environ())
	assert.False(t, ok)
	assert.Contains(t, out3, `MNISTNet: Options.Device "cuda": this program was built without it`)
	out4, ok := run("user-cpu", "tpu", os.Environ())
	assert.False(t, ok)
	assert.Contains(t, out4, `MNISTNet: Options.Device "tpu": want auto, cpu or cuda`)
}
