package cpu_test

import (
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/internal/kernelcases"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// The data block's augmentation, done by the kernels that read the raw batch, against the
// float64 reference (compiler/augment's Apply on the draw of ops.AugmentWord): whole training
// steps (kernelcheck.Step: loss, parameters, optimizer state after each, outputs NaN-poisoned),
// the kernels alone in training at a micro-batch's place in the batch, and evaluation's kernels.
// The augmented image differs from the reference's by a few float32 roundings per pixel (the
// bilinear weights and taps, the normalisation: relative ~1e-6 of a pixel), far below
// kernelcheck.Tolerance, so the steps' tolerance argument is TestStepSmallSimpleCNN's.

func TestAugmentSteps(t *testing.T) {
	checkSteps(t, "aug_crop.cnn", []byte(kernelcases.AugmentCrop), 5, 7, 3)
	checkSteps(t, "aug_resized.cnn", []byte(kernelcases.AugmentResized), 4, 9, 3)
	checkSteps(t, "aug_resized_conv.cnn", []byte(kernelcases.AugmentResizedConv), 3, 2, 2)
}

// The augmenting kernels alone: training (random draws) at a micro-batch's place in the batch,
// and evaluation (center box, normalize: no draw, no scalars).
func TestAugmentKernels(t *testing.T) {
	kernelcases.AugmentKernels(t, []codegen.Precision{codegen.FP32}, 0, func(nodes []*ir.Node, o codegen.Options) (*codegen.Program, device.Device) {
		prog, err := cpu.GenerateNodes("A", nodes, o)
		require.NoError(t, err)
		return prog, openDevice(t, prog, native.Options{})
	})
}

// augmentBenchCases are the models BenchmarkAugmentCost times with and without an augment list
// (scripts/bench-augment.sh times the same pairs' trainers by wall clock): the source edits that
// add the list.
var augmentBenchCases = []struct{ name, path, old, new string }{
	{"mnist", "../../examples/mnist.cnn", `    test  = mnist("data/mnist")`,
		`    test  = mnist("data/mnist")
    augment = [random_crop(size=[28,28], padding=2), normalize(mean=[0.1307], std=[0.3081])]`},
	{"vgg_small", "../../examples/vgg_small.cnn", `    test  = imagefolder("data/cifar10/test")`,
		`    test  = imagefolder("data/cifar10/test")
    augment = [random_crop(size=[32,32], padding=4), hflip(), normalize(mean=[0.4914,0.4822,0.4465], std=[0.247,0.243,0.261])]`},
	{"simplecnn", "../../examples/simplecnn.cnn", `    train = imagefolder("data/train", resize=[128,128])
    test  = imagefolder("data/test",  resize=[128,128])`,
		`    train = imagefolder("data/train", resize=[144,144])
    test  = imagefolder("data/test",  resize=[144,144])
    augment = [random_resized_crop(size=[128,128]), hflip(), normalize(mean=[0.485,0.456,0.406], std=[0.229,0.224,0.225])]`},
}

// BenchmarkAugmentCost: what augmentation costs a training step on the CPU target, in CPU time
// on one thread (every launch of a profiled step, summed: the machine's load does not count),
// each model as written and with its augment list, alternately, the median of 7 profiled steps
// each; and the first layer's kernels (the image's readers) alone.
//
//	go test ./codegen/cpu -run '^$' -bench AugmentCost -benchtime 1x
func BenchmarkAugmentCost(b *testing.B) {
	for _, c := range augmentBenchCases {
		src, err := os.ReadFile(c.path)
		require.NoError(b, err)
		aug := strings.Replace(string(src), c.old, c.new, 1)
		require.Contains(b, aug, "augment =", c.name)
		var steps, first [2][]time.Duration
		sessions := [2]*trainer.Session{profiledSession(b, c.path, src), profiledSession(b, c.name+"_augment.cnn", []byte(aug))}
		for range 7 {
			for k, sess := range sessions {
				n := sess.Spec.Batch
				bt := trainer.Batch{Valid: n, Pixels: make([]uint8, n*sess.Spec.H*sess.Spec.W*sess.Spec.C), Labels: make([]int32, n)}
				rng := rand.New(rand.NewPCG(1, 2))
				for i := range bt.Pixels {
					bt.Pixels[i] = uint8(rng.IntN(256))
				}
				times, _, err := sess.ProfileStep(bt)
				require.NoError(b, err)
				var all, reads time.Duration
				for _, t := range times {
					all += t.Time
					if strings.Contains(t.Launch.Kernel, "u8") || strings.HasPrefix(t.Launch.Kernel, "to_tensor") {
						reads += t.Time
					}
				}
				steps[k], first[k] = append(steps[k], all), append(first[k], reads)
			}
		}
		med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
		p, a := med(steps[0]), med(steps[1])
		b.Logf("%-10s batch %3d: step %8.2f ms plain, %8.2f ms augmented (%+.1f%%); the image's readers %7.2f ms, %7.2f ms", c.name,
			sessions[0].Spec.Batch, p.Seconds()*1e3, a.Seconds()*1e3, 100*(a.Seconds()-p.Seconds())/p.Seconds(), med(first[0]).Seconds()*1e3, med(first[1]).Seconds()*1e3)
	}
}

// profiledSession compiles a model for the CPU target with one worker, whose launches are timed
// in the launching thread's CPU time (cpuTimed, bench_test.go).
func profiledSession(b *testing.B, name string, src []byte) *trainer.Session {
	res, err := compiler.CompileSource(name, src, compiler.Options{})
	require.NoError(b, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CPU)
	require.NoError(b, err)
	dev, err := native.New(c.Kernels, "kernels.cc", native.Options{Workers: 1})
	require.NoError(b, err)
	b.Cleanup(func() { dev.Close() })
	sess, err := trainer.NewSession(c.Spec, cpuTimed{dev}, 1)
	require.NoError(b, err)
	b.Cleanup(func() { sess.Close() })
	return sess
}
