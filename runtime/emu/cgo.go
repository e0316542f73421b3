package emu

// All C calls of the package live here. Kernel libraries are reached only through dlsym'd
// function pointers, which cgo cannot call directly, hence the small emu_call_* shims.
// Raw addresses (Ptr) are turned into C pointers on the C side, so the Go side never converts
// a uintptr to unsafe.Pointer.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

// Process-wide pool of fiber stacks, lent to every module's workers for the duration of a
// launch (see cuda_emu.h): the number of stacks, and of guard-page memory areas, follows the
// peak demand of concurrent launches, not the number of modules. ASan frames are larger, and
// its reports run on the faulting fiber's stack.
#if defined(__SANITIZE_ADDRESS__)
#define EMU_STACK_SIZE (1u << 20)
#else
#define EMU_STACK_SIZE (256u << 10)
#endif
static pthread_mutex_t emu_stack_mu = PTHREAD_MUTEX_INITIALIZER;
static void** emu_stack_free;
static size_t emu_stack_nfree, emu_stack_cap;

static void* emu_stack_acquire(size_t* size) {
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	*size = EMU_STACK_SIZE;
	pthread_mutex_lock(&emu_stack_mu);
	void* lo = emu_stack_nfree ? emu_stack_free[--emu_stack_nfree] : NULL;
	pthread_mutex_unlock(&emu_stack_mu);
	if (lo) return lo;
	char* base = mmap(NULL, EMU_STACK_SIZE + page, PROT_READ | PROT_WRITE,
	                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
	if (base == MAP_FAILED) return NULL;
	mprotect(base, page, PROT_NONE); // guard page: an overflow faults
	return base + page;
}

static void emu_stack_release(void* lo, size_t size) {
	pthread_mutex_lock(&emu_stack_mu);
	if (emu_stack_nfree == emu_stack_cap) {
		size_t cap = emu_stack_cap ? 2 * emu_stack_cap : 256;
		void** grown = realloc(emu_stack_free, cap * sizeof(void*));
		if (!grown) {
			pthread_mutex_unlock(&emu_stack_mu);
			size_t page = (size_t)sysconf(_SC_PAGESIZE);
			munmap((char*)lo - page, size + page);
			return;
		}
		emu_stack_free = grown;
		emu_stack_cap = cap;
	}
	emu_stack_free[emu_stack_nfree++] = lo;
	pthread_mutex_unlock(&emu_stack_mu);
}

static void emu_set_stack_provider(void* fn) {
	((void (*)(void* (*)(size_t*), void (*)(void*, size_t)))fn)(emu_stack_acquire, emu_stack_release);
}

typedef void (*emu_entry_fn)(void**);

static void* emu_dlopen(const char* path, char** err) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	*err = h ? NULL : dlerror();
	return h;
}
static void* emu_dlsym(void* h, const char* name) { return dlsym(h, name); }
// A library built into the program has a lookup function instead of a handle (builtin.go).
static void* emu_builtin_lookup(void* fn, const char* name) { return ((void* (*)(const char*))fn)(name); }
static int emu_dlclose(void* h) { return dlclose(h); }

static int emu_call_int(void* fn) { return ((int (*)(void))fn)(); }
static void* emu_worker_new(void* fn) { return ((void* (*)(void))fn)(); }
static void emu_worker_free(void* fn, void* w) { ((void (*)(void*))fn)(w); }
static void* emu_launch_new(void* fn, void* entry, void** params, uint32_t gx, uint32_t gy, uint32_t gz,
                            uint32_t bx, uint32_t by, uint32_t bz, uint64_t shared, uint32_t flags) {
	uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
	return ((void* (*)(emu_entry_fn, void**, const uint32_t*, const uint32_t*, uint64_t, uint32_t))fn)(
		(emu_entry_fn)entry, params, grid, block, shared, flags);
}
static void emu_launch_work(void* fn, void* launch, void* worker) { ((void (*)(void*, void*))fn)(launch, worker); }
static const char* emu_launch_error(void* fn, void* launch) { return ((const char* (*)(void*))fn)(launch); }
static void emu_launch_free(void* fn, void* launch) { ((void (*)(void*))fn)(launch); }

// Parameter block as cuLaunchKernel takes it: n 8-byte values followed by n pointers to them.
static void** emu_params_new(const uint64_t* vals, int n) {
	uint64_t* block = (uint64_t*)malloc((size_t)(n > 0 ? n : 1) * 16);
	if (!block) return NULL;
	void** ptrs = (void**)(block + n);
	for (int i = 0; i < n; i++) {
		block[i] = vals[i];
		ptrs[i] = &block[i];
	}
	return ptrs;
}
static void emu_params_free(void** ptrs, int n) {
	if (ptrs) free((uint64_t*)ptrs - n);
}

static uintptr_t emu_alloc(size_t n) {
	void* p = NULL;
	if (posix_memalign(&p, 256, n) != 0) return 0;
	return (uintptr_t)p;
}
static void emu_free(uintptr_t p) { free((void*)p); }
static void emu_copy_in(uintptr_t dst, const void* src, size_t n) { memcpy((void*)dst, src, n); }
static void emu_copy_out(void* dst, uintptr_t src, size_t n) { memcpy(dst, (const void*)src, n); }
static void emu_memset(uintptr_t dst, int v, size_t n) { memset((void*)dst, v, n); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// library is an open kernel library and the entry points of its runtime: a shared library
// (handle, from dlopen) or one built into the program (builtin, its lookup function).
type library struct {
	handle, builtin                                unsafe.Pointer
	workerNew, workerFree                          unsafe.Pointer
	launchNew, launchWork, launchError, launchFree unsafe.Pointer
}

func openLibrary(path string) (*library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	h := C.emu_dlopen(cpath, &cerr)
	if h == nil {
		return nil, fmt.Errorf("emu: dlopen %s: %s", path, C.GoString(cerr))
	}
	lib := &library{handle: h}
	if err := lib.bind(path); err != nil {
		lib.close()
		return nil, err
	}
	return lib, nil
}

// openBuiltin opens a library built into the program (see RegisterBuiltin).
func openBuiltin(lookup unsafe.Pointer) (*library, error) {
	lib := &library{builtin: lookup}
	if err := lib.bind("the built-in kernel library"); err != nil {
		return nil, err
	}
	return lib, nil
}

// bind checks the library's runtime ABI, gives it the process's fiber stacks and looks up its
// runtime's entry points; what names the library in errors.
func (lib *library) bind(what string) error {
	version, err := lib.symbol("cnnc_emu_abi_version")
	if err == nil && C.emu_call_int(version) != 1 {
		err = fmt.Errorf("emu: %s: runtime ABI version %d, want 1", what, int(C.emu_call_int(version)))
	}
	var setStacks unsafe.Pointer
	if err == nil {
		if setStacks, err = lib.symbol("cnnc_emu_set_stack_provider"); err == nil {
			C.emu_set_stack_provider(setStacks)
		}
	}
	for _, s := range []struct {
		name string
		dst  *unsafe.Pointer
	}{
		{"cnnc_emu_worker_new", &lib.workerNew},
		{"cnnc_emu_worker_free", &lib.workerFree},
		{"cnnc_emu_launch_new", &lib.launchNew},
		{"cnnc_emu_launch_work", &lib.launchWork},
		{"cnnc_emu_launch_error", &lib.launchError},
		{"cnnc_emu_launch_free", &lib.launchFree},
	} {
		if err != nil {
			break
		}
		*s.dst, err = lib.symbol(s.name)
	}
	return err
}

func (l *library) symbol(name string) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var p unsafe.Pointer
	if l.builtin != nil {
		p = C.emu_builtin_lookup(l.builtin, cname)
	} else {
		p = C.emu_dlsym(l.handle, cname)
	}
	if p == nil {
		return nil, fmt.Errorf("emu: symbol %s not found in kernel library", name)
	}
	return p, nil
}

// paramCount calls the generated cnnc_emu_nparams_<kernel>.
func (l *library) paramCount(fn unsafe.Pointer) int { return int(C.emu_call_int(fn)) }

// close unloads a shared library; a built-in one stays, as the program's code.
func (l *library) close() {
	if l.handle != nil {
		C.emu_dlclose(l.handle)
	}
}

// cString reads a NUL-terminated C string.
func cString(p unsafe.Pointer) string { return C.GoString((*C.char)(p)) }

func (l *library) newWorker() unsafe.Pointer   { return C.emu_worker_new(l.workerNew) }
func (l *library) freeWorker(w unsafe.Pointer) { C.emu_worker_free(l.workerFree, w) }

func (l *library) newLaunch(entry unsafe.Pointer, params unsafe.Pointer, grid, block Dim3, shared int, flags uint32) unsafe.Pointer {
	return C.emu_launch_new(l.launchNew, entry, (*unsafe.Pointer)(params),
		C.uint32_t(grid.X), C.uint32_t(grid.Y), C.uint32_t(grid.Z),
		C.uint32_t(block.X), C.uint32_t(block.Y), C.uint32_t(block.Z),
		C.uint64_t(shared), C.uint32_t(flags))
}

func (l *library) work(launch, worker unsafe.Pointer) {
	C.emu_launch_work(l.launchWork, launch, worker)
}

// launchFailure returns the launch's first error message, or "".
func (l *library) launchFailure(launch unsafe.Pointer) string {
	msg := C.emu_launch_error(l.launchError, launch)
	if msg == nil {
		return ""
	}
	return C.GoString(msg)
}

func (l *library) freeLaunch(launch unsafe.Pointer) { C.emu_launch_free(l.launchFree, launch) }

// newParams copies the argument values into C memory (cgo forbids handing C a Go pointer that
// C keeps), returning the void** that kernels read.
func newParams(vals []uint64) unsafe.Pointer {
	var first *C.uint64_t
	if len(vals) > 0 {
		first = (*C.uint64_t)(unsafe.Pointer(&vals[0]))
	}
	return unsafe.Pointer(C.emu_params_new(first, C.int(len(vals))))
}

func freeParams(p unsafe.Pointer, n int) { C.emu_params_free((*unsafe.Pointer)(p), C.int(n)) }

func cAlloc(n int) uintptr { return uintptr(C.emu_alloc(C.size_t(n))) }
func cFree(p uintptr)      { C.emu_free(C.uintptr_t(p)) }

func cCopyIn(dst uintptr, src unsafe.Pointer, n int) {
	C.emu_copy_in(C.uintptr_t(dst), src, C.size_t(n))
}

func cCopyOut(dst unsafe.Pointer, src uintptr, n int) {
	C.emu_copy_out(dst, C.uintptr_t(src), C.size_t(n))
}

func cMemset(dst uintptr, v byte, n int) { C.emu_memset(C.uintptr_t(dst), C.int(v), C.size_t(n)) }
