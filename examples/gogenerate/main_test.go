package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/examples/gogenerate/mnistnet"
	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
)

// The checked-in package is what `go generate` writes today.
func TestGeneratedPackageIsUpToDate(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command("go", "run", "../../cmd/cnnc", "gen", "../mnist.cnn", "-o", dir, "-pkg", "mnistnet", "--batch", "32").CombinedOutput()
	require.NoError(t, err, string(out))
	names := func(dir string) []string {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	require.Equal(t, names(dir), names("mnistnet"), "run go generate ./examples/gogenerate")
	for _, name := range names(dir) {
		want, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join("mnistnet", name))
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "mnistnet/%s is stale: run go generate ./examples/gogenerate", name)
	}
}

// The package's kernels are compiled into the program (cgo), so it needs
// no C++ compiler when it runs.
func TestGeneratedPackageRunsBuiltInKernels(t *testing.T) {
	m, err := mnistnet.New(mnistnet.Options{Seed: 1, Device: "cpu"})
	require.NoError(t, err)
	defer m.Close()
	assert.Equal(t, "cpu (CUDA emulator, kernels built in)", m.Device())
}

// The generated API trains: the loss falls, Save/Load round-trips.
func TestGeneratedPackageTrains(t *testing.T) {
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	train, err := data.LoadMNIST(dir, "train")
	require.NoError(t, err)
	m, err := mnistnet.New(mnistnet.Options{Seed: 1})
	require.NoError(t, err)
	defer m.Close()
	var first, last float32
	for s := 0; s < 60; s++ {
		loss, _, err := m.TrainStep(batch(train, s*mnistnet.BatchSize))
		require.NoError(t, err)
		if s < 10 {
			first += loss / 10
		}
		if s >= 50 {
			last += loss / 10
		}
	}
	assert.Less(t, last, first*0.7, "loss falls: first 10 steps %.3f, last 10 %.3f", first, last)
	assert.Equal(t, int64(60), m.Steps())

	ck := filepath.Join(t.TempDir(), "m.safetensors")
	require.NoError(t, m.Save(ck))
	m2, err := mnistnet.New(mnistnet.Options{Seed: 2})
	require.NoError(t, err)
	defer m2.Close()
	require.NoError(t, m2.Load(ck))
	b := batch(train, 0)
	l1, c1, err := m.Evaluate(b)
	require.NoError(t, err)
	l2, c2, err := m2.Evaluate(b)
	require.NoError(t, err)
	assert.Equal(t, l1, l2)
	assert.Equal(t, c1, c2)
	assert.Equal(t, int64(60), m2.Steps())
}
