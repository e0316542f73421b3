package trainergen_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// requireTorch returns Debian's python3 when it has PyTorch; without it the
// test is skipped loudly, or fails with CNNC_REQUIRE_TORCH=1 (CI).
func requireTorch(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		if os.Getenv("CNNC_REQUIRE_TORCH") == "1" {
			t.Fatalf("CNNC_REQUIRE_TORCH=1 but %s cannot import torch: %v (apt-get install python3-torch)", py, err)
		}
		t.Skipf("!!! SKIPPING %s: %s cannot import torch (apt-get install python3-torch)", t.Name(), py)
	}
	return py
}

// A cnnc checkpoint loads into the same model written for PyTorch with
// load_state_dict(strict=True) — the OOM guide's SimpleCNN (pools added),
// and MNISTNet; PyTorch then computes cnnc's loss on a batch, and steps of
// the torch.optim optimizer the checkpoint names (SGD with momentum,
// Nesterov and weight decay; Adam with L2; AdamW) give the parameters
// cnnc's steps give: names, shapes, layouts (OIHW, out x in, flatten
// order) and optimizers agree with PyTorch's.
func TestCheckpointInPyTorch(t *testing.T) {
	py := requireTorch(t)
	mnist, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	withOptimizer := func(opt string) []byte {
		src := strings.Replace(string(mnist), "optimizer = sgd(lr=0.05, momentum=0.9)", "optimizer = "+opt, 1)
		require.NotEqual(t, string(mnist), src)
		return []byte(src)
	}
	simplecnn, err := os.ReadFile("../../examples/simplecnn.cnn")
	require.NoError(t, err)
	for _, tc := range []struct {
		name, model string
		src         []byte
		n, steps    int
	}{
		{"simplecnn sgd", "simplecnn", simplecnn, 3, 1},
		{"mnist sgd nesterov", "mnist", withOptimizer("sgd(lr=0.05, momentum=0.9, nesterov=true, weight_decay=0.001)"), 8, 3},
		{"mnist adam", "mnist", withOptimizer("adam(lr=0.01, weight_decay=0.01)"), 8, 3},
		{"mnist adamw", "mnist", withOptimizer("adamw(lr=0.01, betas=[0.8, 0.99], eps=1e-6)"), 8, 3},
	} {
		t.Run(tc.name, func(t *testing.T) { agreesWithPyTorch(t, py, tc.model, tc.src, tc.n, tc.steps) })
	}
}

func agreesWithPyTorch(t *testing.T, py, model string, src []byte, n, steps int) {
	res, err := compiler.CompileSource(model+".cnn", src, compiler.Options{Batch: int64(n)})
	require.NoError(t, err)
	c, err := trainergen.Compile(res, 0, "")
	require.NoError(t, err)
	s := newSession(t, c, 5)
	rng := rand.New(rand.NewPCG(11, 12))
	sp := c.Spec
	b := trainer.Batch{Valid: n, Pixels: make([]uint8, n*sp.H*sp.W*sp.C), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	lb := make([]byte, 4*n)
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(sp.Classes))
		binary.LittleEndian.PutUint32(lb[4*i:], uint32(b.Labels[i]))
	}
	dir := t.TempDir()
	ck, px, lbl, out := filepath.Join(dir, "ck.safetensors"), filepath.Join(dir, "px"), filepath.Join(dir, "lb"), filepath.Join(dir, "torch.safetensors")
	require.NoError(t, s.Save(ck, nil))
	require.NoError(t, os.WriteFile(px, b.Pixels, 0o644))
	require.NoError(t, os.WriteFile(lbl, lb, 0o644))

	cmd := exec.Command(py, filepath.Join(moduleRoot(t), "scripts/torch_checkpoint.py"), model, ck, px, lbl, fmt.Sprint(n), fmt.Sprint(steps), out)
	outb, err := cmd.CombinedOutput()
	require.NoError(t, err, string(outb))
	var torch struct {
		Loss      float64 `json:"loss"`
		Correct   int     `json:"correct"`
		Optimizer string  `json:"optimizer"`
		Version   string  `json:"torch"`
	}
	require.NoError(t, json.Unmarshal(outb, &torch), string(outb))
	loss, correct, err := s.EvalBatch(b)
	require.NoError(t, err)
	t.Logf("PyTorch %s, %s: loss %.6f (cnnc %.6f), correct %d (cnnc %d)", torch.Version, torch.Optimizer, torch.Loss, loss, torch.Correct, correct)
	assert.InEpsilon(t, torch.Loss, loss, 1e-5)
	assert.Equal(t, torch.Correct, correct)

	for range steps {
		_, _, err = s.TrainStep(b)
		require.NoError(t, err)
	}
	f, err := checkpoint.Read(out)
	require.NoError(t, err)
	require.Len(t, f.Tensors, len(sp.Params))

	f64, err := checkpoint.Read(out + ".f64")
	require.NoError(t, err)
	before, err := checkpoint.Read(ck)
	require.NoError(t, err)
	// against the float64 run: cnnc's float32 error is no larger than
	// twice PyTorch's float32 error (or negligible)
	for _, p := range sp.Params {
		read := func(f *checkpoint.File) []float32 {
			v, err := f.Expect(p.Name, checkpoint.F32, p.Shape)
			require.NoError(t, err)
			return v.Float32s()
		}
		truth, torch32, init := read(f64), read(f), read(before)
		got, err := s.ReadTensor(p)
		require.NoError(t, err)
		var scale, maxCnnc, moved, sqCnnc, sqTorch float64
		for i, v := range truth {
			dc, dt := float64(got[i])-float64(v), float64(torch32[i])-float64(v)
			scale = math.Max(scale, math.Abs(float64(v)))
			maxCnnc = math.Max(maxCnnc, math.Abs(dc))
			moved = math.Max(moved, math.Abs(float64(v)-float64(init[i])))
			sqCnnc += dc * dc
			sqTorch += dt * dt
		}
		rmsCnnc, rmsTorch := math.Sqrt(sqCnnc/float64(len(truth))), math.Sqrt(sqTorch/float64(len(truth)))
		t.Logf("%s: %d steps moved it by up to %.2e; from the float64 run, cnnc differs by %.2e RMS (%.2e at most), PyTorch float32 by %.2e RMS (largest value %.2e)",
			p.Name, steps, moved, rmsCnnc, maxCnnc, rmsTorch, scale)
		// float32 rounding, which Adam amplifies where gradients are tiny,
		// is all that may separate them: no element strays by a visible
		// fraction of the update, and on average cnnc is about as close to
		// the truth as PyTorch itself
		assert.Less(t, maxCnnc, 1e-3*moved, "%s: an element differs by a visible fraction of the update", p.Name)
		assert.LessOrEqual(t, rmsCnnc, math.Max(2*rmsTorch, 1e-8*scale), "%s: cnnc's float32 error", p.Name)
	}
}
