//go:build cuda

package cuda

// Driver entry points that are not the same function under every CUDA
// header. cuda.h maps a name to its newest version: cuCtxCreate is
// cuCtxCreate_v2 (3 arguments) up to CUDA 12 and cuCtxCreate_v4 (4) in
// CUDA 13; cuStreamGetCaptureInfo became _v3 in 13 and _v2 is no longer
// declared by default; CUDA 12 moved cuGraphExecKernelNodeSetParams to _v2
// with a longer struct. Calling them by their header names would make the
// source compile (or not) and bind different ABIs depending on the
// toolkit. So these are looked up once, at run time, by name and the CUDA
// version of the ABI this package uses (cuGetProcAddress, CUDA 11.3+), with
// the function types written out in driver.c: the same binary code under
// CUDA 11.8, 12.x and 13 headers, on any driver from the minimum on. The
// remaining calls (cuFuncSetAttribute, cuMemHostAlloc, cuGraphLaunch, ...)
// have had one version since before CUDA 11.

/*
#cgo LDFLAGS: -lcuda
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/lib/x86_64-linux-gnu
#cgo linux CFLAGS: -I/usr/local/cuda/include -I/usr/include

#include "driver.h"

static int cnncHeaderVersion(void) { return CUDA_VERSION; }
*/
import "C"

import (
	"fmt"
	"sync"

	"gorgonia.org/cu"
)

// EntryPoint is a driver function the package resolves at run time: its
// name and the CUDA version whose ABI of it is called (11030 is CUDA 11.3).
type EntryPoint struct {
	Name    string
	Version int
}

// EntryPoints lists what the package resolves through cuGetProcAddress.
func EntryPoints() []EntryPoint {
	n := int(C.cnncEntryCount())
	eps := make([]EntryPoint, n)
	for i := range eps {
		eps[i] = EntryPoint{C.GoString(C.cnncEntryName(C.int(i))), int(C.cnncEntryVersion(C.int(i)))}
	}
	return eps
}

// HeaderVersion is CUDA_VERSION of the cuda.h the package was compiled
// with (11080 for CUDA 11.8).
func HeaderVersion() int { return int(C.cnncHeaderVersion()) }

// CUDAVersion formats a CUDA version number: 12040 is "12.4".
func CUDAVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

var (
	resolveOnce   sync.Once
	resolveErr    error
	driverVersion int
)

// resolveDriver looks the entry points up, once per process; the error
// says which driver the binary needs when the installed one is too old.
func resolveDriver() (int, error) {
	resolveOnce.Do(func() {
		var version, minimum, failed C.int
		r := C.cnncResolveDriver(&version, &minimum, &failed)
		driverVersion = int(version)
		switch {
		case r == C.CUDA_SUCCESS:
		case failed >= 0:
			resolveErr = fmt.Errorf("cuda: the CUDA driver (%s) has no %s of the CUDA %s ABI (cuGetProcAddress: %w)",
				CUDAVersion(int(version)), C.GoString(C.cnncEntryName(failed)), CUDAVersion(int(C.cnncEntryVersion(failed))), check(r))
		case version != 0 && version < minimum:
			resolveErr = fmt.Errorf("cuda: the CUDA driver is %s; this binary (built with CUDA %s headers) needs a driver for CUDA %s or newer",
				CUDAVersion(int(version)), CUDAVersion(HeaderVersion()), CUDAVersion(int(minimum)))
		default:
			resolveErr = fmt.Errorf("cuda: cuDriverGetVersion: %w", check(r))
		}
	})
	return driverVersion, resolveErr
}

// DriverVersion is the installed driver's CUDA version (13000 for CUDA
// 13.0); it fails when the driver is older than this binary needs.
func DriverVersion() (int, error) { return resolveDriver() }

// context is a CUDA context made through the resolved cuCtxCreate.
type context struct{ c C.CUcontext }

// createContext makes a context on dev current on the calling (locked)
// thread, with the driver's default scheduling (CU_CTX_SCHED_AUTO).
func createContext(dev cu.Device) (context, error) {
	var ctx context
	err := check(C.cnncCtxCreate(&ctx.c, C.uint(C.CU_CTX_SCHED_AUTO), C.CUdevice(dev)))
	return ctx, err
}

func (ctx context) destroy() error { return check(C.cnncCtxDestroy(ctx.c)) }

// makeCurrent makes ctx current on the calling (locked) thread
// (cuCtxSetCurrent: one version since CUDA 4).
func (ctx context) makeCurrent() error { return check(C.cuCtxSetCurrent(ctx.c)) }
