// Package nccl is cnnc's binding to NVIDIA's NCCL, the library that sums gradients across GPUs,
// loaded at run time.
//
// In: the library, found as libnccl.so.2 on the dynamic loader's path (or at
// $CNNC_NCCL_LIBRARY); device buffers and CUDA streams as raw addresses (uintptr: a
// CUdeviceptr, a CUstream — cudaStream_t is the driver's CUstream). Out: communicators and the
// calls data-parallel training needs: the unique id, CommInitRank, AllReduce (sum), Broadcast
// (a sharded optimizer's parameters and state, from the rank that holds them), groups,
// Destroy/Abort (and AbortOn: abort when a job's watch says a rank died, which NCCL's
// collectives would wait for forever), errors with NCCL's own words.
//
// Why at run time (dlopen, as a driver is loaded): NCCL is needed only to train on several
// GPUs, so building cnnc, and training on one GPU or on the CPU, needs neither NCCL nor its
// headers; the few types and functions used are declared here from NCCL's public nccl.h
// (NVIDIA/nccl, src/nccl.h.in), whose values are NCCL's ABI. A missing library is an error
// that names it and how to install it (MissingError). No build tag: the package links neither
// NCCL nor the CUDA driver (streams are plain addresses), so it builds, and its tests run,
// everywhere — without GPUs under the fake libnccl (internal/fakenccl).
//
// Threads: NCCL's groups belong to the calling OS thread, and on a GPU every call needs the
// device's context current on the calling thread. Group locks the goroutine to its thread for
// the group; with runtime/cuda, make the calls inside the device's OnStream, which runs on the
// device's thread and hands over its stream.
package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// ncclUniqueId, from nccl.h: NCCL_UNIQUE_ID_BYTES = 128, passed by value.
typedef struct { char internal[128]; } cnnc_nccl_id;

// NCCL's functions are reached through dlsym'd pointers, which cgo cannot call: these shims
// call them. Enumerations (ncclResult_t, ncclDataType_t, ncclRedOp_t) are ints in the C ABI.
static void* cnnc_nccl_open(const char* path, char* err, size_t n) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) snprintf(err, n, "%s", dlerror());
	return h;
}

static void* cnnc_nccl_sym(void* h, const char* name) { return dlsym(h, name); }

static int cnnc_nccl_get_version(void* f, int* v) { return ((int (*)(int*))f)(v); }

static int cnnc_nccl_get_unique_id(void* f, cnnc_nccl_id* id) { return ((int (*)(cnnc_nccl_id*))f)(id); }

static int cnnc_nccl_comm_init_rank(void* f, void** comm, int nranks, const cnnc_nccl_id* id, int rank) {
	return ((int (*)(void**, int, cnnc_nccl_id, int))f)(comm, nranks, *id, rank);
}

static int cnnc_nccl_comm_call(void* f, void* comm) { return ((int (*)(void*))f)(comm); }

static int cnnc_nccl_async_error(void* f, void* comm, int* e) { return ((int (*)(void*, int*))f)(comm, e); }

static int cnnc_nccl_all_reduce(void* f, uintptr_t send, uintptr_t recv, size_t count, int type, int op, void* comm,
                                uintptr_t stream) {
	return ((int (*)(const void*, void*, size_t, int, int, void*, void*))f)(
	    (const void*)send, (void*)recv, count, type, op, comm, (void*)stream);
}

static int cnnc_nccl_broadcast(void* f, uintptr_t send, uintptr_t recv, size_t count, int type, int root, void* comm,
                               uintptr_t stream) {
	return ((int (*)(const void*, void*, size_t, int, int, void*, void*))f)(
	    (const void*)send, (void*)recv, count, type, root, comm, (void*)stream);
}

static int cnnc_nccl_void_call(void* f) { return ((int (*)(void))f)(); }

static const char* cnnc_nccl_error_string(void* f, int r) { return ((const char* (*)(int))f)(r); }

static const char* cnnc_nccl_last_error(void* f, void* comm) { return ((const char* (*)(void*))f)(comm); }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// LibraryEnv names the NCCL library to load instead of libnccl.so.2 on the loader's path.
const LibraryEnv = "CNNC_NCCL_LIBRARY"

// DefaultLibrary is NCCL's soname, found through LD_LIBRARY_PATH and the system's library path.
const DefaultLibrary = "libnccl.so.2"

// UniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const UniqueIDBytes = 128

// UniqueID is ncclUniqueId: made by one rank (rank 0), handed to every rank before
// CommInitRank (runtime/dist does it over TCP).
type UniqueID [UniqueIDBytes]byte

// Version is NCCL's version, decoded from NCCL_VERSION_CODE.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// versionFromCode undoes NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 +
// Z since 2.9.
func versionFromCode(code int) Version {
	if code >= 10000 {
		return Version{code / 10000, code % 10000 / 100, code % 100}
	}
	return Version{code / 1000, code % 1000 / 100, code % 100}
}

// Library is a loaded NCCL.
type Library struct {
	path    string
	version Version
	f       functions
}

// functions are the entry points used; lastError is nil before NCCL 2.13.
type functions struct {
	getVersion, getUniqueID, commInitRank, commDestroy, commAbort, commGetAsyncError unsafe.Pointer
	allReduce, broadcast, groupStart, groupEnd, getErrorString, lastError            unsafe.Pointer
}

var (
	loadOnce sync.Once
	loaded   *Library
	loadErr  error
)

// Load loads NCCL once per process: $CNNC_NCCL_LIBRARY when set, else libnccl.so.2.
func Load() (*Library, error) {
	loadOnce.Do(func() {
		path := os.Getenv(LibraryEnv)
		if path == "" {
			path = DefaultLibrary
		}
		loaded, loadErr = Open(path)
	})
	return loaded, loadErr
}

// MissingError says NCCL could not be loaded, and how to install it.
type MissingError struct {
	Library string // what was opened: a soname or a path
	Reason  string // the dynamic loader's words, or the missing symbol
}

func (e *MissingError) Error() string {
	return fmt.Sprintf(`nccl: cannot load %s: %s
NCCL (NVIDIA's collective communication library) is needed to train on more than one GPU;
one GPU, or the CPU, needs none. Install it, then run again:
  - NVIDIA's package: apt-get install libnccl2 (from NVIDIA's CUDA repository for your
    distribution: https://developer.nvidia.com/nccl), or
  - the pip wheel: pip install nvidia-nccl-cu12, with its lib directory on LD_LIBRARY_PATH:
    export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))'):$LD_LIBRARY_PATH
or set %s to the library's path.`, e.Library, e.Reason, LibraryEnv)
}

// Open loads the NCCL library at path (a file, or a soname the loader searches for). A
// library is never unloaded: NCCL keeps threads running.
func Open(path string) (*Library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	h := C.cnnc_nccl_open(cpath, &msg[0], C.size_t(len(msg)))
	if h == nil {
		return nil, &MissingError{Library: path, Reason: C.GoString(&msg[0])}
	}
	l := &Library{path: path}
	required := []struct {
		name string
		p    *unsafe.Pointer
	}{
		{"ncclGetVersion", &l.f.getVersion},
		{"ncclGetUniqueId", &l.f.getUniqueID},
		{"ncclCommInitRank", &l.f.commInitRank},
		{"ncclCommDestroy", &l.f.commDestroy},
		{"ncclCommAbort", &l.f.commAbort},
		{"ncclCommGetAsyncError", &l.f.commGetAsyncError},
		{"ncclAllReduce", &l.f.allReduce},
		{"ncclBroadcast", &l.f.broadcast},
		{"ncclGroupStart", &l.f.groupStart},
		{"ncclGroupEnd", &l.f.groupEnd},
		{"ncclGetErrorString", &l.f.getErrorString},
	}
	for _, s := range required {
		if *s.p = sym(h, s.name); *s.p == nil {
			return nil, &MissingError{Library: path, Reason: fmt.Sprintf("it has no %s: not NCCL, or older than 2.4", s.name)}
		}
	}
	l.f.lastError = sym(h, "ncclGetLastError") // NCCL 2.13+
	var code C.int
	if err := l.check("ncclGetVersion", nil, C.cnnc_nccl_get_version(l.f.getVersion, &code)); err != nil {
		return nil, err
	}
	l.version = versionFromCode(int(code))
	return l, nil
}

func sym(h unsafe.Pointer, name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.cnnc_nccl_sym(h, cname)
}

// Path is the library as it was opened.
func (l *Library) Path() string { return l.path }

// Version is the library's version (ncclGetVersion).
func (l *Library) Version() Version { return l.version }

// UniqueID makes the id of a new communicator (on one rank; every rank then joins with it).
func (l *Library) UniqueID() (UniqueID, error) {
	var id UniqueID
	r := C.cnnc_nccl_get_unique_id(l.f.getUniqueID, (*C.cnnc_nccl_id)(unsafe.Pointer(&id[0])))
	return id, l.check("ncclGetUniqueId", nil, r)
}

// CommInitRank joins communicator id as rank of nranks. It returns when every rank has joined
// (NCCL synchronises them); on a GPU the device must be current on the calling thread.
func (l *Library) CommInitRank(id UniqueID, nranks, rank int) (*Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("nccl: rank %d of %d ranks: the rank must be in [0, %d)", rank, nranks, nranks)
	}
	var c unsafe.Pointer
	r := C.cnnc_nccl_comm_init_rank(l.f.commInitRank, &c, C.int(nranks), (*C.cnnc_nccl_id)(unsafe.Pointer(&id[0])), C.int(rank))
	if err := l.check("ncclCommInitRank", nil, r); err != nil {
		return nil, fmt.Errorf("rank %d of %d: %w", rank, nranks, err)
	}
	return &Comm{lib: l, c: c, rank: rank, size: nranks}, nil
}

// GroupStart begins a group on the calling OS thread: collectives issued until GroupEnd (on
// the same thread) are launched together. Group is the safer form.
func (l *Library) GroupStart() error {
	return l.check("ncclGroupStart", nil, C.cnnc_nccl_void_call(l.f.groupStart))
}

// GroupEnd ends the calling thread's group and launches its collectives.
func (l *Library) GroupEnd() error {
	return l.check("ncclGroupEnd", nil, C.cnnc_nccl_void_call(l.f.groupEnd))
}

// Group runs f between GroupStart and GroupEnd with the goroutine locked to its OS thread, as
// NCCL's groups require; the group is ended even when f fails.
func (l *Library) Group(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := l.GroupStart(); err != nil {
		return err
	}
	ferr := f()
	if err := l.GroupEnd(); ferr == nil {
		ferr = err
	}
	return ferr
}

// Result is ncclResult_t.
type Result int

// NCCL's results, from nccl.h.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8 // NCCL 2.28+
)

var resultNames = [...]string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout"}

func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

// Error is a failed NCCL call, in NCCL's words.
type Error struct {
	Call   string // "ncclAllReduce"
	Result Result
	Text   string // ncclGetErrorString
	// Detail is ncclGetLastError (NCCL 2.13+), read right after the call. NCCL keeps one last
	// error per process: calls failing at once in several threads may see each other's.
	Detail string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s: %s (%s)", e.Call, e.Result, e.Text)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// check turns a result into an *Error, asking NCCL for its words right away (the last error
// is the process's: a later failure would replace it).
func (l *Library) check(call string, comm unsafe.Pointer, r C.int) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Result: Result(r), Text: C.GoString(C.cnnc_nccl_error_string(l.f.getErrorString, r))}
	if l.f.lastError != nil {
		e.Detail = C.GoString(C.cnnc_nccl_last_error(l.f.lastError, comm))
	}
	return e
}

// DataType is ncclDataType_t.
type DataType int

// NCCL's data types, from nccl.h (Bfloat16 since NCCL 2.10).
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	Bfloat16 DataType = 9
)

var typeInfo = [...]struct {
	name string
	size int
}{{"int8", 1}, {"uint8", 1}, {"int32", 4}, {"uint32", 4}, {"int64", 8}, {"uint64", 8},
	{"float16", 2}, {"float32", 4}, {"float64", 8}, {"bfloat16", 2}}

func (t DataType) valid() bool { return t >= 0 && int(t) < len(typeInfo) }

// Size is the bytes of one element.
func (t DataType) Size() int {
	if !t.valid() {
		return 0
	}
	return typeInfo[t].size
}

func (t DataType) String() string {
	if !t.valid() {
		return fmt.Sprintf("ncclDataType(%d)", int(t))
	}
	return typeInfo[t].name
}

// Op is ncclRedOp_t.
type Op int

// NCCL's reductions, from nccl.h (Avg since NCCL 2.10).
const (
	Sum  Op = 0
	Prod Op = 1
	Max  Op = 2
	Min  Op = 3
	Avg  Op = 4
)

func (o Op) String() string {
	if names := [...]string{"sum", "prod", "max", "min", "avg"}; o >= 0 && int(o) < len(names) {
		return names[o]
	}
	return fmt.Sprintf("ncclRedOp(%d)", int(o))
}

// Comm is a communicator: this process's rank among Size.
type Comm struct {
	lib        *Library
	rank, size int

	mu   sync.Mutex
	c    unsafe.Pointer // ncclComm_t; nil once destroyed or aborted
	gone string         // "destroyed" or "aborted"
	// failure is the asynchronous error AbortOn's watchdog aborted for
	failure error
}

// Rank is this process's rank in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Library is the NCCL the communicator belongs to.
func (c *Comm) Library() *Library { return c.lib }

func (c *Comm) handle(call string) (unsafe.Pointer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return nil, fmt.Errorf("nccl: %s on rank %d: the communicator was %s", call, c.rank, c.gone)
	}
	return c.c, nil
}

// AllReduce enqueues on stream the reduction op of count elements of type t at send across
// every rank, leaving the result at recv on every rank (send == recv: in place). send and recv
// are device addresses (CUdeviceptr), stream a CUstream (0: the legacy stream). It returns once
// the collective is enqueued; it has finished when the stream has (see Wait).
func (c *Comm) AllReduce(send, recv uintptr, count int, t DataType, op Op, stream uintptr) error {
	if count < 0 {
		return fmt.Errorf("nccl: AllReduce of %d elements", count)
	}
	if !t.valid() {
		return fmt.Errorf("nccl: AllReduce of unknown data type %d", int(t))
	}
	if t == Bfloat16 && !c.lib.version.AtLeast(2, 10) {
		return fmt.Errorf("nccl: AllReduce of bfloat16 needs NCCL 2.10 or newer; %s is %s", c.lib.path, c.lib.version)
	}
	h, err := c.handle("AllReduce")
	if err != nil {
		return err
	}
	r := C.cnnc_nccl_all_reduce(c.lib.f.allReduce, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count),
		C.int(t), C.int(op), h, C.uintptr_t(stream))
	return c.lib.check("ncclAllReduce", h, r)
}

// Broadcast enqueues on stream the copy of count elements of type t at send on rank root to
// recv on every rank (send is read on root only; send == recv: in place). Like AllReduce it
// returns once the collective is enqueued.
func (c *Comm) Broadcast(send, recv uintptr, count int, t DataType, root int, stream uintptr) error {
	if count < 0 {
		return fmt.Errorf("nccl: Broadcast of %d elements", count)
	}
	if !t.valid() {
		return fmt.Errorf("nccl: Broadcast of unknown data type %d", int(t))
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("nccl: Broadcast from rank %d of %d ranks", root, c.size)
	}
	h, err := c.handle("Broadcast")
	if err != nil {
		return err
	}
	r := C.cnnc_nccl_broadcast(c.lib.f.broadcast, C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count),
		C.int(t), C.int(root), h, C.uintptr_t(stream))
	return c.lib.check("ncclBroadcast", h, r)
}

// AsyncError is the communicator's asynchronous error (ncclCommGetAsyncError): how NCCL
// reports a failure after the call that enqueued the work, such as a rank that died — though
// not always: over NVLink a dead peer may leave it ncclSuccess while collectives wait forever
// (AbortOn is the way out then). It holds the communicator against Abort from another
// goroutine (which frees it) during the call.
func (c *Comm) AsyncError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.c
	if h == nil {
		return fmt.Errorf("nccl: AsyncError on rank %d: the communicator was %s", c.rank, c.gone)
	}
	var e C.int
	if err := c.lib.check("ncclCommGetAsyncError", h, C.cnnc_nccl_async_error(c.lib.f.commGetAsyncError, h, &e)); err != nil {
		return err
	}
	return c.lib.check("the communicator's asynchronous error", h, e)
}

// Wait waits for enqueued collectives to finish without hanging on a rank that died: it polls
// done (whether the stream has finished, e.g. cuStreamQuery) and the asynchronous error, and
// on an error or after timeout aborts the communicator (which ends its work on every
// rank) and returns why. done's own error is returned as it is, after the abort.
func (c *Comm) Wait(done func() (bool, error), timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pause := 50 * time.Microsecond
	for {
		ok, err := done()
		if err == nil && ok {
			return nil
		}
		if err == nil {
			err = c.AsyncError()
		}
		if err == nil && time.Now().After(deadline) {
			err = fmt.Errorf("nccl: rank %d: collectives did not finish within %v (a rank died or stopped calling them?)", c.rank, timeout)
		}
		if err != nil {
			if aerr := c.Abort(); aerr != nil {
				err = errors.Join(err, aerr)
			}
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// asyncErrorEvery is how often AbortOn's watchdog reads the communicator's asynchronous error
// while the job is alive (PyTorch's NCCL watchdog polls every 100 ms as well).
const asyncErrorEvery = 100 * time.Millisecond

// AbortOn is the communicator's watchdog: it aborts the communicator when done is closed — a
// job's watch of its ranks saying one died (runtime/dist.Session.Done) — or when the
// communicator's asynchronous error (read every asyncErrorEvery) reports a failure, so that a
// collective waiting for a dead rank returns with an error (called on the host), or its
// kernels end (queued on a GPU's stream) and the host's blocking wait for them returns,
// instead of waiting forever, as NCCL's do for a dead peer. The abort is made through on
// (nil: from the watching goroutine): on a GPU, a thread of its own with the device's
// context current (the device's thread may be the one blocked). The asynchronous error that
// caused an abort is then Failure's. stop ends the watch, after an abort in progress.
func (c *Comm) AbortOn(done <-chan struct{}, on func(func() error) error) (stop func()) {
	if on == nil {
		on = func(f func() error) error { return f() }
	}
	quit, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(asyncErrorEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				on(c.Abort) // its error is no news: the job failed already
				return
			case <-quit:
				return
			case <-tick.C:
				if err := c.AsyncError(); err != nil {
					c.fail(err)
					on(c.Abort)
					return
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-ended
	}
}

// fail records the asynchronous error that made AbortOn's watchdog abort the communicator.
func (c *Comm) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure == nil {
		c.failure = err
	}
}

// Failure is the asynchronous error for which AbortOn's watchdog aborted the communicator, or
// nil: what a wait that the abort ended reports.
func (c *Comm) Failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failure
}

// Destroy frees the communicator once its work has finished (ncclCommDestroy). It must not
// race with other calls on c.
func (c *Comm) Destroy() error { return c.release("ncclCommDestroy", c.lib.f.commDestroy, "destroyed") }

// Abort stops the communicator's work and frees it (ncclCommAbort). Unlike Destroy it may be
// called while another goroutine is in a call on c — the way out of a collective that waits
// for a rank that died.
func (c *Comm) Abort() error { return c.release("ncclCommAbort", c.lib.f.commAbort, "aborted") }

func (c *Comm) release(call string, f unsafe.Pointer, gone string) error {
	c.mu.Lock()
	h := c.c
	if h == nil {
		c.mu.Unlock()
		return nil // released once already
	}
	c.c, c.gone = nil, gone
	c.mu.Unlock()
	return c.lib.check(call, nil, C.cnnc_nccl_comm_call(f, h))
}
