//go:build cuda

package cuda

// A thin cgo shim over the driver API for what gorgonia.org/cu v0.9.6 lacks:
// raising a function's dynamic shared memory limit above 48 KiB, the
// device's opt-in shared memory limit, and pinned host memory. Like every
// driver call of the package, these run on the device's locked thread.

/*
#cgo LDFLAGS: -lcuda
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo linux CFLAGS: -I/usr/local/cuda/include -I/usr/include

#include <cuda.h>

static CUresult cnncFuncSetMaxDynamicShared(CUfunction f, int bytes) {
	return cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

static CUresult cnncSharedOptin(CUdevice dev, int *bytes) {
	return cuDeviceGetAttribute(bytes, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
}

static CUresult cnncMemHostAlloc(void **p, size_t bytes) {
	return cuMemHostAlloc(p, bytes, CU_MEMHOSTALLOC_PORTABLE);
}

static CUresult cnncMemFreeHost(void *p) {
	return cuMemFreeHost(p);
}
*/
import "C"

import (
	"reflect"
	"unsafe"

	"gorgonia.org/cu"
)

// cu.Function is a struct holding only a CUfunction; the shim reads it
// through unsafe. This fails to compile if cu's layout ever changes.
var _ = [1]struct{}{}[unsafe.Sizeof(cu.Function{})-unsafe.Sizeof(uintptr(0))]

func cFunction(fn cu.Function) C.CUfunction { return *(*C.CUfunction)(unsafe.Pointer(&fn)) }

// check turns a CUresult into cu's error value, so that errors from the
// shim and from cu compare alike (errors.Is(err, cu.OutOfMemory)).
func check(r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	e := cu.Success // a variable of cu's unexported result type
	reflect.ValueOf(&e).Elem().SetInt(int64(r))
	return e
}

// setMaxDynamicShared allows fn launches with up to bytes of dynamic
// shared memory (needed above 48 KiB).
func setMaxDynamicShared(fn cu.Function, bytes int) error {
	return check(C.cnncFuncSetMaxDynamicShared(cFunction(fn), C.int(bytes)))
}

// sharedOptin is the most shared memory one block may use after opting in.
func sharedOptin(dev cu.Device) (int, error) {
	var n C.int
	err := check(C.cnncSharedOptin(C.CUdevice(dev), &n))
	return int(n), err
}

// memHostAlloc allocates page-locked host memory usable by every context.
func memHostAlloc(bytes int) ([]byte, error) {
	var p unsafe.Pointer
	if err := check(C.cnncMemHostAlloc(&p, C.size_t(bytes))); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), bytes), nil
}

func memFreeHost(b []byte) error {
	return check(C.cnncMemFreeHost(unsafe.Pointer(unsafe.SliceData(b))))
}
