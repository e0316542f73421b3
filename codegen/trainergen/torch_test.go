package trainergen_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// A checkpoint of examples/simplecnn.cnn loads into the OOM guide's
// SimpleCNN (pools added) with PyTorch's load_state_dict(strict=True);
// PyTorch then computes the same loss on a batch as cnnc, and one
// torch.optim.SGD step gives the parameters cnnc's step gives: names,
// shapes, layouts (OIHW, out x in, flatten order) and the optimizer agree.
func TestCheckpointInPyTorch(t *testing.T) {
	py := requireTorch(t)
	const n = 3
	c := compileExample(t, "../../examples/simplecnn.cnn", n)
	s := newSession(t, c, 5)
	rng := rand.New(rand.NewPCG(11, 12))
	b := trainer.Batch{Valid: n, Pixels: make([]uint8, n*128*128*3), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	lb := make([]byte, 4*n)
	for i := range b.Labels {
		b.Labels[i] = int32(rng.IntN(10))
		binary.LittleEndian.PutUint32(lb[4*i:], uint32(b.Labels[i]))
	}
	dir := t.TempDir()
	ck, px, lbl, out := filepath.Join(dir, "ck.safetensors"), filepath.Join(dir, "px"), filepath.Join(dir, "lb"), filepath.Join(dir, "torch.safetensors")
	require.NoError(t, s.Save(ck, nil))
	require.NoError(t, os.WriteFile(px, b.Pixels, 0o644))
	require.NoError(t, os.WriteFile(lbl, lb, 0o644))

	res, err := exec.Command(py, filepath.Join(moduleRoot(t), "scripts/torch_checkpoint.py"), ck, px, lbl, "3", out).CombinedOutput()
	require.NoError(t, err, string(res))
	var torch struct {
		Loss    float64 `json:"loss"`
		Correct int     `json:"correct"`
		Version string  `json:"torch"`
	}
	require.NoError(t, json.Unmarshal(res, &torch), string(res))
	loss, correct, err := s.EvalBatch(b)
	require.NoError(t, err)
	t.Logf("PyTorch %s: loss %.6f (cnnc %.6f), correct %d (cnnc %d)", torch.Version, torch.Loss, loss, torch.Correct, correct)
	assert.InEpsilon(t, torch.Loss, loss, 1e-5)
	assert.Equal(t, torch.Correct, correct)

	_, _, err = s.TrainStep(b)
	require.NoError(t, err)
	f, err := checkpoint.Read(out)
	require.NoError(t, err)
	require.Len(t, f.Tensors, len(c.Spec.Params))
	before, err := checkpoint.Read(ck)
	require.NoError(t, err)
	for _, p := range c.Spec.Params {
		want, err := f.Expect(p.Name, checkpoint.F32, p.Shape)
		require.NoError(t, err)
		w := want.Float32s()
		got, err := s.ReadTensor(p)
		require.NoError(t, err)
		scale, worst := 0.0, 0.0
		for _, v := range w {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		init, err := before.Expect(p.Name, checkpoint.F32, p.Shape)
		require.NoError(t, err)
		moved := 0.0
		for i, v := range init.Float32s() {
			worst = math.Max(worst, math.Abs(float64(got[i])-float64(w[i])))
			moved = math.Max(moved, math.Abs(float64(w[i])-float64(v)))
		}
		t.Logf("%s: the step moved it by up to %.2e; cnnc and PyTorch differ by up to %.2e (largest value %.2e)", p.Name, moved, worst, scale)
		assert.LessOrEqual(t, worst, 1e-5*scale, p.Name)
		assert.Greater(t, moved, 100*worst, "%s: the step must move the parameter well beyond the difference", p.Name)
	}
}
