package cpu_test

import (
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"math/rand/v2"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// BenchmarkStep times training steps of an example on the CPU target:
// CNNC_BENCH_MODEL (default examples/simplecnn.cnn) at CNNC_BENCH_BATCH (default the model's).
//
//	go test ./codegen/cpu -run '^$' -bench Step -benchtime 5x
func BenchmarkStep(b *testing.B) {
	path := os.Getenv("CNNC_BENCH_MODEL")
	if path == "" {
		path = "../../examples/simplecnn.cnn"
	}
	src, err := os.ReadFile(path)
	require.NoError(b, err)
	var batch int64
	if s := os.Getenv("CNNC_BENCH_BATCH"); s != "" {
		d, err := time.ParseDuration(s + "ns")
		require.NoError(b, err)
		batch = int64(d)
	}
	res, err := compiler.CompileSource(path, src, compiler.Options{Batch: batch})
	require.NoError(b, err)
	c, err := driver.Compile(res, plan.Config{}, driver.CPU)
	require.NoError(b, err)
	workers := 0
	if os.Getenv("CNNC_BENCH_PROFILE") != "" {
		workers = 1 // profiles time each launch's CPU time on one thread: the machine's load does not count
	}
	dev, err := native.New(c.Kernels, "kernels.cc", native.Options{Workers: workers})
	require.NoError(b, err)
	defer dev.Close()
	var d device.Device = dev
	if workers == 1 {
		d = cpuTimed{dev}
	}
	sess, err := trainer.NewSession(c.Spec, d, 1)
	require.NoError(b, err)
	defer sess.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	n := c.Spec.Batch
	bt := trainer.Batch{Valid: n, Pixels: make([]uint8, n*c.Spec.H*c.Spec.W*c.Spec.C), Labels: make([]int32, n)}
	for i := range bt.Pixels {
		bt.Pixels[i] = uint8(rng.IntN(256))
	}
	for i := range bt.Labels {
		bt.Labels[i] = int32(rng.IntN(c.Spec.Classes))
	}
	_, _, err = sess.TrainStep(bt)
	require.NoError(b, err)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, _, err = sess.TrainStep(bt)
		require.NoError(b, err)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "images/s")
	if workers == 1 {
		times, _, err := sess.ProfileStep(bt)
		require.NoError(b, err)
		var total time.Duration
		for _, t := range times {
			gf := float64(t.Launch.FLOPs) / t.Time.Seconds() / 1e9
			b.Logf("%9.2f ms %6.1f GFLOP/s %s", t.Time.Seconds()*1e3, gf, t.Launch.Kernel)
			total += t.Time
		}
		b.Logf("%9.2f ms in all, CPU time on one thread", total.Seconds()*1e3)
	}
}

// cpuTimed times launches by the CPU time of the launching thread (device.Timer), for a device
// with one worker, which runs every task on that thread.
type cpuTimed struct{ *native.Device }

func (d cpuTimed) TimeLaunches(run func() error) (time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	err := run()
	return threadCPU() - t0, err
}

// threadCPU is the calling thread's CPU time (clock_gettime(CLOCK_THREAD_CPUTIME_ID)).
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}
