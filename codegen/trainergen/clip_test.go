package trainergen_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/torchtest"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// clipSrc is a small SimpleCNN-like model (odd sizes) with optimizer opt and, unless clip is
// "", the train block's clip_grad_norm = clip.
func clipSrc(opt, clip string) []byte {
	src := `model S(image: f32[3,14,13], label: class[10]) {
    conv1 = conv2d(image, out=4, kernel=3)
    relu1 = relu(conv1)
    pool1 = maxpool(relu1, kernel=2)
    conv2 = conv2d(pool1, out=5, kernel=3)
    relu2 = relu(conv2)
    pool2 = maxpool(relu2, kernel=2)
    fc1   = linear(flatten(pool2), out=12)
    fc2   = linear(fc1, out=10)
    loss  = cross_entropy(fc2, label)
}
train {
    optimizer = ` + opt + `
`
	if clip != "" {
		src += "    clip_grad_norm = " + clip + "\n"
	}
	return []byte(src + "}\n")
}

// clipSession compiles src for target and opens a trainer session on its CPU device (the CPU
// target's native kernels, or the CUDA C on the emulator).
func clipSession(t *testing.T, src []byte, target driver.Target, batch int64) *trainer.Session {
	t.Helper()
	_, s := clipCompiled(t, src, target, batch)
	return s
}

// clipCompiled is clipSession with the compiled model.
func clipCompiled(t *testing.T, src []byte, target driver.Target, batch int64) (*trainergen.Compiled, *trainer.Session) {
	t.Helper()
	res, err := compiler.CompileSource("clip.cnn", src, compiler.Options{Batch: batch})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, target)
	require.NoError(t, err)
	var dev device.Device
	if target == driver.CPU {
		dev, err = native.New(c.Kernels, "clip.cc", native.Options{})
	} else {
		dev, err = cpu.New(c.Kernels, "clip.cu", cpu.Options{})
	}
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	s, err := trainer.NewSession(c.Spec, dev, 7)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return c, s
}

// Clipping that never clips (max_norm far above the gradients' norm: the coefficient is exactly
// 1) trains exactly as the model without clip_grad_norm, bit for bit — though its plan differs
// (every update split off its weight gradient, the norm computed) — on the CPU target and on
// the CUDA kernels (the emulator): the losses and every parameter and optimizer state tensor
// after each of 3 steps, SGD with momentum and weight decay, and Adam.
func TestInactiveClippingChangesNothing(t *testing.T) {
	const batch = 3
	for _, target := range []driver.Target{driver.CPU, driver.CUDA} {
		for _, opt := range []string{"sgd(lr=0.1, momentum=0.9, weight_decay=0.01)", "adam(lr=0.01, weight_decay=0.01)"} {
			t.Run(fmt.Sprintf("%s %s", target, opt), func(t *testing.T) {
				plain := clipSession(t, clipSrc(opt, ""), target, batch)
				clipped := clipSession(t, clipSrc(opt, "1e6"), target, batch)
				require.NotEqual(t, len(plain.Spec.Train.Launches), len(clipped.Spec.Train.Launches), "the clipped step has its own launches")
				rng := rand.New(rand.NewPCG(5, 6))
				sp := plain.Spec
				for step := range 3 {
					b := trainer.Batch{Valid: batch, Pixels: make([]uint8, batch*sp.H*sp.W*sp.C), Labels: make([]int32, batch)}
					for i := range b.Pixels {
						b.Pixels[i] = uint8(rng.IntN(256))
					}
					for i := range b.Labels {
						b.Labels[i] = int32(rng.IntN(sp.Classes))
					}
					l1, _, err := plain.TrainStep(b)
					require.NoError(t, err)
					l2, _, err := clipped.TrainStep(b)
					require.NoError(t, err)
					require.Equal(t, l1, l2, "loss of step %d", step)
					for i, p := range append(append([]trainer.Tensor{}, sp.Params...), sp.State...) {
						q := append(append([]trainer.Tensor{}, clipped.Spec.Params...), clipped.Spec.State...)[i]
						require.Equal(t, p.Name, q.Name)
						a, err := plain.ReadTensor(p)
						require.NoError(t, err)
						b, err := clipped.ReadTensor(q)
						require.NoError(t, err)
						require.Equal(t, a, b, "%s after step %d", p.Name, step)
					}
				}
			})
		}
	}
}

// torchClip is what scripts/torch_clip.py prints.
type torchClip struct {
	Torch   string
	Losses  []float64
	Norms   []float64
	Written []string
}

// Gradient clipping as PyTorch computes it: from a checkpoint of the test's small CNN (taken by
// cnnc's float32 trainer before any step), cnnc's float64 reference — the semantics its kernels
// are checked against, op by op and step by step (codegen's and codegen/cpu's
// TestClipKernels and TestClipGradNormSteps) — and its PyTorch twin in float64
// (scripts/torch_clip.py: loss, backward, torch.nn.utils.clip_grad_norm_(parameters,
// max_norm), optimizer.step()) take three steps on three random batches, with SGD (momentum,
// weight decay) and Adam (L2 weight decay); max_norm = 0.01 is far below every step's norm
// (checked: PyTorch's norms), so every step clips. The losses before each step, every
// parameter and every optimizer state tensor after the steps must agree.
//
// The tolerance, from error analysis: both sides compute one function in float64 from the same
// float64 inputs (float32 checkpoint values, pixels/255), differing only by float64 rounding in
// different orders. Each value is a sum of at most n = 559 terms (the norm's squares over the
// 559 parameters; a weight gradient's 3 x 12 x 11 = 396 products), within gamma_n = n 2^-53 =
// 6.2e-14 of the sum of its terms' magnitudes; the norm is a sum of squares (no cancellation),
// so the coefficient max_norm/(norm + 1e-6) has a relative error of at most gamma_(n+3): it
// scales every gradient by a factor that differs between the sides by less than 1e-13
// relative. Through 8 layers (relu, max-pool, softmax magnify relative errors by at most 1; the
// linear and conv layers' sums are counted above) and 3 steps the parameters differ by less than
// 8 x 3 x 2 x 6.2e-14 = 3e-12 relative to each tensor's largest magnitude for SGD. Adam's
// update m^/(sqrt(v^) + eps) is invariant to the gradients' common scale up to eps (1e-8,
// far below the clipped gradients' 1e-4 and more), and turns a relative error of a gradient
// element into at most the same relative error of its update — except where an element's
// gradient is within its own rounding (~1e-13 of its tensor's scale) of 0 without being exactly
// 0 (exact zeros, such as a dead relu's, are exact on both sides): probability ~559 x 1e-12.
// The tolerance 1e-7 (exampleTol, relative to each tensor's largest magnitude) is far above
// that. The test's power: clipping per parameter instead of globally, the norm without the
// square root or its 1e-6, scaling after weight decay or the update, or a missing clamp change
// these values by 1e-3 and more.
//
// cnnc's float32 trainer (CPU target) from the same checkpoint is logged beside it for
// information: its kernels are checked against the reference by the tests named above.
func TestClipGradNormInPyTorch(t *testing.T) {
	torchtest.Require(t)
	const batch, steps, maxNorm = 3, 3, 0.01
	for _, opt := range []string{"sgd(lr=0.1, momentum=0.9, weight_decay=0.01)", "adam(lr=0.01, weight_decay=0.01)"} {
		t.Run(opt, func(t *testing.T) {
			c, s := clipCompiled(t, clipSrc(opt, fmt.Sprint(maxNorm)), driver.CPU, batch)
			sp := c.Spec
			ck := filepath.Join(t.TempDir(), "ck.safetensors")
			require.NoError(t, s.Save(ck, nil))
			ref := referenceAt(t, c.Plan.Graph, ck, 7, 0)
			rng := rand.New(rand.NewPCG(8, 9))
			var pixels, labels [][]int
			var refLosses, losses32 []float64
			for range steps {
				b := trainer.Batch{Valid: batch, Pixels: make([]uint8, batch*sp.H*sp.W*sp.C), Labels: make([]int32, batch)}
				px, lb := make([]int, len(b.Pixels)), make([]int, batch)
				for i := range b.Pixels {
					b.Pixels[i] = uint8(rng.IntN(256))
					px[i] = int(b.Pixels[i])
				}
				for i := range b.Labels {
					b.Labels[i] = int32(rng.IntN(sp.Classes))
					lb[i] = int(b.Labels[i])
				}
				pixels, labels = append(pixels, px), append(labels, lb)
				r, err := ref.Run(reference.Batch{N: batch, Pixels: b.Pixels, Labels: b.Labels}, reference.Train)
				require.NoError(t, err)
				refLosses = append(refLosses, r.Loss)
				l, _, err := s.TrainStep(b)
				require.NoError(t, err)
				losses32 = append(losses32, float64(l))
			}
			o := c.Plan.Graph.Opt
			var tc torchClip
			out := t.TempDir()
			torchtest.Run(t, torchtest.Script("torch_clip.py"), map[string]any{
				"checkpoint": ck, "shape": []int{sp.C, sp.H, sp.W}, "pixels": pixels, "labels": labels, "max_norm": maxNorm, "out": out,
				"optimizer": map[string]any{"kind": o.Kind.String(), "lr": o.LR, "momentum": o.Momentum, "nesterov": o.Nesterov,
					"weight_decay": o.WeightDecay, "betas": []float64{o.Beta1, o.Beta2}, "eps": o.Eps},
			}, &tc)
			require.Len(t, tc.Norms, steps)
			for i, n := range tc.Norms {
				require.Greater(t, n, 10*maxNorm, "step %d clips", i)
				assert.InDelta(t, tc.Losses[i], refLosses[i], exampleTol*math.Max(1, math.Abs(tc.Losses[i])), "loss before step %d", i+1)
			}
			var worst32 float64
			for _, p := range append(append([]trainer.Tensor{}, sp.Params...), sp.State...) {
				require.Contains(t, tc.Written, p.Name)
				want := readF64(t, filepath.Join(out, p.Name))
				got := ref.ParamByName(p.Name)
				if got == nil {
					for v, d := range ref.State {
						if "optimizer."+v.Name == p.Name {
							got = d
						}
					}
				}
				require.Len(t, got, len(want), p.Name)
				assert.LessOrEqual(t, maxRel64(got, want), exampleTol, "%s after %d clipped steps", p.Name, steps)
				f32, err := s.ReadTensor(p)
				require.NoError(t, err)
				worst32 = math.Max(worst32, maxRel(f32, want))
			}
			t.Logf("torch %s, %s: norms %.4g (max_norm %g), losses %.9f (cnnc float32 %.9f); float32 trainer's worst relative difference %.2e",
				tc.Torch, opt, tc.Norms, maxNorm, tc.Losses, losses32, worst32)
		})
	}
}
