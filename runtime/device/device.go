package device

import (
	"fmt"
	"time"
)

// Ptr is a device address: a CUDA device pointer, or the address of the
// CPU emulator's memory.
type Ptr uint64

// Dim3 is a grid or block shape.
type Dim3 [3]uint32

// Device is what generated code runs on. Both backends launch identically:
// a kernel by name with grid, block, dynamic shared bytes and one 8-byte
// value per kernel parameter (a pointer, an int64, or float32 bits in the
// low 32 bits) — exactly cuLaunchKernel's kernelParams.
type Device interface {
	// Name says which device this is, for messages.
	Name() string
	Alloc(bytes int64) (Ptr, error)
	Free(Ptr) error
	CopyIn(dst Ptr, src []byte) error
	CopyOut(dst []byte, src Ptr) error
	Launch(kernel string, grid, block Dim3, sharedBytes int, params []uint64) error
	// Sync waits for every launch issued so far.
	Sync() error
	Close() error
}

// LaunchError names the kernel a failed launch ran.
type LaunchError struct {
	Kernel string
	Err    error
}

func (e *LaunchError) Error() string { return fmt.Sprintf("kernel %s: %v", e.Kernel, e.Err) }
func (e *LaunchError) Unwrap() error { return e.Err }

// Timer is what a device offers when it can time device work more finely
// than the wall clock: the CUDA backend records CUDA events around run's
// launches. Profiles use it when present.
type Timer interface {
	TimeLaunches(run func() error) (time.Duration, error)
}

// HostAllocator is what a device offers when it has page-locked host
// memory, which copies to and from the device read at full bus speed
// without a staging copy of the driver's (CUDA's cuMemHostAlloc). The
// trainer stages its batch uploads there.
type HostAllocator interface {
	AllocHost(bytes int) ([]byte, error)
	FreeHost(b []byte) error
}

// AsyncCopier is what a device offers when it can queue copies between
// its memory and page-locked host memory (from its HostAllocator) on its
// stream without waiting for them: they are ordered with the launches,
// complete at the next Sync, and can be captured into a graph, so that a
// training step's uploads and read-backs travel inside its graph.
type AsyncCopier interface {
	CopyInAsync(dst Ptr, src []byte) error
	CopyOutAsync(dst []byte, src Ptr) error
}

// Fencer is what a device offers when it can mark points in its queue of
// work and wait for them without waiting for everything (CUDA events): the
// trainer keeps a step queued while the host prepares the next, and waits
// only for the step whose staging buffer it is about to refill.
type Fencer interface {
	// NewFence makes a fence; with timing, Since can measure between two.
	NewFence(timing bool) (Fence, error)
}

// Fence is a mark in a device's queue.
type Fence interface {
	// Record places the mark after the work queued so far. Inside a
	// graph capture (Grapher) it becomes part of the graph: the mark is
	// placed again whenever the graph runs, without a call of its own.
	Record() error
	// Wait returns when the work queued before the last Record has
	// finished (at once when the fence was never recorded).
	Wait() error
	// Since is the device time from earlier's mark to this fence's mark;
	// both must have been recorded, waited for and made with timing.
	Since(earlier Fence) (time.Duration, error)
	Close() error
}

// Grapher is what a device offers when it can capture a sequence of
// launches once and replay it with one call (CUDA graphs).
type Grapher interface {
	CaptureGraph(run func() error) (Replayer, error)
}

// Replayer is a captured sequence of launches. Each launch keeps the
// parameter values it had when captured until SetParams changes them, so
// values that change between replays (the step number, a learning rate)
// are set before each Replay.
type Replayer interface {
	Replay() error
	// SetParams replaces the parameter values of the i-th launch captured
	// (same kernel, same number of parameters) for later replays.
	SetParams(i int, params []uint64) error
	Close() error
}

// SideStreamer is what a device offers when it can run work of a library
// of its own (NCCL's collectives) on a second stream, ordered with the
// device's stream by events (CUDA streams and events): a data-parallel
// trainer sums each gradient bucket there as soon as the launch writing
// its last gradient is queued, while the device's stream goes on with the
// backward pass. NewSideStream makes the stream with marks marks.
type SideStreamer interface {
	NewSideStream(marks int) (SideStream, error)
}

// SideStream is a second stream of a device. Its ordering calls act on
// the work queued so far, as cuEventRecord followed by cuStreamWaitEvent
// do: none waits on the host.
type SideStream interface {
	// WaitForDevice makes the work queued next on the side stream wait
	// for the work queued on the device's stream so far.
	WaitForDevice() error
	// Run calls f on the device's thread (where its context is current)
	// with the side stream, a CUstream as an address, for f to queue a
	// library's work on it. f must not call the device's methods.
	Run(f func(stream uintptr) error) error
	// Mark places mark i (0 <= i < marks) after the work queued on the
	// side stream so far; DeviceWaits(i) makes the work queued next on the
	// device's stream wait for the work before mark i's last placing.
	Mark(i int) error
	DeviceWaits(i int) error
	Close() error
}

// WaitWatcher is what a device offers when its host waits — Sync, a
// Fence's Wait, the copies that wait, a SideStream's Close, a Timer's
// wait — can be watched: a data-parallel rank's waits cover collectives
// queued on the device, which wait forever for a rank that died until a
// watchdog aborts the communicator (nccl.Comm.AbortOn), and a wait that
// the abort ended must not be taken for finished work. WatchWaits sets
// check (nil: no check); it is called on the device's thread, where the
// device's context is current, before each wait blocks and after it
// returns: its error ends the wait and is returned as it is.
type WaitWatcher interface {
	WatchWaits(check func() error) error
}
