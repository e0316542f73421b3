package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// forbiddenDeps are what a program embedding a model must not carry: a
// plotting stack, a progress bar, a command-line library.
var forbiddenDeps = []string{"gonum.org/v1/plot", "codeberg.org/go-latex", "codeberg.org/go-pdf/fpdf", "github.com/go-latex",
	"github.com/go-pdf/fpdf", "github.com/schollz/progressbar", "github.com/spf13/cobra", "github.com/spf13/pflag"}

func forbidden(deps string) []string {
	var found []string
	for _, dep := range strings.Fields(deps) {
		for _, f := range forbiddenDeps {
			if strings.HasPrefix(dep, f) {
				found = append(found, dep)
			}
		}
	}
	return found
}

// The generated package is a library: its dependencies are cnnc's runtime
// core, data loading and checkpoints, none of the trainers' command line
// (runtime/trainer/cli), whose dependencies show that the check can fail.
func TestGeneratedPackageHasNoCLIDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./mnistnet").Output()
	require.NoError(t, err)
	assert.Empty(t, forbidden(string(out)), "a CLI or plotting package reaches the generated package")
	assert.NotContains(t, string(out), "github.com/cnnc/cnnc/runtime/trainer/cli")
	t.Logf("go list -deps ./examples/gogenerate/mnistnet: %d packages", len(strings.Fields(string(out))))
	out, err = exec.Command("go", "list", "-deps", "github.com/cnnc/cnnc/runtime/trainer/cli").Output()
	require.NoError(t, err)
	assert.NotEmpty(t, forbidden(string(out)), "the trainers' command line does link them")
}

// The package's kernels are the CPU target's (cnnc gen's default, as cnnc
// build's), compiled into the program (cgo), so it needs no C++ compiler
// when it runs.
func TestGeneratedPackageRunsBuiltInKernels(t *testing.T) {
	m, err := mnistnet.New(mnistnet.Options{Seed: 1, Device: "cpu"})
	require.NoError(t, err)
	defer m.Close()
	assert.Regexp(t, `^cpu \((SSE2|AVX2\+FMA), \d+ threads, kernels built in\)$`, m.Device())
	assert.NotContains(t, m.Device(), "emulator")
}

// The generated API trains: the loss falls, Save/Load round-trips through
// a buffer, Predict agrees with Evaluate's correct count.
func TestGeneratedPackageTrains(t *testing.T) {
	dir, err := datasets.MNISTDir()
	require.NoError(t, err)
	train, err := data.LoadMNIST(dir, "train")
	require.NoError(t, err)
	var losses []float32
	m, err := mnistnet.New(mnistnet.Options{Seed: 1, MaxSteps: 60, OnStep: func(s mnistnet.StepMetrics) { losses = append(losses, s.Loss) }})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Train(context.Background(), train))
	require.Len(t, losses, 60)
	mean := func(xs []float32) (s float32) {
		for _, x := range xs {
			s += x / float32(len(xs))
		}
		return s
	}
	assert.Less(t, mean(losses[50:]), mean(losses[:10])*0.7, "loss falls: first 10 steps %.3f, last 10 %.3f", mean(losses[:10]), mean(losses[50:]))
	assert.Equal(t, int64(60), m.Steps())

	var ck bytes.Buffer
	require.NoError(t, m.Save(&ck))
	m2, err := mnistnet.New(mnistnet.Options{Seed: 2})
	require.NoError(t, err)
	defer m2.Close()
	require.NoError(t, m2.Load(bytes.NewReader(ck.Bytes())))
	b := batch(train, 0)
	l1, c1, err := m.EvaluateBatch(b)
	require.NoError(t, err)
	l2, c2, err := m2.EvaluateBatch(b)
	require.NoError(t, err)
	assert.Equal(t, l1, l2)
	assert.Equal(t, c1, c2)
	assert.Equal(t, int64(60), m2.Steps())

	top, err := m2.Predict(b.Pixels, 1)
	require.NoError(t, err)
	right := 0
	for i, p := range top {
		if int32(p[0].Class) == b.Labels[i] {
			right++
		}
	}
	assert.Equal(t, c2, right, "Predict's top class is what Evaluate counts as correct")
}

// batch takes BatchSize consecutive samples from first.
func batch(ds *data.MNIST, first int) mnistnet.Batch {
	b := mnistnet.Batch{Valid: mnistnet.BatchSize}
	for i := 0; i < mnistnet.BatchSize; i++ {
		b.Pixels = append(b.Pixels, ds.Images.Image(first+i)...)
		b.Labels = append(b.Labels, int32(ds.Labels[first+i]))
	}
	return b
}

// Train MNISTNet for 30 steps through the generated package, save it to a
// buffer, load it into a second model, and ask both for the first test
// digit's three most probable classes.
func Example() {
	dir, err := datasets.MNISTDir() // the GoMNIST module's copy of MNIST
	if err != nil {
		fmt.Println(err)
		return
	}
	train, _ := data.LoadMNIST(dir, "train")
	test, _ := data.LoadMNIST(dir, "t10k")
	m, err := mnistnet.New(mnistnet.Options{Seed: 1, MaxSteps: 30})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	if err := m.Train(context.Background(), train); err != nil {
		fmt.Println(err)
		return
	}
	var saved bytes.Buffer
	if err := m.Save(&saved); err != nil {
		fmt.Println(err)
		return
	}
	again, _ := mnistnet.New(mnistnet.Options{})
	defer again.Close()
	if err := again.Load(&saved); err != nil {
		fmt.Println(err)
		return
	}
	a, _ := m.Predict(test.Images.Image(0), 3)
	b, _ := again.Predict(test.Images.Image(0), 3)
	fmt.Println("steps:", m.Steps(), again.Steps())
	fmt.Println("classes:", len(a[0]), "the same after Load:", fmt.Sprint(a) == fmt.Sprint(b))
	// Output:
	// steps: 30 30
	// classes: 3 the same after Load: true
}
