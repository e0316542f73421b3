//go:build cuda

// Driver entry points resolved at run time; see driver.go for why and driver.h for the API.
#include "driver.h"

// Each entry point's ABI as the CUDA version that introduced it (cudaTypedefs.h calls these
// PFN_<name>_v<version>). The types are written out here instead of taken from a header,
// whose defaults move on (CUDA 13: cuCtxCreate is _v4, cuStreamGetCaptureInfo _v3).
typedef CUresult (*ctxCreate_v3020)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*ctxDestroy_v4000)(CUcontext);
typedef CUresult (*streamBeginCapture_v10010)(CUstream, CUstreamCaptureMode);
typedef CUresult (*streamGetCaptureInfo_v11030)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                               const CUgraphNode **, size_t *);
typedef CUresult (*graphInstantiateWithFlags_v11040)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*graphExecKernelNodeSetParams_v10010)(CUgraphExec, CUgraphNode, const cnncKernelNodeParamsV1 *);

static struct {
	ctxCreate_v3020 ctxCreate;
	ctxDestroy_v4000 ctxDestroy;
	streamBeginCapture_v10010 streamBeginCapture;
	streamGetCaptureInfo_v11030 streamGetCaptureInfo;
	graphInstantiateWithFlags_v11040 graphInstantiateWithFlags;
	graphExecKernelNodeSetParams_v10010 graphExecKernelNodeSetParams;
} drv;

static const struct {
	const char *name;
	int version;
	void **fn;
} entries[] = {
    {"cuCtxCreate", 3020, (void **)&drv.ctxCreate},
    {"cuCtxDestroy", 4000, (void **)&drv.ctxDestroy},
    {"cuStreamBeginCapture", 10010, (void **)&drv.streamBeginCapture},
    {"cuStreamGetCaptureInfo", 11030, (void **)&drv.streamGetCaptureInfo},
    {"cuGraphInstantiateWithFlags", 11040, (void **)&drv.graphInstantiateWithFlags},
    {"cuGraphExecKernelNodeSetParams", 10010, (void **)&drv.graphExecKernelNodeSetParams},
};

#define NENTRIES ((int)(sizeof entries / sizeof entries[0]))

// The oldest driver the binary runs on: cuGraphInstantiateWithFlags came with CUDA 11.4, and
// a binary built with CUDA 12 headers or newer binds cuGetProcAddress_v2 (12.0).
#if CUDA_VERSION >= 12000
#define MIN_DRIVER 12000
#else
#define MIN_DRIVER 11040
#endif

// getProc is cuGetProcAddress as the headers declare it: CUDA 11.3-11.8 take four
// arguments and fail with CUDA_ERROR_NOT_FOUND; CUDA 12 and later (cuGetProcAddress_v2)
// take a query result too and succeed with a NULL pointer when the symbol is missing.
static CUresult getProc(const char *name, int version, void **fn) {
	*fn = NULL;
#if CUDA_VERSION >= 12000
	CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	CUresult r = cuGetProcAddress(name, fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
	if (r == CUDA_SUCCESS && found != CU_GET_PROC_ADDRESS_SUCCESS) r = CUDA_ERROR_NOT_FOUND;
#else
	CUresult r = cuGetProcAddress(name, fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
#endif
	if (r == CUDA_SUCCESS && !*fn) r = CUDA_ERROR_NOT_FOUND;
	return r;
}

CUresult cnncResolveDriver(int *driverVersion, int *minVersion, int *failed) {
	*failed = -1;
	*minVersion = MIN_DRIVER;
	CUresult r = cuDriverGetVersion(driverVersion);
	if (r != CUDA_SUCCESS) return r;
	if (*driverVersion < MIN_DRIVER) return CUDA_ERROR_NOT_SUPPORTED;
	for (int i = 0; i < NENTRIES; i++) {
		r = getProc(entries[i].name, entries[i].version, entries[i].fn);
		if (r != CUDA_SUCCESS) {
			*failed = i;
			return r;
		}
	}
	return CUDA_SUCCESS;
}

int cnncEntryCount(void) { return NENTRIES; }
const char *cnncEntryName(int i) { return i >= 0 && i < NENTRIES ? entries[i].name : ""; }
int cnncEntryVersion(int i) { return i >= 0 && i < NENTRIES ? entries[i].version : 0; }

CUresult cnncCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev) { return drv.ctxCreate(ctx, flags, dev); }

CUresult cnncCtxDestroy(CUcontext ctx) { return drv.ctxDestroy(ctx); }

CUresult cnncStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) { return drv.streamBeginCapture(s, mode); }

CUresult cnncStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                  const CUgraphNode **deps, size_t *ndeps) {
	return drv.streamGetCaptureInfo(s, status, id, graph, deps, ndeps);
}

CUresult cnncGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
	return drv.graphInstantiateWithFlags(e, g, flags);
}

CUresult cnncGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const cnncKernelNodeParamsV1 *p) {
	return drv.graphExecKernelNodeSetParams(e, n, p);
}
