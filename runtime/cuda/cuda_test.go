//go:build cuda

// These tests need an NVIDIA GPU and nvcc: `go test -tags cuda
// ./runtime/cuda/`. On a machine without a GPU the test binary exits at
// start (gorgonia.org/cu's init), before any test runs; without nvcc they
// skip loudly (fail with CNNC_REQUIRE_NVCC=1).
package cuda_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/cu"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/kernelcheck"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/reference"
	"github.com/cnnc/cnnc/examples"
	"github.com/cnnc/cnnc/internal/fakecuda"
	"github.com/cnnc/cnnc/internal/nvcc"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/cuda"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// testKernels are small hand-written kernels for the device's mechanics.
const testKernels = `
#ifndef CNNC_DYNAMIC_SHARED
#define CNNC_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// out[b] = sum of s[0..n) after the threads of block b filled s with
// i%7 + b, through more than 48 KiB of dynamic shared memory.
extern "C" __global__ void bigshared(float* out, long n) {
    CNNC_DYNAMIC_SHARED(float, s);
    for (long i = threadIdx.x; i < n; i += blockDim.x) s[i] = (float)(i % 7 + blockIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0;
        for (long i = 0; i < n; i++) sum += s[i];
        out[blockIdx.x] = sum;
    }
}

// writes far outside any allocation
extern "C" __global__ void wild(float* p) {
    p[(1L << 40) + threadIdx.x] = 1.0f;
}

// stops the kernel with an error
extern "C" __global__ void trap(float* p) {
    if (threadIdx.x == 3) __trap();
    p[threadIdx.x] = 1.0f;
}
`

var (
	fatbinOnce sync.Once
	fatbin     []byte
	fatbinErr  error
)

func testFatbin(t *testing.T) []byte {
	t.Helper()
	nvcc.Require(t)
	fatbinOnce.Do(func() { fatbin, fatbinErr = trainergen.CompileFatbin([]byte(testKernels)) })
	require.NoError(t, fatbinErr)
	return fatbin
}

func open(t *testing.T, fb []byte) *cuda.Device {
	t.Helper()
	d, err := cuda.NewWithOptions(fb, cuda.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	return d
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesf32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func f32arg(f float32) uint64 { return uint64(math.Float32bits(f)) }

func TestDeviceInfo(t *testing.T) {
	d := open(t, testFatbin(t))
	t.Log(d.Name())
	assert.Contains(t, d.Name(), "sm_")
	assert.Regexp(t, `^sm_\d+$`, d.Arch())
	free, total, err := d.MemInfo()
	require.NoError(t, err)
	assert.Greater(t, free, int64(0))
	assert.GreaterOrEqual(t, total, free)
}

// saxpy on the GPU and on the CPU emulator agree (up to FMA contraction).
func TestSaxpyMatchesEmulator(t *testing.T) {
	fb := testFatbin(t)
	const n = 1<<20 + 3
	const a = float32(1.75)
	rng := rand.New(rand.NewPCG(1, 2))
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = rng.Float32()*2-1, rng.Float32()*2-1
	}
	emu, err := cpu.New([]byte(testKernels), "test_kernels.cu", cpu.Options{})
	require.NoError(t, err)
	defer emu.Close()
	gpu := open(t, fb)
	results := map[string][]float32{}
	for _, dev := range []device.Device{gpu, emu} {
		px, err := dev.Alloc(4 * n)
		require.NoError(t, err)
		py, err := dev.Alloc(4 * n)
		require.NoError(t, err)
		require.NoError(t, dev.CopyIn(px, f32bytes(x)))
		require.NoError(t, dev.CopyIn(py, f32bytes(y)))
		require.NoError(t, dev.Launch("saxpy", device.Dim3{(n + 255) / 256, 1, 1}, device.Dim3{256, 1, 1}, 0,
			[]uint64{f32arg(a), uint64(px), uint64(py), n}))
		require.NoError(t, dev.Sync())
		out := make([]byte, 4*n)
		require.NoError(t, dev.CopyOut(out, py))
		results[dev.Name()] = bytesf32(out)
		require.NoError(t, dev.Free(px))
		require.NoError(t, dev.Free(py))
	}
	g, e := results[gpu.Name()], results[emu.Name()]
	for i := range g {
		want := float64(a)*float64(x[i]) + float64(y[i])
		require.InDelta(t, want, g[i], 1e-6, "gpu element %d", i)
		require.InDelta(t, e[i], g[i], 1e-6, "gpu vs emulator element %d", i)
	}
}

// A launch above 48 KiB of dynamic shared memory raises the function's
// limit through the shim.
func TestDynamicSharedAbove48KiB(t *testing.T) {
	d := open(t, testFatbin(t))
	const blocks, n = 4, 100 << 10 / 4 // 100 KiB of floats
	out, err := d.Alloc(4 * blocks)
	require.NoError(t, err)
	require.NoError(t, d.Launch("bigshared", device.Dim3{blocks, 1, 1}, device.Dim3{256, 1, 1}, 4*n, []uint64{uint64(out), n}))
	b := make([]byte, 4*blocks)
	require.NoError(t, d.CopyOut(b, out))
	for i, v := range bytesf32(b) {
		want := 0 // exact in float32: every partial sum is an integer below 2^24
		for j := range n {
			want += j%7 + i
		}
		assert.Equal(t, float32(want), v, "block %d", i)
	}
	// more than any block may have names the kernel and the limit
	err = d.Launch("bigshared", device.Dim3{1, 1, 1}, device.Dim3{32, 1, 1}, 1<<20, []uint64{uint64(out), 1})
	var le *device.LaunchError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "bigshared", le.Kernel)
	assert.Contains(t, err.Error(), "allows at most")
}

func TestErrors(t *testing.T) {
	fb := testFatbin(t)
	d := open(t, fb)

	_, err := cuda.New(nil)
	assert.ErrorContains(t, err, "empty")

	err = d.Launch("no_such_kernel", device.Dim3{1, 1, 1}, device.Dim3{1, 1, 1}, 0, nil)
	var le *device.LaunchError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "no_such_kernel", le.Kernel)
	assert.ErrorIs(t, err, cu.NotFound)

	err = d.Launch("saxpy", device.Dim3{0, 1, 1}, device.Dim3{1, 1, 1}, 0, []uint64{0, 0, 0, 0})
	require.ErrorAs(t, err, &le)
	assert.Contains(t, err.Error(), "empty launch")

	free, total, err := d.MemInfo()
	require.NoError(t, err)
	_, err = d.Alloc(free + 1<<30)
	var me *cuda.MemoryError
	require.ErrorAs(t, err, &me)
	assert.ErrorIs(t, err, cu.OutOfMemory)
	assert.Contains(t, err.Error(), fmt.Sprint(free+1<<30))
	assert.Contains(t, err.Error(), fmt.Sprint(total))

	p, err := d.Alloc(64)
	require.NoError(t, err)
	assert.ErrorContains(t, d.CopyIn(p+32, make([]byte, 64)), "outside every allocation")
	assert.ErrorContains(t, d.CopyOut(make([]byte, 65), p), "outside every allocation")
	assert.ErrorContains(t, d.Free(p+8), "not an allocation")
	require.NoError(t, d.Free(p))
	assert.ErrorContains(t, d.Free(p), "not an allocation")

	d2, err := cuda.NewWithOptions(fb, cuda.Options{})
	require.NoError(t, err)
	_, err = d2.Alloc(1024) // freed by Close
	require.NoError(t, err)
	require.NoError(t, d2.Close())
	require.NoError(t, d2.Close())
	_, err = d2.Alloc(16)
	assert.ErrorContains(t, err, "closed")
}

// Pinned host memory from the shim round-trips through the device.
func TestPinnedHostMemory(t *testing.T) {
	d := open(t, testFatbin(t))
	const n = 1 << 20
	h, err := d.AllocHost(n)
	require.NoError(t, err)
	for i := range h {
		h[i] = byte(i * 7)
	}
	p, err := d.Alloc(n)
	require.NoError(t, err)
	require.NoError(t, d.CopyIn(p, h))
	back := make([]byte, n)
	require.NoError(t, d.CopyOut(back, p))
	assert.Equal(t, h, back)
	// asynchronous copies: page-locked memory only, complete at Sync
	h2, err := d.AllocHost(n)
	require.NoError(t, err)
	for i := range h {
		h[i] = byte(i * 3)
	}
	require.NoError(t, d.CopyInAsync(p, h))
	require.NoError(t, d.CopyOutAsync(h2, p))
	require.NoError(t, d.Sync())
	assert.Equal(t, h, h2)
	assert.ErrorContains(t, d.CopyInAsync(p, make([]byte, 16)), "not from AllocHost")
	assert.ErrorContains(t, d.CopyOutAsync(make([]byte, 16), p), "not from AllocHost")
	assert.ErrorContains(t, d.CopyInAsync(p+n-8, h[:16]), "outside every allocation")
	require.NoError(t, d.FreeHost(h2))
	require.NoError(t, d.FreeHost(h))
	assert.Error(t, d.FreeHost(back))
	_, err = d.AllocHost(4096) // freed by Close
	require.NoError(t, err)
}

// Calls from many goroutines are serialised onto the device's thread.
func TestConcurrentUse(t *testing.T) {
	d := open(t, testFatbin(t))
	const workers, n = 8, 4096
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = func() error {
				x, y := make([]float32, n), make([]float32, n)
				for i := range x {
					x[i], y[i] = float32(i), float32(w)
				}
				px, err := d.Alloc(4 * n)
				if err != nil {
					return err
				}
				defer d.Free(px)
				py, err := d.Alloc(4 * n)
				if err != nil {
					return err
				}
				defer d.Free(py)
				if err := d.CopyIn(px, f32bytes(x)); err != nil {
					return err
				}
				if err := d.CopyIn(py, f32bytes(y)); err != nil {
					return err
				}
				for range 50 {
					if err := d.Launch("saxpy", device.Dim3{n / 256, 1, 1}, device.Dim3{256, 1, 1}, 0, []uint64{f32arg(1), uint64(px), uint64(py), n}); err != nil {
						return err
					}
				}
				out := make([]byte, 4*n)
				if err := d.CopyOut(out, py); err != nil {
					return err
				}
				for i, v := range bytesf32(out) {
					if want := float32(w) + 50*float32(i); v != want {
						return fmt.Errorf("worker %d element %d: %v, want %v", w, i, v, want)
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
}

// faultChild names the faulting kernel in the child process that runs it: a
// fault leaves the context unusable, so it runs in its own process.
const faultChild = "CNNC_CUDA_TEST_FAULT_CHILD"

func TestFaultChild(t *testing.T) {
	if os.Getenv(faultChild) == "" {
		t.Skip("run by TestFaultNamesKernel")
	}
	d, err := cuda.New(testFatbin(t)) // reads CNNC_CUDA_DEBUG
	require.NoError(t, err)
	p, err := d.Alloc(1024)
	require.NoError(t, err)
	err = d.Launch(os.Getenv(faultChild), device.Dim3{1, 1, 1}, device.Dim3{32, 1, 1}, 0, []uint64{uint64(p)})
	if err == nil {
		err = d.Sync()
	}
	fmt.Printf("FAULT: %v\n", err)
	var le *device.LaunchError
	fmt.Printf("LAUNCHERROR: %v\n", errors.As(err, &le))
}

// A faulting kernel is named in debug mode, and as the last kernel launched
// at the next Sync otherwise: an illegal address (GPU only: under the fake
// driver a wild write crashes the process) and a __trap().
func TestFaultNamesKernel(t *testing.T) {
	testFatbin(t)
	// __trap() stops the kernel with "unspecified launch failure" on some
	// GPUs and "illegal instruction" on others (the fake driver: the first)
	for _, fault := range []struct{ kernel, err string }{{"wild", "IllegalAddress"}, {"trap", "LaunchFailed|IllegalInstruction"}} {
		t.Run(fault.kernel, func(t *testing.T) {
			if fault.kernel == "wild" && fakecuda.Dir() != "" {
				t.Skip("under the fake driver kernels run in the process: a wild write crashes it instead of faulting")
			}
			for _, debug := range []string{"1", "0"} {
				cmd := exec.Command(os.Args[0], "-test.run=^TestFaultChild$", "-test.v")
				cmd.Env = append(os.Environ(), faultChild+"="+fault.kernel, cuda.DebugEnv+"="+debug)
				out, _ := cmd.CombinedOutput()
				s := string(out)
				t.Logf("%s=%s:\n%s", cuda.DebugEnv, debug, s)
				require.Contains(t, s, "FAULT: ")
				assert.Regexp(t, fault.err, s)
				if debug == "1" {
					assert.Contains(t, s, "kernel "+fault.kernel+": failed while running")
					assert.Contains(t, s, "LAUNCHERROR: true")
				} else {
					assert.Contains(t, s, "the last kernel launched was "+fault.kernel)
				}
			}
		})
	}
}

// Generated kernels: whole training steps on the GPU and on the CPU
// emulator, each checked against the float64 reference, and the two
// devices' losses compared.
func TestGeneratedStepsMatchEmulator(t *testing.T) {
	nvcc.Require(t)
	models := map[string]string{
		"mlp.cnn": `model M(image: f32[1,9,7], label: class[5]) {
    h = linear(flatten(image), out=33)
    r = relu(h)
    d = dropout(r, p=0.3)
    h2 = linear(d, out=17)
    r2 = relu(h2)
    o = linear(r2, out=5, bias=false)
    loss = cross_entropy(o, label)
}
train { optimizer = adam(lr=0.01, weight_decay=0.01) }
`,
		"small_simplecnn.cnn": `model S(image: f32[3,14,13], label: class[10]) {
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
train { optimizer = sgd(lr=0.01, momentum=0.9) }
`,
	}
	for name, src := range models {
		t.Run(name, func(t *testing.T) {
			const batch, steps = 3, 3
			res, err := compiler.CompileSource(name, []byte(src), compiler.Options{Batch: batch})
			require.NoError(t, err)
			g := res.Graph
			prog, err := codegen.Generate(g, codegen.Options{Batch: batch})
			require.NoError(t, err)
			fb, err := trainergen.CompileFatbin(prog.Source)
			require.NoError(t, err)
			gpu := open(t, fb)
			emu, err := cpu.New(prog.Source, name, cpu.Options{})
			require.NoError(t, err)
			defer emu.Close()
			rng := rand.New(rand.NewPCG(7, 8))
			var batches []reference.Batch
			for range steps {
				batches = append(batches, randomBatch(g, batch, rng))
			}
			var losses [2][]float64
			for i, dev := range []device.Device{gpu, emu} {
				reports, err := kernelcheck.Step(dev, prog, g, 5, batches)
				require.NoError(t, err, dev.Name())
				require.Len(t, reports, steps)
				for _, r := range reports {
					t.Logf("%s: %v", dev.Name(), r)
					assert.LessOrEqual(t, r.Worst, kernelcheck.Tolerance, "%s: %s", dev.Name(), r)
					losses[i] = append(losses[i], r.Loss)
				}
			}
			for s := range steps {
				assert.InEpsilon(t, losses[1][s], losses[0][s], 1e-4, "step %d: gpu vs emulator", s)
			}
		})
	}
}

func randomBatch(g *ir.Graph, n int, rng *rand.Rand) reference.Batch {
	img := g.Inputs[0].Type
	b := reference.Batch{N: n, Pixels: make([]uint8, n*int(img.SampleElems())), Labels: make([]int32, n)}
	for i := range b.Pixels {
		b.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range b.Labels {
		b.Labels[i] = int32(rng.Int64N(g.Logits.Type.Dims[0]))
	}
	return b
}

// A captured graph replays its launches with the values they had when
// captured until SetParams changes them; a capture that synchronises
// fails and leaves the device usable.
func TestGraphCaptureAndSetParams(t *testing.T) {
	d := open(t, testFatbin(t))
	const n = 1000
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = float32(i)
	}
	px, err := d.Alloc(4 * n)
	require.NoError(t, err)
	py, err := d.Alloc(4 * n)
	require.NoError(t, err)
	require.NoError(t, d.CopyIn(px, f32bytes(x)))
	require.NoError(t, d.CopyIn(py, f32bytes(y)))
	saxpy := func(a float32) error {
		return d.Launch("saxpy", device.Dim3{(n + 127) / 128, 1, 1}, device.Dim3{128, 1, 1}, 0, []uint64{f32arg(a), uint64(px), uint64(py), n})
	}
	g, err := d.CaptureGraph(func() error {
		if err := saxpy(1); err != nil {
			return err
		}
		return saxpy(2)
	})
	require.NoError(t, err)
	defer func() { assert.NoError(t, g.Close()) }()
	read := func() []float32 {
		out := make([]byte, 4*n)
		require.NoError(t, d.CopyOut(out, py))
		return bytesf32(out)
	}
	assert.Equal(t, make([]float32, n), read(), "capturing runs nothing")
	require.NoError(t, g.Replay())
	require.NoError(t, g.Replay())
	require.NoError(t, d.Sync())
	assert.Equal(t, float32(6*7), read()[7], "two replays of y += 1x + 2x")
	require.NoError(t, g.SetParams(1, []uint64{f32arg(10), uint64(px), uint64(py), n}))
	require.NoError(t, g.Replay())
	require.NoError(t, d.Sync())
	assert.Equal(t, float32(6*7+11*7), read()[7], "the second launch now adds 10x")
	assert.Error(t, g.SetParams(1, []uint64{0}), "parameter count")
	assert.Error(t, g.SetParams(2, nil), "no third launch")

	// copies from and to page-locked memory are captured too, and read
	// and write it whenever the graph runs
	in, err := d.AllocHost(4 * n)
	require.NoError(t, err)
	defer d.FreeHost(in)
	out, err := d.AllocHost(4 * n)
	require.NoError(t, err)
	defer d.FreeHost(out)
	g2, err := d.CaptureGraph(func() error {
		if err := d.CopyInAsync(px, in); err != nil {
			return err
		}
		if err := saxpy(3); err != nil {
			return err
		}
		return d.CopyOutAsync(out, py)
	})
	require.NoError(t, err)
	defer func() { assert.NoError(t, g2.Close()) }()
	before := read()[7]
	for round, xv := range []float32{1, 5} {
		copy(in, f32bytes(slices.Repeat([]float32{xv}, n)))
		require.NoError(t, g2.Replay())
		require.NoError(t, d.Sync())
		before += 3 * xv
		assert.Equal(t, before, bytesf32(out)[7], "round %d reads the input as it is now", round)
	}

	_, err = d.CaptureGraph(func() error {
		if err := saxpy(1); err != nil {
			return err
		}
		return d.Sync()
	})
	require.Error(t, err, "a capture cannot synchronise")
	require.NoError(t, saxpy(1), "the device still works")
	require.NoError(t, d.Sync())
	assert.Equal(t, before+5, read()[7], "y += x, with x = 5 from the last copy")
}

// Models as their trainers run them (driver.Compile: planned arena,
// training and evaluation kernels): a trainer.Session on the GPU launching
// kernel by kernel, one replaying the step as CUDA graphs, both pipelined,
// and one on the emulator; training steps (one partial) and an evaluation
// give the same losses and parameters.
func TestTrainerSessionMatchesEmulator(t *testing.T) {
	nvcc.Require(t)
	// embedded: the GPU bundle runs this binary where there is no Go tree
	mnist, err := examples.Models.ReadFile("mnist.cnn")
	require.NoError(t, err)
	// Adam's bias correction and dropout's masks change arguments every step
	adamDropout, err := examples.Models.ReadFile("adam_dropout.cnn")
	require.NoError(t, err)
	for name, src := range map[string][]byte{"mnist.cnn": mnist, "adam_dropout.cnn": adamDropout} {
		t.Run(name, func(t *testing.T) { sessionsAgree(t, name, src) })
	}
}

func sessionsAgree(t *testing.T, name string, src []byte) {
	res, err := compiler.CompileSource(name, src, compiler.Options{})
	require.NoError(t, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CUDA)
	require.NoError(t, err)
	spec := c.Spec
	fb, err := trainergen.CompileFatbin(c.Kernels)
	require.NoError(t, err)

	gpu := open(t, fb)
	emu, err := cpu.New(c.Kernels, name, cpu.Options{})
	require.NoError(t, err)
	defer emu.Close()

	rng := rand.New(rand.NewPCG(3, 4))
	n := spec.H * spec.W * spec.C
	var batches []trainer.Batch
	for s := range 5 {
		valid := spec.Batch
		if s == 3 {
			valid = spec.Batch - 5 // a partial batch
		}
		b := trainer.Batch{Pixels: make([]uint8, valid*n), Labels: make([]int32, valid), Valid: valid}
		for i := range b.Pixels {
			b.Pixels[i] = uint8(rng.IntN(256))
		}
		for i := range b.Labels {
			b.Labels[i] = int32(rng.IntN(spec.Classes))
		}
		batches = append(batches, b)
	}
	type run struct {
		name   string
		losses []float32
		params map[string][]float32
	}
	var runs []run
	// on the GPU, the steps are submitted without waiting (as the training
	// loop does): two are queued at a time, their losses arrive late
	for _, cfg := range []struct {
		name   string
		dev    device.Device
		graphs bool
	}{{"gpu", gpu, false}, {"gpu graph", gpu, true}, {"emulator", emu, false}} {
		sess, err := trainer.NewSession(spec, cfg.dev, spec.Seed)
		require.NoError(t, err, cfg.name)
		sess.UseGraphs = cfg.graphs
		r := run{name: cfg.name}
		for _, b := range batches {
			require.NoError(t, sess.Submit(b, func(res trainer.StepResult) error {
				r.losses = append(r.losses, res.Loss)
				return nil
			}), cfg.name)
		}
		require.NoError(t, sess.Flush(), cfg.name)
		require.Len(t, r.losses, len(batches))
		loss, _, err := sess.EvalBatch(batches[0])
		require.NoError(t, err, cfg.name)
		r.losses = append(r.losses, loss)
		r.params = map[string][]float32{}
		for _, p := range append(append([]trainer.Tensor{}, spec.Params...), spec.State...) {
			v, err := sess.ReadTensor(p)
			require.NoError(t, err)
			r.params[p.Name] = v
		}
		require.NoError(t, sess.Close())
		runs = append(runs, r)
	}
	want := runs[2]
	for _, got := range runs[:2] {
		t.Logf("losses: %s %v, emulator %v", got.name, got.losses, want.losses)
		for i := range want.losses {
			assert.InEpsilon(t, want.losses[i], got.losses[i], 1e-4, "%s: loss %d", got.name, i)
		}
		for name, w := range want.params {
			g := got.params[name]
			scale := 0.0
			for _, v := range w {
				scale = math.Max(scale, math.Abs(float64(v)))
			}
			for i := range w {
				require.InDelta(t, w[i], g[i], 1e-4*scale+1e-7, "%s: %s[%d]", got.name, name, i)
			}
		}
	}
	// the graph replays exactly what the launches do on the same device
	assert.Equal(t, runs[0].losses, runs[1].losses)
	assert.Equal(t, runs[0].params, runs[1].params)
}
