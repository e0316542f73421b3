// Driver entry points whose default version depends on the CUDA headers, resolved at run
// time by name and ABI version (cuGetProcAddress). See driver.go.
#ifndef CNNC_CUDA_DRIVER_H
#define CNNC_CUDA_DRIVER_H

#include <cuda.h>
#include <stddef.h>

// The layout of CUDA_KERNEL_NODE_PARAMS_v1, the parameters of the 10.1 ABI of
// cuGraphExecKernelNodeSetParams (CUDA 12 headers default to _v2 and a longer struct).
// Declared here so that no header decides which version is called.
typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
} cnncKernelNodeParamsV1;

// cnncResolveDriver checks the driver's version against the oldest these entry points
// need and looks each one up; on failure *failed is the index of the entry point that is
// missing (-1: the driver is too old, or cuDriverGetVersion failed).
CUresult cnncResolveDriver(int *driverVersion, int *minVersion, int *failed);

// The entry points, for messages and tests: name and the CUDA version of the ABI cnnc uses.
int cnncEntryCount(void);
const char *cnncEntryName(int i);
int cnncEntryVersion(int i);

// Calls through the resolved entry points (cnncResolveDriver must have succeeded).
CUresult cnncCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cnncCtxDestroy(CUcontext ctx);
CUresult cnncStreamBeginCapture(CUstream s, CUstreamCaptureMode mode);
CUresult cnncStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                  const CUgraphNode **deps, size_t *ndeps);
CUresult cnncGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags);
CUresult cnncGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const cnncKernelNodeParamsV1 *p);

#endif
