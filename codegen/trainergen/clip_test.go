package trainergen_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
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
	return s
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
