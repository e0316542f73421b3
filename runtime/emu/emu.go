package emu

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"sync"
	"unsafe"
)

// Dim3 is a grid or block shape, as in CUDA. Every component must be at least 1.
type Dim3 struct{ X, Y, Z uint32 }

// Dim1 and Dim2 build shapes whose remaining components are 1.
func Dim1(x uint32) Dim3    { return Dim3{x, 1, 1} }
func Dim2(x, y uint32) Dim3 { return Dim3{x, y, 1} }

func (d Dim3) count() uint64 { return uint64(d.X) * uint64(d.Y) * uint64(d.Z) }

// Limits checked at launch; they are those of current NVIDIA GPUs, so a launch that the
// emulator accepts is also valid on the device.
const (
	MaxThreadsPerBlock = 1024
	MaxBlockDimZ       = 64
	MaxGridDimX        = 1<<31 - 1
	MaxGridDimYZ       = 65535
	MaxSharedBytes     = 227 << 10 // dynamic shared memory per block (sm_90 opt-in maximum)
)

var (
	// ErrClosed: the module was closed.
	ErrClosed = errors.New("emu: module is closed")
	// ErrUnknownKernel: no __global__ function of that name in the module.
	ErrUnknownKernel = errors.New("emu: unknown kernel")
	// ErrInvalidLaunch: bad grid/block shape, shared memory size or parameter count.
	ErrInvalidLaunch = errors.New("emu: invalid launch")
	// ErrKernelFailed: the kernel trapped, failed an assert or misused a barrier.
	ErrKernelFailed = errors.New("emu: kernel failed")
)

// KernelError is a failure inside a running kernel (errors.Is(err, ErrKernelFailed)).
type KernelError struct {
	Kernel string
	Msg    string // e.g. "__trap() in block (3,0,0) thread (17,0,0)"
}

func (e *KernelError) Error() string { return fmt.Sprintf("emu: kernel %s: %s", e.Kernel, e.Msg) }
func (e *KernelError) Unwrap() error { return ErrKernelFailed }

type kernel struct {
	entry   unsafe.Pointer // cnnc_emu_entry_<name>
	nparams int
}

// Module is a compiled CUDA C source loaded into the process. Its methods are safe for
// concurrent use; launches on one module may run at the same time.
type Module struct {
	mu      sync.RWMutex // Launch holds it shared, Close exclusively
	lib     *library     // nil once closed
	path    string
	kernels map[string]kernel
	flags   uint32
	workers int

	poolMu sync.Mutex
	idle   []unsafe.Pointer // worker contexts (fibers, stacks) not in use
	all    []unsafe.Pointer
}

// Compile compiles CUDA C source with the emulation header and loads it. name is the file
// name compiler messages (and AddressSanitizer reports) refer to, e.g. "conv2d.cu". Kernels
// are the non-template __global__ functions of the source; their parameters must be pointers
// or scalars of at most 8 bytes. Compiled libraries are cached by content, so compiling the
// same source again only loads it. A compiler failure is a *CompileError.
//
// When the program carries a library built from the same source (RegisterBuiltin) and opts
// ask for no other compiler, flags or debug build, Compile loads that one and runs no
// compiler at all: so a trainer runs where none is installed.
func Compile(src []byte, name string, opts Options) (*Module, error) {
	if lookup := builtinFor(src, opts); lookup != nil {
		lib, err := openBuiltin(lookup)
		if err != nil {
			return nil, err
		}
		return newModule(lib, "", findKernels(string(src)), opts)
	}
	path, names, err := buildLibrary(src, name, opts)
	if err != nil {
		return nil, err
	}
	lib, err := openLibrary(path)
	if err != nil {
		return nil, err
	}
	return newModule(lib, path, names, opts)
}

// newModule looks up the kernels' entry points in an open library.
func newModule(lib *library, path string, names []string, opts Options) (*Module, error) {
	m := &Module{lib: lib, path: path, kernels: map[string]kernel{}}
	for _, k := range names {
		entry, err := lib.symbol(entrySymbol(k))
		if err == nil {
			var count unsafe.Pointer
			if count, err = lib.symbol(paramsSymbol(k)); err == nil {
				m.kernels[k] = kernel{entry: entry, nparams: lib.paramCount(count)}
			}
		}
		if err != nil {
			lib.close()
			return nil, err
		}
	}
	if opts.Debug || opts.PoisonShared {
		m.flags |= flagFillShared
	}
	m.SetWorkers(opts.Workers)
	return m, nil
}

// Build compiles src as Compile does and returns the shared library's path without loading
// it, for a process that loads kernel libraries itself: the fake CUDA driver of
// internal/fakecuda, which runs them through the library's C API (cnnc_emu_launch_sync and
// the cnnc_emu_entry_<kernel> trampolines).
func Build(src []byte, name string, opts Options) (string, error) {
	path, _, err := buildLibrary(src, name, opts)
	return path, err
}

func buildLibrary(src []byte, name string, opts Options) (path string, kernels []string, err error) {
	name = sourceName(name)
	if err := checkSource(string(src), name); err != nil {
		return "", nil, err
	}
	kernels = findKernels(string(src))
	if len(kernels) == 0 {
		return "", nil, fmt.Errorf("emu: %s: no __global__ kernel found", name)
	}
	path, err = build(withTrampolines(string(src), kernels), name, opts)
	return path, kernels, err
}

// Launch flags; they must match cnnc_emu::kFlag* in cuda_emu.h.
const (
	flagFillShared   = 1
	flagReverse      = 2
	flagShuffle      = 4
	flagPoisonShared = 8
	flagSeedShift    = 8 // bits 8..31: the shuffle's seed
)

// Order is the order in which a launch runs the threads of each barrier interval of a block.
type Order uint8

const (
	// OrderForward runs warp by warp, each warp's lanes in order (the default).
	OrderForward Order = iota
	// OrderReverse runs the warps, and each warp's lanes, last first; and the grid's blocks last first.
	OrderReverse
	// OrderShuffle runs them in a random order drawn from Schedule.Seed, anew for every barrier
	// interval, warp and sweep; the grid's blocks in a permutation drawn from the seed.
	OrderShuffle
)

func (o Order) String() string {
	switch o {
	case OrderForward:
		return "forward"
	case OrderReverse:
		return "reverse"
	case OrderShuffle:
		return "shuffle"
	}
	return fmt.Sprintf("Order(%d)", uint8(o))
}

// Schedule is the race mode: how a module's launches order the threads of a block between
// barriers, and the blocks of the grid (reversed, or a seeded permutation). A correct kernel gives the same bits in every order; one that reads what another
// thread writes without a barrier (or warp synchronisation) in between, or that depends on the
// element layout of wmma fragments, does not. Under a schedule — forward included, so that runs
// compare — dynamic and static shared memory is filled with 0xFF bytes (NaN floats) at the start
// of every block, and the orders other than forward also give wmma fragments another (seeded)
// element layout.
type Schedule struct {
	Order Order
	Seed  uint32 // OrderShuffle: the permutations' seed (its low 24 bits)
}

// SetSchedule makes later launches run in race mode with the given order. It must not be called
// while launches of the module run.
func (m *Module) SetSchedule(s Schedule) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flags &= flagFillShared
	m.flags |= flagPoisonShared | (s.Seed&0xFFFFFF)<<flagSeedShift
	switch s.Order {
	case OrderReverse:
		m.flags |= flagReverse
	case OrderShuffle:
		m.flags |= flagShuffle
	}
}

// SetWorkers sets how many OS threads later launches run blocks on (n <= 0: GOMAXPROCS).
func (m *Module) SetWorkers(n int) {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	m.mu.Lock()
	m.workers = n
	m.mu.Unlock()
}

// Path is the compiled shared library; the .cu it was built from lies next to it. It is ""
// for a library built into the program.
func (m *Module) Path() string { return m.path }

// Builtin reports whether the module's library was built into the program (RegisterBuiltin)
// rather than compiled when the program ran.
func (m *Module) Builtin() bool { return m.path == "" }

// Kernels lists the module's kernel names, sorted.
func (m *Module) Kernels() []string {
	names := make([]string, 0, len(m.kernels))
	for k := range m.kernels {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// NumParams is the number of parameters of a kernel.
func (m *Module) NumParams(kernelName string) (int, error) {
	k, ok := m.kernels[kernelName]
	if !ok {
		return 0, fmt.Errorf("%w %q", ErrUnknownKernel, kernelName)
	}
	return k.nparams, nil
}

func checkLaunch(grid, block Dim3, sharedBytes int) error {
	switch {
	case grid.X == 0 || grid.Y == 0 || grid.Z == 0:
		return fmt.Errorf("grid %v has a zero dimension", grid)
	case block.X == 0 || block.Y == 0 || block.Z == 0:
		return fmt.Errorf("block %v has a zero dimension", block)
	case grid.X > MaxGridDimX || grid.Y > MaxGridDimYZ || grid.Z > MaxGridDimYZ:
		return fmt.Errorf("grid %v exceeds (%d,%d,%d)", grid, MaxGridDimX, MaxGridDimYZ, MaxGridDimYZ)
	case block.X > MaxThreadsPerBlock || block.Y > MaxThreadsPerBlock || block.Z > MaxBlockDimZ ||
		block.count() > MaxThreadsPerBlock:
		return fmt.Errorf("block %v: at most %d threads (z at most %d)", block, MaxThreadsPerBlock, MaxBlockDimZ)
	case sharedBytes < 0 || sharedBytes > MaxSharedBytes:
		return fmt.Errorf("dynamic shared memory %d bytes, must be 0..%d", sharedBytes, MaxSharedBytes)
	}
	return nil
}

// Launch runs a kernel and returns when it has finished, like cuLaunchKernel followed by a
// synchronize. params[i] is the 8-byte value of argument i: a Ptr, an integer, or float32 bits
// in the low 32 bits (see Arg helpers); only the bytes the parameter's type needs are read.
// Errors — unknown kernel, invalid shape, wrong parameter count, a kernel that traps or
// misuses a barrier — are returned, never panicked.
func (m *Module) Launch(kernelName string, grid, block Dim3, sharedBytes int, params []uint64) error {
	return m.launch(kernelName, grid, block, sharedBytes, params, nil)
}

// launch runs a kernel; prepare, if given, is called with the C launch before any block runs.
func (m *Module) launch(kernelName string, grid, block Dim3, sharedBytes int, params []uint64, prepare func(unsafe.Pointer) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.lib == nil {
		return ErrClosed
	}
	k, ok := m.kernels[kernelName]
	if !ok {
		return fmt.Errorf("%w %q (module has %v)", ErrUnknownKernel, kernelName, m.Kernels())
	}
	if err := checkLaunch(grid, block, sharedBytes); err != nil {
		return fmt.Errorf("%w of %s: %v", ErrInvalidLaunch, kernelName, err)
	}
	if len(params) != k.nparams {
		return fmt.Errorf("%w of %s: %d parameters given, kernel takes %d", ErrInvalidLaunch, kernelName, len(params), k.nparams)
	}
	cparams := newParams(params)
	if cparams == nil {
		return errors.New("emu: out of memory")
	}
	defer freeParams(cparams, len(params))
	launch := m.lib.newLaunch(k.entry, cparams, grid, block, sharedBytes, m.flags)
	if launch == nil {
		return fmt.Errorf("%w of %s: rejected by the runtime", ErrInvalidLaunch, kernelName)
	}
	defer m.lib.freeLaunch(launch)
	if prepare != nil {
		if err := prepare(launch); err != nil {
			return fmt.Errorf("%w of %s: %v", ErrInvalidLaunch, kernelName, err)
		}
	}

	n := uint64(m.workers)
	if blocks := grid.count(); blocks < n {
		n = blocks
	}
	workers := m.takeWorkers(int(n))
	if len(workers) == 0 {
		return errors.New("emu: out of memory for worker contexts")
	}
	var wg sync.WaitGroup
	for _, w := range workers[1:] {
		wg.Add(1)
		go func(w unsafe.Pointer) {
			defer wg.Done()
			m.lib.work(launch, w)
		}(w)
	}
	m.lib.work(launch, workers[0])
	wg.Wait()
	m.giveWorkers(workers)
	if msg := m.lib.launchFailure(launch); msg != "" {
		return &KernelError{Kernel: kernelName, Msg: msg}
	}
	return nil
}

// takeWorkers returns up to n worker contexts (at least one unless memory is exhausted).
func (m *Module) takeWorkers(n int) []unsafe.Pointer {
	m.poolMu.Lock()
	defer m.poolMu.Unlock()
	ws := make([]unsafe.Pointer, 0, n)
	for len(ws) < n {
		if k := len(m.idle); k > 0 {
			ws = append(ws, m.idle[k-1])
			m.idle = m.idle[:k-1]
			continue
		}
		w := m.lib.newWorker()
		if w == nil {
			break
		}
		m.all = append(m.all, w)
		ws = append(ws, w)
	}
	return ws
}

func (m *Module) giveWorkers(ws []unsafe.Pointer) {
	m.poolMu.Lock()
	m.idle = append(m.idle, ws...)
	m.poolMu.Unlock()
}

// Close waits for running launches, frees the module's threads' stacks and unloads it.
// Memory from Alloc is not affected. Closing twice is harmless.
func (m *Module) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lib == nil {
		return nil
	}
	m.poolMu.Lock()
	for _, w := range m.all {
		m.lib.freeWorker(w)
	}
	m.all, m.idle = nil, nil
	m.poolMu.Unlock()
	m.lib.close()
	m.lib = nil
	return nil
}

// Argument helpers: the 8-byte parameter values Launch takes.

// ArgPtr passes a device pointer.
func ArgPtr(p Ptr) uint64 { return uint64(p) }

// ArgInt passes an int, long long or any other integer parameter (two's complement).
func ArgInt(v int64) uint64 { return uint64(v) }

// ArgF32 passes a float parameter.
func ArgF32(f float32) uint64 { return uint64(math.Float32bits(f)) }

// ArgF64 passes a double parameter.
func ArgF64(f float64) uint64 { return math.Float64bits(f) }

// Args converts Ptr, int, int32, int64, uint32, uint64, float32 and float64 values to
// parameter values.
func Args(vals ...any) ([]uint64, error) {
	out := make([]uint64, len(vals))
	for i, v := range vals {
		switch v := v.(type) {
		case Ptr:
			out[i] = ArgPtr(v)
		case int:
			out[i] = ArgInt(int64(v))
		case int32:
			out[i] = ArgInt(int64(v))
		case int64:
			out[i] = ArgInt(v)
		case uint32:
			out[i] = uint64(v)
		case uint64:
			out[i] = v
		case float32:
			out[i] = ArgF32(v)
		case float64:
			out[i] = ArgF64(v)
		default:
			return nil, fmt.Errorf("emu: argument %d: unsupported type %T", i, v)
		}
	}
	return out, nil
}
