//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"sort"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	_ "github.com/cnnc/cnnc/runtime/cuda/preflight" // a clear message when the driver cannot start
	"github.com/cnnc/cnnc/runtime/device"
	"github.com/cnnc/cnnc/runtime/dist"
)

// DebugEnv turns on Options.Debug for New when set to "1".
const DebugEnv = "CNNC_CUDA_DEBUG"

// Options configure a Device.
type Options struct {
	// Ordinal is the GPU to use (0: the first).
	Ordinal int
	// Debug synchronises after every launch and checks for errors, so that
	// a fault names the kernel that caused it (slower).
	Debug bool
}

// Device is a device.Device on one GPU.
type Device struct {
	opts  Options
	name  string // for messages: "NVIDIA H200 (sm_90, 139.8 GiB)"
	arch  string // "sm_90"
	total int64

	mu     sync.Mutex // serialises calls into the worker
	calls  chan func() error
	result chan error
	closed bool

	// Owned by the worker goroutine (the only one making driver calls).
	dev     cu.Device
	ctx     context
	mod     cu.Module
	stream  cu.Stream
	optin   int // most shared memory per block after opting in
	funcs   map[string]*function
	allocs  map[device.Ptr]int64
	pinned  map[*byte]int
	args    []uint64         // the launch parameters' values, reused
	argPtrs []unsafe.Pointer // &args[i]: what cuLaunchKernel reads
	last    string           // the last kernel launched
	capture *Graph           // non-nil while launches are being captured
	watch   func() error     // WatchWaits' check, around every host wait
}

// function is a kernel looked up once.
type function struct {
	fn cu.Function
	// maxShared is the dynamic shared memory launches may use: 48 KiB until
	// a launch needs more and the limit is raised.
	maxShared int
}

const defaultMaxShared = 48 << 10

var (
	_ device.Device        = (*Device)(nil)
	_ device.HostAllocator = (*Device)(nil)
	_ device.AsyncCopier   = (*Device)(nil)
	_ device.Grapher       = (*Device)(nil)
	_ device.Timer         = (*Device)(nil)
	_ device.WaitWatcher   = (*Device)(nil)
)

// errClosed is returned by every call after Close.
var errClosed = errors.New("cuda: the device is closed")

// MemoryError says an allocation cannot fit in the GPU's free memory. It
// unwraps to cu.OutOfMemory.
type MemoryError struct {
	Device            string
	Want, Free, Total int64
}

func (e *MemoryError) Error() string {
	return fmt.Sprintf("cuda: %s has %d bytes (%s) free of %d (%s); %d bytes (%s) do not fit",
		e.Device, e.Free, gib(e.Free), e.Total, gib(e.Total), e.Want, gib(e.Want))
}

func (e *MemoryError) Unwrap() error { return cu.OutOfMemory }

func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// New opens the process's GPU with the kernels of fatbin (nvcc -fatbin
// output, or a cubin or PTX image): GPU 0, or in a data-parallel rank
// (torchrun's variables set: runtime/dist) GPU LOCAL_RANK, one GPU per
// rank of the machine as torchrun's convention has it. Options.Debug is
// set when CNNC_CUDA_DEBUG=1.
func New(fatbin []byte) (*Device, error) {
	cfg, isRank, err := dist.FromEnv(os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("cuda: which GPU: %w", err)
	}
	o := Options{Debug: os.Getenv(DebugEnv) == "1"}
	if isRank {
		o.Ordinal = cfg.LocalRank
	}
	return NewWithOptions(fatbin, o)
}

// NewWithOptions opens GPU o.Ordinal with the kernels of fatbin.
func NewWithOptions(fatbin []byte, o Options) (*Device, error) {
	if len(fatbin) == 0 {
		return nil, errors.New("cuda: no kernels: the fatbin is empty")
	}
	d := &Device{
		opts: o, calls: make(chan func() error), result: make(chan error),
		funcs: map[string]*function{}, allocs: map[device.Ptr]int64{}, pinned: map[*byte]int{},
	}
	started := make(chan error)
	go d.serve(fatbin, started)
	if err := <-started; err != nil {
		return nil, err
	}
	return d, nil
}

// serve is the worker: it owns an OS thread with the context current and
// runs every call. The thread stays locked, so it ends with the goroutine
// (after Close) and no other goroutine ever runs on it with the context.
func (d *Device) serve(fatbin []byte, started chan<- error) {
	goruntime.LockOSThread()
	if err := d.open(fatbin); err != nil {
		started <- err
		return
	}
	started <- nil
	for f := range d.calls {
		d.result <- f()
	}
}

func (d *Device) open(fatbin []byte) (err error) {
	if _, err := resolveDriver(); err != nil {
		return err
	}
	n, err := cu.NumDevices()
	if err != nil {
		return fmt.Errorf("cuda: cuDeviceGetCount: %w", err)
	}
	if d.opts.Ordinal < 0 || d.opts.Ordinal >= n {
		return fmt.Errorf("cuda: no GPU %d: the driver reports %d", d.opts.Ordinal, n)
	}
	if d.dev, err = cu.GetDevice(d.opts.Ordinal); err != nil {
		return fmt.Errorf("cuda: cuDeviceGet(%d): %w", d.opts.Ordinal, err)
	}
	name, err := d.dev.Name()
	if err != nil {
		return fmt.Errorf("cuda: cuDeviceGetName(%d): %w", d.opts.Ordinal, err)
	}
	major, minor, err := d.dev.ComputeCapability()
	if err != nil {
		return fmt.Errorf("cuda: compute capability of %s: %w", name, err)
	}
	d.arch = fmt.Sprintf("sm_%d%d", major, minor)
	if d.optin, err = sharedOptin(d.dev); err != nil {
		return fmt.Errorf("cuda: shared memory limit of %s: %w", name, err)
	}
	// cuCtxCreate makes the new context current on this (locked) thread.
	if d.ctx, err = createContext(d.dev); err != nil {
		return fmt.Errorf("cuda: cuCtxCreate on %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			d.ctx.destroy()
		}
	}()
	if _, d.total, err = cu.MemInfo(); err != nil {
		return fmt.Errorf("cuda: cuMemGetInfo on %s: %w", name, err)
	}
	d.name = fmt.Sprintf("%s (%s, %s)", name, d.arch, gib(d.total))
	if d.mod, err = cu.LoadData(string(fatbin)); err != nil {
		return fmt.Errorf("cuda: loading the kernels (%d bytes of fatbin) on %s: %w (cnnc compiles for sm_80 and sm_90, with PTX for newer GPUs)", len(fatbin), d.name, err)
	}
	if d.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
		d.mod.Unload()
		return fmt.Errorf("cuda: cuStreamCreate on %s: %w", d.name, err)
	}
	return nil
}

// do runs f on the worker and returns its error.
func (d *Device) do(f func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed
	}
	d.calls <- f
	return <-d.result
}

// Name is the GPU's name, compute capability and memory.
func (d *Device) Name() string { return d.name }

// Arch is the GPU's architecture, e.g. "sm_90".
func (d *Device) Arch() string { return d.arch }

// MemInfo returns the GPU's free and total memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	err = d.do(func() error {
		var err error
		if free, total, err = cu.MemInfo(); err != nil {
			return fmt.Errorf("cuda: cuMemGetInfo: %w", err)
		}
		return nil
	})
	return free, total, err
}

// Alloc makes one device allocation of bytes, after checking that they fit
// in the free memory (a *MemoryError says by how much they do not).
func (d *Device) Alloc(bytes int64) (device.Ptr, error) {
	if bytes < 0 {
		return 0, fmt.Errorf("cuda: cannot allocate %d bytes", bytes)
	}
	var p device.Ptr
	err := d.do(func() error {
		free, total, err := cu.MemInfo()
		if err != nil {
			return fmt.Errorf("cuda: cuMemGetInfo before allocating %d bytes: %w", bytes, err)
		}
		if bytes > free {
			return &MemoryError{Device: d.name, Want: bytes, Free: free, Total: total}
		}
		n := max(bytes, 1) // cuMemAlloc refuses 0
		ptr, err := cu.MemAlloc(n)
		if err != nil {
			return fmt.Errorf("cuda: cuMemAlloc of %d bytes (%d free of %d): %w", n, free, total, err)
		}
		p = device.Ptr(ptr)
		d.allocs[p] = n
		return nil
	})
	return p, err
}

// Free releases an allocation once the work issued so far is done.
func (d *Device) Free(p device.Ptr) error {
	return d.do(func() error {
		if _, ok := d.allocs[p]; !ok {
			return fmt.Errorf("cuda: Free(%#x): not an allocation of this device", uint64(p))
		}
		if err := d.sync("cuMemFree"); err != nil {
			return err
		}
		delete(d.allocs, p)
		if err := cu.MemFree(cu.DevicePtr(p)); err != nil {
			return fmt.Errorf("cuda: cuMemFree(%#x): %w", uint64(p), err)
		}
		return nil
	})
}

// inBounds checks that [p, p+n) lies inside one allocation.
func (d *Device) inBounds(op string, p device.Ptr, n int) error {
	for base, size := range d.allocs {
		if p >= base && uint64(p-base)+uint64(n) <= uint64(size) {
			return nil
		}
	}
	return fmt.Errorf("cuda: %s of %d bytes at %#x: outside every allocation of this device", op, n, uint64(p))
}

// CopyIn copies src to the device at dst, after the work issued so far,
// and returns when it has arrived.
func (d *Device) CopyIn(dst device.Ptr, src []byte) error { return d.copyIn(dst, src, false) }

// CopyOut copies len(dst) bytes from the device at src, after the work
// issued so far.
func (d *Device) CopyOut(dst []byte, src device.Ptr) error { return d.copyOut(dst, src, false) }

// CopyInAsync queues a copy of src, page-locked memory from AllocHost, to
// dst on the stream and returns at once (device.AsyncCopier): src must
// not change until the next Sync. Inside a Capture the copy becomes a node
// of the graph, reading src whenever the graph runs.
func (d *Device) CopyInAsync(dst device.Ptr, src []byte) error { return d.copyIn(dst, src, true) }

// CopyOutAsync queues a copy from src to dst, page-locked memory from
// AllocHost, and returns at once: dst holds the bytes after the next Sync.
// Inside a Capture the copy becomes a node of the graph.
func (d *Device) CopyOutAsync(dst []byte, src device.Ptr) error { return d.copyOut(dst, src, true) }

// copyIn queues a host-to-device copy on the stream; unless async it then
// waits for it. Asynchronous copies read page-locked memory only.
func (d *Device) copyIn(dst device.Ptr, src []byte, async bool) error {
	if len(src) == 0 {
		return nil
	}
	op := "CopyIn"
	if async {
		op = "CopyInAsync"
	}
	err := d.do(func() error {
		if err := d.inBounds(op, dst, len(src)); err != nil {
			return err
		}
		if async {
			if err := d.pinnedRange(op, src); err != nil {
				return err
			}
		}
		if err := cu.MemcpyHtoDAsync(cu.DevicePtr(dst), unsafe.Pointer(unsafe.SliceData(src)), int64(len(src)), d.stream); err != nil {
			return fmt.Errorf("cuda: cuMemcpyHtoDAsync of %d bytes to %#x: %w", len(src), uint64(dst), err)
		}
		if async {
			return nil
		}
		return d.sync("copying in")
	})
	goruntime.KeepAlive(src)
	return err
}

// copyOut is copyIn's other direction.
func (d *Device) copyOut(dst []byte, src device.Ptr, async bool) error {
	if len(dst) == 0 {
		return nil
	}
	op := "CopyOut"
	if async {
		op = "CopyOutAsync"
	}
	err := d.do(func() error {
		if err := d.inBounds(op, src, len(dst)); err != nil {
			return err
		}
		if async {
			if err := d.pinnedRange(op, dst); err != nil {
				return err
			}
		}
		if err := cu.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), cu.DevicePtr(src), int64(len(dst)), d.stream); err != nil {
			return fmt.Errorf("cuda: cuMemcpyDtoHAsync of %d bytes from %#x: %w", len(dst), uint64(src), err)
		}
		if async {
			return nil
		}
		return d.sync("copying out")
	})
	goruntime.KeepAlive(dst)
	return err
}

// Launch queues kernel on the device's stream. params are the 8-byte
// kernel parameters (pointer, int64, or float32 bits in the low 32). An
// error names the kernel (*device.LaunchError); a fault while the kernel
// runs is reported by the next Sync or copy, or by Launch itself in debug
// mode.
func (d *Device) Launch(kernel string, grid, block device.Dim3, sharedBytes int, params []uint64) error {
	return d.do(func() error { return d.launch(kernel, grid, block, sharedBytes, params) })
}

func (d *Device) launch(kernel string, grid, block device.Dim3, sharedBytes int, params []uint64) error {
	fail := func(format string, args ...any) error {
		return &device.LaunchError{Kernel: kernel, Err: fmt.Errorf(format, args...)}
	}
	f, err := d.function(kernel)
	if err != nil {
		return &device.LaunchError{Kernel: kernel, Err: err}
	}
	for i := range 3 {
		if grid[i] == 0 || block[i] == 0 {
			return fail("empty launch: grid %v, block %v", grid, block)
		}
	}
	if sharedBytes < 0 {
		return fail("negative dynamic shared memory %d", sharedBytes)
	}
	if sharedBytes > f.maxShared {
		static, err := f.fn.Attribute(cu.SharedSizeBytes)
		if err != nil {
			return fail("cuFuncGetAttribute(SHARED_SIZE_BYTES): %w", err)
		}
		if static+sharedBytes > d.optin {
			return fail("needs %d bytes of dynamic and %d of static shared memory per block; %s allows at most %d", sharedBytes, static, d.arch, d.optin)
		}
		if err := setMaxDynamicShared(f.fn, sharedBytes); err != nil {
			return fail("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %d): %w", sharedBytes, err)
		}
		f.maxShared = sharedBytes
	}
	if len(params) > len(d.args) {
		// cuLaunchKernel reads each parameter through a pointer; cu copies
		// the values to C memory before the call, so pointers into this Go
		// slice never reach C (cgo's pointer rules).
		d.args = make([]uint64, max(2*len(params), 32))
		d.argPtrs = make([]unsafe.Pointer, len(d.args))
		for i := range d.args {
			d.argPtrs[i] = unsafe.Pointer(&d.args[i])
		}
	}
	copy(d.args, params)
	err = f.fn.Launch(int(grid[0]), int(grid[1]), int(grid[2]), int(block[0]), int(block[1]), int(block[2]),
		sharedBytes, d.stream, d.argPtrs[:len(params)])
	if err != nil {
		return fail("cuLaunchKernel (grid %v, block %v, %d bytes dynamic shared memory, %d params): %w", grid, block, sharedBytes, len(params), err)
	}
	d.last = kernel
	if d.capture != nil {
		if err := d.recordCaptured(kernel, f, grid, block, sharedBytes, len(params)); err != nil {
			return fail("%w", err)
		}
	}
	if d.opts.Debug {
		if err := d.await(d.stream.Synchronize); err != nil {
			if w, ok := err.(watchStop); ok {
				return w.err
			}
			return fail("failed while running (grid %v, block %v, %d bytes dynamic shared memory, %d params; %s=1 checks every launch): %w", grid, block, sharedBytes, len(params), DebugEnv, err)
		}
	}
	return nil
}

// function looks kernel up in the module, once.
func (d *Device) function(kernel string) (*function, error) {
	if f, ok := d.funcs[kernel]; ok {
		return f, nil
	}
	fn, err := d.mod.Function(kernel)
	if err != nil {
		return nil, fmt.Errorf("cuModuleGetFunction: %w (is it an extern \"C\" kernel of the fatbin?)", err)
	}
	f := &function{fn: fn, maxShared: defaultMaxShared}
	d.funcs[kernel] = f
	return f, nil
}

// sync waits for the stream; a failure names the last kernel launched,
// the likely culprit of an asynchronous fault.
func (d *Device) sync(what string) error {
	err := d.await(d.stream.Synchronize)
	if err == nil {
		return nil
	}
	if w, ok := err.(watchStop); ok {
		return w.err
	}
	if d.last != "" && !d.opts.Debug {
		return fmt.Errorf("cuda: %s: cuStreamSynchronize: %w (the last kernel launched was %s; faults surface at the next synchronisation: run with %s=1 to check every launch and name the kernel)", what, err, d.last, DebugEnv)
	}
	return fmt.Errorf("cuda: %s: cuStreamSynchronize: %w", what, err)
}

// WatchWaits makes the device's host waits call check before and after
// they block (device.WaitWatcher); nil removes the check.
func (d *Device) WatchWaits(check func() error) error {
	return d.do(func() error {
		d.watch = check
		return nil
	})
}

// watchStop is the error of WatchWaits' check that ended a wait.
type watchStop struct{ err error }

func (w watchStop) Error() string { return w.err.Error() }

// await waits on the device's thread for work of the device, in the
// driver (block: cuStreamSynchronize, cuEventSynchronize). While
// WatchWaits has set a check, the check runs before the wait (a job that
// failed already waits for nothing) and after it: work that an abort of
// the communicator cut short (a collective whose peer died, ended from
// another thread by the job's watchdog) completes without having summed
// anything, and must not be taken for done. The wait itself blocks, as
// PyTorch's does beside its NCCL watchdog thread: a poll would wake the
// host late on every step. The check's error is returned as a watchStop,
// also in place of the driver's error of a wait that the abort ended.
func (d *Device) await(block func() error) error {
	if d.watch == nil {
		return block()
	}
	if err := d.watch(); err != nil {
		return watchStop{err}
	}
	err := block()
	if werr := d.watch(); werr != nil {
		return watchStop{werr}
	}
	return err
}

// OffThread runs f on an OS thread of its own with the device's context
// current, and waits for it: a way to make driver-dependent calls while
// the device's thread may be blocked — a watchdog's ncclCommAbort, which
// ends the collective the device's thread waits in. f must not call the
// device's methods, and OffThread must not be called after Close (it does
// not wait for the device's lock, which a blocked call holds). The thread
// ends with f (it is never reused with the context current).
func (d *Device) OffThread(f func() error) error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := d.ctx.makeCurrent(); err != nil {
			done <- fmt.Errorf("cuda: cuCtxSetCurrent on a thread of its own: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}

// Sync waits for every launch and copy issued so far.
func (d *Device) Sync() error {
	return d.do(func() error { return d.sync("Sync") })
}

// pinnedRange checks that b lies inside one AllocHost allocation.
func (d *Device) pinnedRange(op string, b []byte) error {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for base, n := range d.pinned {
		lo := uintptr(unsafe.Pointer(base))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(n) {
			return nil
		}
	}
	return fmt.Errorf("cuda: %s of %d bytes: the host memory is not from AllocHost (asynchronous copies need page-locked memory)", op, len(b))
}

// AllocHost returns bytes of page-locked host memory: copies from and to it
// run at full bus speed without the driver's staging copy. Free it with
// FreeHost (Close frees what is left).
func (d *Device) AllocHost(bytes int) ([]byte, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("cuda: cannot allocate %d bytes of pinned host memory", bytes)
	}
	var b []byte
	err := d.do(func() error {
		var err error
		if b, err = memHostAlloc(bytes); err != nil {
			return fmt.Errorf("cuda: cuMemHostAlloc of %d bytes: %w", bytes, err)
		}
		d.pinned[unsafe.SliceData(b)] = bytes
		return nil
	})
	return b, err
}

// FreeHost releases memory from AllocHost.
func (d *Device) FreeHost(b []byte) error {
	return d.do(func() error {
		p := unsafe.SliceData(b)
		if _, ok := d.pinned[p]; !ok {
			return errors.New("cuda: FreeHost: not memory from AllocHost")
		}
		delete(d.pinned, p)
		if err := memFreeHost(b); err != nil {
			return fmt.Errorf("cuda: cuMemFreeHost: %w", err)
		}
		return nil
	})
}

// Close waits for the device, frees what is still allocated and destroys
// the context. Later calls fail; a second Close returns nil.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.calls <- d.teardown
	err := <-d.result
	close(d.calls) // the worker returns and its thread ends
	d.closed = true
	return err
}

func (d *Device) teardown() error {
	var errs []error
	if err := d.sync("Close"); err != nil {
		errs = append(errs, err)
	}
	ptrs := make([]device.Ptr, 0, len(d.allocs))
	for p := range d.allocs {
		ptrs = append(ptrs, p)
	}
	sort.Slice(ptrs, func(i, j int) bool { return ptrs[i] < ptrs[j] })
	for _, p := range ptrs {
		if err := cu.MemFree(cu.DevicePtr(p)); err != nil {
			errs = append(errs, fmt.Errorf("cuda: cuMemFree(%#x): %w", uint64(p), err))
		}
	}
	clear(d.allocs)
	for p, n := range d.pinned {
		if err := memFreeHost(unsafe.Slice(p, n)); err != nil {
			errs = append(errs, fmt.Errorf("cuda: cuMemFreeHost: %w", err))
		}
	}
	clear(d.pinned)
	if err := d.stream.Destroy(); err != nil {
		errs = append(errs, fmt.Errorf("cuda: cuStreamDestroy: %w", err))
	}
	if err := d.mod.Unload(); err != nil {
		errs = append(errs, fmt.Errorf("cuda: cuModuleUnload: %w", err))
	}
	if err := d.ctx.destroy(); err != nil {
		errs = append(errs, fmt.Errorf("cuda: cuCtxDestroy: %w", err))
	}
	return errors.Join(errs...)
}
