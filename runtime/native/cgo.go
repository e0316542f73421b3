package native

// All C calls of the package. Kernel libraries are reached through their cnnc_cpu_library
// struct (cnnc_cpu.h), whose task functions cgo cannot call directly, hence native_work.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "cnnc_cpu.h"

static void* native_dlopen(const char* path, char** err) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	*err = h ? NULL : dlerror();
	return h;
}
static void* native_dlsym(void* h, const char* name) { return dlsym(h, name); }
static int native_dlclose(void* h) { return dlclose(h); }
// The library's struct, from its entry function (a shared library's cnnc_cpu_library_entry or a
// built-in library's cnnc_cpu_builtin_<id>).
static const struct cnnc_cpu_library* native_library(void* entry) {
	return ((const struct cnnc_cpu_library* (*)(void))entry)();
}

// Whether this CPU (and the OS, which must save the AVX registers) runs the AVX2+FMA kernels.
static int native_has_avx2_fma(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
	return 0;
#endif
}

// Runs tasks of a launch until none is left: each worker of the launch calls it with its own
// scratch; the shared counter hands out task indices, so every task runs exactly once.
static void native_work(void* fn, const uint64_t* params, int64_t* counter, int64_t tasks, void* scratch) {
	cnnc_cpu_task_fn f = (cnnc_cpu_task_fn)fn;
	for (;;) {
		int64_t t = __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
		if (t >= tasks) break;
		f(params, t, (float*)scratch);
	}
}

static void* native_alloc(size_t n) {
	void* p = NULL;
	if (posix_memalign(&p, 64, n > 0 ? n : 64) != 0) return NULL;
	return p;
}
static void native_free(void* p) { free(p); }
static void native_set(uint64_t* dst, const uint64_t* src, int n) { memcpy(dst, src, (size_t)n * 8); }
static void native_store(int64_t* p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// kernelInfo is one entry of a library's kernel table.
type kernelInfo struct {
	name    string
	fn      [2]unsafe.Pointer
	scratch [2]int64
	tasks   int64
	nparams int
}

// libInfo is what a library's cnnc_cpu_library struct says.
type libInfo struct {
	abi     int
	sha256  string
	kernels []kernelInfo
}

// readLibrary reads the struct that entry returns.
func readLibrary(entry unsafe.Pointer) libInfo {
	l := C.native_library(entry)
	info := libInfo{abi: int(l.abi), sha256: C.GoString(l.source_sha256)}
	if info.abi != abiVersion {
		return info
	}
	n := int(l.nkernels)
	names, nparams := unsafe.Slice(l.names, n), unsafe.Slice(l.nparams, n)
	impl := [2][]C.cnnc_cpu_kernel_impl{unsafe.Slice(l.impl[0], n), unsafe.Slice(l.impl[1], n)}
	for i := 0; i < n; i++ {
		k := kernelInfo{name: C.GoString(names[i]), nparams: int(nparams[i]), tasks: int64(impl[0][i].tasks)}
		for isa := range impl {
			k.fn[isa] = unsafe.Pointer(impl[isa][i].fn)
			k.scratch[isa] = int64(impl[isa][i].scratch_bytes)
			if int64(impl[isa][i].tasks) != k.tasks {
				k.tasks = -1 // the instruction sets split the work differently: New refuses it
			}
		}
		info.kernels = append(info.kernels, k)
	}
	return info
}

// openShared dlopens a compiled kernel library and returns its handle and entry function.
func openShared(path string) (handle, entry unsafe.Pointer, err error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	h := C.native_dlopen(cpath, &cerr)
	if h == nil {
		return nil, nil, fmt.Errorf("native: dlopen %s: %s", path, C.GoString(cerr))
	}
	name := C.CString(sharedEntry)
	defer C.free(unsafe.Pointer(name))
	e := C.native_dlsym(h, name)
	if e == nil {
		C.native_dlclose(h)
		return nil, nil, fmt.Errorf("native: %s has no %s", path, sharedEntry)
	}
	return h, e, nil
}

func closeShared(h unsafe.Pointer) { C.native_dlclose(h) }

func hasAVX2FMA() bool { return C.native_has_avx2_fma() != 0 }

// cmem is C memory the device owns: parameter blocks, counters, scratch.
func cAlloc(n int64) unsafe.Pointer { return C.native_alloc(C.size_t(n)) }
func cFree(p unsafe.Pointer)        { C.native_free(p) }

// setParams copies a launch's values into the device's C parameter block.
func setParams(dst unsafe.Pointer, vals []uint64) {
	if len(vals) > 0 {
		C.native_set((*C.uint64_t)(dst), (*C.uint64_t)(unsafe.Pointer(&vals[0])), C.int(len(vals)))
	}
}

func storeCounter(p unsafe.Pointer, v int64) { C.native_store((*C.int64_t)(p), C.int64_t(v)) }

// work runs tasks of fn from the shared counter until none is left.
func work(fn, params, counter unsafe.Pointer, tasks int64, scratch unsafe.Pointer) {
	C.native_work(fn, (*C.uint64_t)(params), (*C.int64_t)(counter), C.int64_t(tasks), scratch)
}
