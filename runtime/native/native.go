// Package native is the CPU target's device.Device: kernels generated for the CPU from the fused
// IR (codegen/cpu: C++ templates of cnnc_cpu.h instantiated on each kernel's shapes), run as
// tasks over a pool of GOMAXPROCS workers.
//
// In:  a model's kernel source (codegen/cpu's Program.Source) — found built into the program
// (BuiltinSource, compiled by go build with cgo, as trainers and `cnnc gen` packages carry it)
// or compiled with g++ when the program runs (tests, tools) — and launches by kernel name with
// cuLaunchKernel's parameter layout, the grid's size being the launch's task count.
// Out: the kernels' effects on host memory (allocated per buffer, as runtime/emu's, so that
// AddressSanitizer sees every buffer's bounds).
//
// Why: the CUDA emulator (runtime/cpu) runs the CUDA C a thread at a time with a fiber switch at
// every barrier — the oracle for the CUDA kernels, but slow. This device runs kernels written for
// the CPU: register-tiled, vectorised (AVX2+FMA where the CPU has it, else SSE2, chosen when the
// device opens), each launch's tasks spread over the cores. Every task writes its own outputs
// and reductions run in a fixed order (cnnc_cpu.h), so results are the same bits whatever the
// number of workers; across instruction sets they agree within fp32 rounding.
package native

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/emu"
)

// Options configure New. The zero value is ready to use.
type Options struct {
	// Workers is the number of threads a launch runs tasks on. Default GOMAXPROCS.
	Workers int
	// ISA chooses the kernels: "" picks AVX2+FMA where the CPU has both, else the baseline;
	// "sse2" forces the baseline; "avx2" requires AVX2+FMA. The environment variable
	// CNNC_CPU_ISA sets it when Options leave it empty.
	ISA string
	// CacheDir holds libraries compiled at run time. Default os.UserCacheDir()/cnnc/native.
	CacheDir string
	// Compiler compiles libraries not built into the program. Default "g++".
	Compiler string
}

type kernel struct {
	fn      unsafe.Pointer
	tasks   int64
	nparams int
}

// Device runs one model's kernels. Launches are synchronous and run one at a time.
type Device struct {
	mu      sync.Mutex
	handle  unsafe.Pointer // dlopen handle; nil for a built-in library
	builtin bool
	isa     string
	kernels map[string]kernel
	params  unsafe.Pointer   // C parameter block, maxParams values
	counter unsafe.Pointer   // the launch's next task
	scratch []unsafe.Pointer // one per worker; [0] is the launching goroutine's
	workers []chan job       // workers 1..n-1
	done    chan struct{}
	closed  bool
}

type job struct {
	fn    unsafe.Pointer
	tasks int64
}

const maxParams = 64

var _ device.Device = (*Device)(nil)

// New opens the kernels of a model's source (named name in compiler messages): the library
// built into the program from the same source when there is one, else the source compiled.
func New(src []byte, name string, opts Options) (*Device, error) {
	isa, err := chooseISA(opts.ISA)
	if err != nil {
		return nil, err
	}
	d := &Device{isa: isas[isa].suffix, kernels: map[string]kernel{}}
	var entry unsafe.Pointer
	if e, ok := builtins.Load(sourceSHA(src)); ok && opts.Compiler == "" {
		entry, d.builtin = e.(unsafe.Pointer), true
	} else {
		path, err := build(src, name, opts)
		if err != nil {
			return nil, err
		}
		if d.handle, entry, err = openShared(path); err != nil {
			return nil, err
		}
	}
	info := readLibrary(entry)
	if info.abi != abiVersion {
		d.Close()
		return nil, fmt.Errorf("native: %s: kernel library ABI %d, want %d", name, info.abi, abiVersion)
	}
	var scratch int64 = 64
	for _, k := range info.kernels {
		if k.tasks < 0 {
			d.Close()
			return nil, fmt.Errorf("native: %s: kernel %s splits its work differently per instruction set", name, k.name)
		}
		d.kernels[k.name] = kernel{fn: k.fn[isa], tasks: k.tasks, nparams: k.nparams}
		scratch = max(scratch, k.scratch[isa])
	}
	n := opts.Workers
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	d.params, d.counter = cAlloc(8*maxParams), cAlloc(64)
	for i := 0; i < n; i++ {
		p := cAlloc(scratch)
		if p == nil || d.params == nil || d.counter == nil {
			d.Close()
			return nil, fmt.Errorf("native: out of memory for %d workers' scratch of %d bytes", n, scratch)
		}
		d.scratch = append(d.scratch, p)
	}
	d.done = make(chan struct{}, n)
	for i := 1; i < n; i++ {
		c := make(chan job)
		d.workers = append(d.workers, c)
		go d.worker(c, d.scratch[i])
	}
	return d, nil
}

// chooseISA maps Options.ISA (or $CNNC_CPU_ISA) to an index of isas.
func chooseISA(want string) (int, error) {
	if want == "" {
		want = os.Getenv("CNNC_CPU_ISA")
	}
	switch want {
	case "":
		if hasAVX2FMA() {
			return 1, nil
		}
		return 0, nil
	case "sse2":
		return 0, nil
	case "avx2":
		if !hasAVX2FMA() {
			return 0, fmt.Errorf("native: the AVX2+FMA kernels were asked for (ISA avx2), but this CPU lacks AVX2 or FMA")
		}
		return 1, nil
	}
	return 0, fmt.Errorf("native: instruction set %q: want sse2 or avx2 (or nothing: the best this CPU has)", want)
}

func (d *Device) worker(c chan job, scratch unsafe.Pointer) {
	for j := range c {
		work(j.fn, d.params, d.counter, j.tasks, scratch)
		d.done <- struct{}{}
	}
}

// Name says which kernels run: "cpu (AVX2+FMA, 2 threads, kernels built in)".
func (d *Device) Name() string {
	s := fmt.Sprintf("cpu (%s, %d threads", map[string]string{"sse2": "SSE2", "avx2": "AVX2+FMA"}[d.isa], len(d.scratch))
	if d.builtin {
		s += ", kernels built in"
	}
	return s + ")"
}

// ISA is the instruction set the device's kernels use: "sse2" or "avx2".
func (d *Device) ISA() string { return d.isa }

// Workers is the number of threads launches run on.
func (d *Device) Workers() int { return len(d.scratch) }

func (d *Device) Alloc(bytes int64) (device.Ptr, error) {
	p, err := emu.Alloc(int(bytes))
	return device.Ptr(p), err
}

func (d *Device) Free(p device.Ptr) error { return emu.Free(emu.Ptr(p)) }

func (d *Device) CopyIn(dst device.Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return emu.CopyIn(emu.Ptr(dst), src)
}

func (d *Device) CopyOut(dst []byte, src device.Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	return emu.CopyOut(dst, emu.Ptr(src))
}

// Launch runs a kernel's tasks on the workers and returns when all have finished. The grid's
// size must be the kernel's task count (codegen/cpu launches exactly that) and the block one
// thread; params are one 8-byte value per kernel parameter.
func (d *Device) Launch(name string, grid, block device.Dim3, sharedBytes int, params []uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	fail := func(format string, a ...any) error {
		return &device.LaunchError{Kernel: name, Err: fmt.Errorf(format, a...)}
	}
	if d.closed {
		return fail("native: device is closed")
	}
	k, ok := d.kernels[name]
	if !ok {
		return fail("native: no such kernel")
	}
	tasks := int64(grid[0]) * int64(grid[1]) * int64(grid[2])
	switch {
	case tasks != k.tasks:
		return fail("native: grid %v is %d tasks, the kernel has %d", grid, tasks, k.tasks)
	case block != device.Dim3{1, 1, 1} || sharedBytes != 0:
		return fail("native: CPU kernels take one-thread blocks and no shared memory, got block %v and %d bytes", block, sharedBytes)
	case len(params) != k.nparams:
		return fail("native: %d parameters given, the kernel takes %d", len(params), k.nparams)
	}
	setParams(d.params, params)
	storeCounter(d.counter, 0)
	helpers := min(int64(len(d.workers)), tasks-1)
	for i := int64(0); i < helpers; i++ {
		d.workers[i] <- job{k.fn, tasks}
	}
	work(k.fn, d.params, d.counter, tasks, d.scratch[0])
	for i := int64(0); i < helpers; i++ {
		<-d.done
	}
	return nil
}

// Sync returns at once: launches are synchronous.
func (d *Device) Sync() error { return nil }

// Close stops the workers and frees the device's memory (not the buffers from Alloc).
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	for _, c := range d.workers {
		close(c)
	}
	for _, p := range d.scratch {
		cFree(p)
	}
	if d.params != nil {
		cFree(d.params)
	}
	if d.counter != nil {
		cFree(d.counter)
	}
	if d.handle != nil {
		closeShared(d.handle)
	}
	return nil
}

// HasAVX2FMA reports whether this CPU runs the AVX2+FMA kernels.
func HasAVX2FMA() bool { return hasAVX2FMA() }
