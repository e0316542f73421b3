// A stand-in for the CUDA driver library (libcuda.so.1) that runs cnnc's kernels on the CPU
// emulator, so that the CUDA backend's host code — contexts, module loading, launches with the
// kernel-parameter ABI, streams, events, pinned memory, stream capture and graph replay — runs
// and is tested on machines without a GPU. See ../fakecuda.go for how it is built and used.
//
// Kernels: cuModuleLoadData hashes the module image (a fatbin, or PTX text) and loads
// $CNNC_FAKECUDA/modules/<hash>.so, the emulator library of the same CUDA C source, registered
// when the image was compiled (fakecuda.Register). Functions are the library's trampolines.
//
// Fidelity, on purpose: launches are validated like the driver does (grid/block limits,
// more than 48 KiB of dynamic shared memory only after cuFuncSetAttribute); driver calls
// need a current context on the calling thread; a kernel failure is reported at the next
// synchronisation and the context stays broken (sticky), as after a GPU fault; during a stream
// capture launches are recorded with their parameter values copied, and synchronising,
// copying from pageable memory, allocating or freeing fail and invalidate the capture.
// Graph launches are queued and run when something waits for them (see "the stream's queue"),
// so host code that rewrites memory a launched graph has not read yet gets wrong results, as
// on a GPU; everything else runs when it is called, after the queued graphs, and events
// measure CPU time. Memory: device pointers are host allocations; the device's total memory is
// $CNNC_FAKECUDA_MEMORY bytes (default 16 GiB) and allocations beyond it fail. Devices: one, or
// $CNNC_FAKECUDA_DEVICES alike (a process per GPU, as data-parallel ranks use them; the memory
// limit is the process's, whichever device allocates).
//
// Versions: cuGetProcAddress (CUDA 11.3's) and cuGetProcAddress_v2 (CUDA 12's) hand out the
// versioned entry points cnnc resolves at run time, by base name and ABI version, as the
// driver does. The driver reports the fake's header version; $CNNC_FAKECUDA_DRIVER_VERSION
// makes it an older driver and $CNNC_FAKECUDA_HIDE (names) one without those entry points.
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAKE_NAME "cnnc fake CUDA device (CPU emulator)"
#define MAX_DYNAMIC_DEFAULT (48 << 10)
#define SHARED_OPTIN (227 << 10)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static CUresult sticky = CUDA_SUCCESS; // a kernel failed: the context is unusable
static size_t total_memory, used_memory;
static int device_count = 1; // $CNNC_FAKECUDA_DEVICES: devices alike, sharing the memory
static __thread CUcontext current;
static __thread CUstream capturing; // the stream this thread captures into, if any

static void note(const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "cnnc fake libcuda: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

// ---- bookkeeping -----------------------------------------------------------------------

struct CUctx_st {
	int device;
};

typedef struct {
	void* p;
	size_t n;
} span;

typedef struct {
	span* v;
	size_t len, cap;
} spans;

static spans device_allocs, pinned_allocs;

static int spans_add(spans* s, void* p, size_t n) {
	if (s->len == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		span* v = realloc(s->v, cap * sizeof(span));
		if (!v) return 0;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->len++] = (span){p, n};
	return 1;
}

// spans_find returns the index of the span starting at p, or -1.
static long spans_find(const spans* s, const void* p) {
	for (size_t i = 0; i < s->len; i++)
		if (s->v[i].p == p) return (long)i;
	return -1;
}

// spans_within reports whether [p, p+n) lies inside one span.
static int spans_within(const spans* s, const void* p, size_t n) {
	const char* c = p;
	for (size_t i = 0; i < s->len; i++) {
		const char* b = s->v[i].p;
		if (c >= b && c + n <= b + s->v[i].n) return 1;
	}
	return 0;
}

static void spans_remove(spans* s, long i) { s->v[i] = s->v[--s->len]; }

typedef void (*entry_fn)(void**);
typedef int (*launch_sync_fn)(entry_fn, void**, const uint32_t*, const uint32_t*, uint64_t, int, char*, size_t);

struct CUmod_st {
	void* lib;
	launch_sync_fn launch_sync;
};

struct CUfunc_st {
	launch_sync_fn launch_sync; // the module's, so that a function outlives its handle's module
	entry_fn entry;
	int nparams;
	int max_dynamic;
	char name[256];
};

enum node_kind { NODE_KERNEL, NODE_COPY, NODE_EVENT };

// A node's handle is its index in the graph; an instantiated graph keeps the order, so the
// handle finds the node in it too (cuGraphExecKernelNodeSetParams).
struct CUgraphNode_st {
	size_t index;
};

typedef struct {
	struct CUgraphNode_st* handle; // NULL in an instantiated graph
	enum node_kind kind;
	CUfunction fn;
	uint32_t grid[3], block[3];
	uint32_t shared;
	uint64_t* params; // values, copied when captured
	void* dst;
	const void* src;
	size_t bytes;
	CUevent event; // NODE_EVENT: recorded when the graph runs
} node;

struct CUgraph_st {
	node* nodes;
	size_t len, cap;
};

struct CUgraphExec_st {
	struct CUgraph_st g;
};

struct CUstream_st {
	CUgraph graph; // non-NULL while capturing
	int invalidated;
};

struct CUevent_st {
	int recorded;
	double ms;
	int pending; // records by queued graph launches that have not run yet
};

static double now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// ready is the check at the start of most calls: initialised, a current context, no
// earlier kernel failure.
static CUresult ready(void) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (sticky != CUDA_SUCCESS) return sticky;
	if (!current) return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

// settled is ready after the queued graph launches have run: the check of calls that act on
// the stream or on memory, which the GPU would do after the work queued before them.
static CUresult settled(void);

// unsafe_in_capture fails calls that a thread-local capture forbids, invalidating it.
static CUresult unsafe_in_capture(void) {
	if (!capturing) return CUDA_SUCCESS;
	capturing->invalidated = 1;
	return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

static int graph_add(CUgraph g, node n) {
	n.handle = malloc(sizeof *n.handle);
	if (!n.handle) return 0;
	n.handle->index = g->len;
	if (g->len == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 64;
		node* v = realloc(g->nodes, cap * sizeof(node));
		if (!v) {
			free(n.handle);
			return 0;
		}
		g->nodes = v;
		g->cap = cap;
	}
	g->nodes[g->len++] = n;
	return 1;
}

static void graph_free_nodes(struct CUgraph_st* g) {
	for (size_t i = 0; i < g->len; i++) {
		free(g->nodes[i].params);
		free(g->nodes[i].handle);
	}
	free(g->nodes);
	g->nodes = NULL;
	g->len = g->cap = 0;
}

// ---- initialisation and devices --------------------------------------------------------

// cuGetErrorName and cuGetErrorString know the codes the fake returns.
static const struct {
	CUresult code;
	const char *name, *desc;
} errors_known[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_ASSERT, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
};

CUresult cuGetErrorName(CUresult r, const char** s) {
	if (!s) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errors_known / sizeof errors_known[0]; i++)
		if (errors_known[i].code == r) {
			*s = errors_known[i].name;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char** s) {
	if (!s) return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errors_known / sizeof errors_known[0]; i++)
		if (errors_known[i].code == r) {
			*s = errors_known[i].desc;
			return CUDA_SUCCESS;
		}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

// cuInit fails as on a machine without a GPU when $CNNC_FAKECUDA_NODEVICE is set.
CUresult cuInit(unsigned int flags) {
	if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
	const char* nodev = getenv("CNNC_FAKECUDA_NODEVICE");
	if (nodev && *nodev) return CUDA_ERROR_NO_DEVICE;
	pthread_mutex_lock(&mu);
	if (!initialized) {
		const char* m = getenv("CNNC_FAKECUDA_MEMORY");
		total_memory = m && *m ? strtoull(m, NULL, 10) : (size_t)16 << 30;
		const char* n = getenv("CNNC_FAKECUDA_DEVICES");
		device_count = n && atoi(n) > 0 ? atoi(n) : 1;
		initialized = 1;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

// The driver's CUDA version: the headers' the fake is built with, or $CNNC_FAKECUDA_DRIVER_VERSION
// (e.g. 11020) to act as an older driver (cuGetProcAddress then finds only older entry points).
static int driver_version(void) {
	const char* v = getenv("CNNC_FAKECUDA_DRIVER_VERSION");
	return v && *v ? atoi(v) : CUDA_VERSION;
}

CUresult cuDriverGetVersion(int* v) {
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	*v = driver_version();
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (!n) return CUDA_ERROR_INVALID_VALUE;
	*n = device_count;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (!d) return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= device_count) return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "%s", FAKE_NAME);
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t* bytes, CUdevice d) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
	*bytes = total_memory;
	return CUDA_SUCCESS;
}

// Attributes of an H100/H200-like device (sm_90), for the ones cnnc asks about.
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = MAX_DYNAMIC_DEFAULT; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = SHARED_OPTIN; break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 228 << 10; break;
	case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *v = 65535; break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break;
	case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *v = 2619000; break;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 6144; break;
	case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 << 20; break;
	default:
		note("cuDeviceGetAttribute: attribute %d not emulated", (int)a);
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

// ---- contexts ------------------------------------------------------------------------------

CUresult cuCtxCreate(CUcontext* c, unsigned int flags, CUdevice d) {
	(void)flags;
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (d < 0 || d >= device_count) return CUDA_ERROR_INVALID_DEVICE;
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	CUcontext ctx = calloc(1, sizeof *ctx);
	if (!ctx) return CUDA_ERROR_OUT_OF_MEMORY;
	ctx->device = d;
	*c = current = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext c) {
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (c == current && !capturing) settled(); // queued graphs run before their memory goes
	if (current == c) current = NULL;
	free(c);
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* c) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	*c = current;
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	current = c;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* d) {
	CUresult r = ready();
	if (r == CUDA_SUCCESS) *d = current->device;
	return r;
}

CUresult cuCtxSynchronize(void) {
	CUresult r = settled();
	if (r != CUDA_SUCCESS) return r;
	return unsafe_in_capture();
}

// ---- memory --------------------------------------------------------------------------------

CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&mu);
	*free_bytes = total_memory - used_memory;
	*total_bytes = total_memory;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr* p, size_t n) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if ((r = unsafe_in_capture()) != CUDA_SUCCESS) return r;
	if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	r = CUDA_ERROR_OUT_OF_MEMORY;
	void* m = NULL;
	if (n <= total_memory - used_memory && posix_memalign(&m, 256, n) == 0) {
		if (spans_add(&device_allocs, m, n)) {
			used_memory += n;
			*p = (CUdeviceptr)(uintptr_t)m;
			r = CUDA_SUCCESS;
		} else {
			free(m);
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuMemFree(CUdeviceptr p) {
	CUresult r = settled();
	if (r != CUDA_SUCCESS) return r;
	if ((r = unsafe_in_capture()) != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&mu);
	long i = spans_find(&device_allocs, (void*)(uintptr_t)p);
	if (i < 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		used_memory -= device_allocs.v[i].n;
		free(device_allocs.v[i].p);
		spans_remove(&device_allocs, i);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuMemHostAlloc(void** p, size_t n, unsigned int flags) {
	(void)flags;
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	r = CUDA_ERROR_OUT_OF_MEMORY;
	void* m = NULL;
	if (posix_memalign(&m, 4096, n) == 0) {
		if (spans_add(&pinned_allocs, m, n)) {
			*p = m;
			r = CUDA_SUCCESS;
		} else {
			free(m);
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuMemFreeHost(void* p) {
	CUresult r = settled();
	if (r != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&mu);
	long i = spans_find(&pinned_allocs, p);
	if (i < 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		free(p);
		spans_remove(&pinned_allocs, i);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

// copy is every memcpy: device ranges must lie inside allocations (a GPU would fault with an
// illegal address). During a capture, only copies between device memory and pinned host
// memory are recorded (the fake does not pretend pageable copies are capturable).
static CUresult copy(void* dst, int dst_dev, const void* src, int src_dev, size_t n, CUstream s, int async) {
	CUresult r = capturing ? ready() : settled();
	if (r != CUDA_SUCCESS) return r;
	pthread_mutex_lock(&mu);
	int ok = (!dst_dev || spans_within(&device_allocs, dst, n)) && (!src_dev || spans_within(&device_allocs, src, n));
	int pinned = (dst_dev || spans_within(&pinned_allocs, dst, n)) && (src_dev || spans_within(&pinned_allocs, src, n));
	pthread_mutex_unlock(&mu);
	if (!ok) return CUDA_ERROR_INVALID_VALUE;
	if (capturing && (!async || s != capturing || !pinned)) return unsafe_in_capture();
	if (s && s->graph) {
		node nd = {.kind = NODE_COPY, .dst = dst, .src = src, .bytes = n};
		return graph_add(s->graph, nd) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	}
	memmove(dst, src, n);
	return CUDA_SUCCESS;
}

#define DEV(p) ((void*)(uintptr_t)(p))

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) { return copy(DEV(dst), 1, src, 0, n, NULL, 0); }
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) { return copy(dst, 0, DEV(src), 1, n, NULL, 0); }
CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) { return copy(DEV(dst), 1, DEV(src), 1, n, NULL, 0); }
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
	return copy(DEV(dst), 1, src, 0, n, s, 1);
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) {
	return copy(dst, 0, DEV(src), 1, n, s, 1);
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	return copy(DEV(dst), 1, DEV(src), 1, n, s, 1);
}

static CUresult memset_words(CUdeviceptr dst, const void* word, size_t size, size_t n, CUstream s) {
	CUresult r = capturing ? ready() : settled();
	if (r != CUDA_SUCCESS) return r;
	if (capturing || (s && s->graph)) {
		note("cuMemset during a stream capture is not emulated");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_lock(&mu);
	int ok = spans_within(&device_allocs, DEV(dst), n * size);
	pthread_mutex_unlock(&mu);
	if (!ok) return CUDA_ERROR_INVALID_VALUE;
	char* p = DEV(dst);
	for (size_t i = 0; i < n; i++) memcpy(p + i * size, word, size);
	return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) { return memset_words(dst, &v, 1, n, NULL); }
CUresult cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) { return memset_words(dst, &v, 4, n, NULL); }
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { return memset_words(dst, &v, 1, n, s); }
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) { return memset_words(dst, &v, 4, n, s); }

// ---- modules and functions -------------------------------------------------------------

// image_key is the FNV-1a 64 hash of a module image (fakecuda.ImageKey computes the same):
// a fatbin is its header plus payload, anything else NUL-terminated text (PTX).
static int image_key(const void* image, char out[17]) {
	const unsigned char* b = image;
	size_t n;
	uint32_t magic;
	memcpy(&magic, b, 4);
	if (magic == 0xBA55ED50u) {
		uint16_t header;
		uint64_t payload;
		memcpy(&header, b + 6, 2);
		memcpy(&payload, b + 8, 8);
		n = header + payload;
	} else if (b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') {
		return 0; // a cubin: the fake has no way to size it
	} else {
		n = strlen(image);
	}
	uint64_t h = 14695981039346656037ull;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ull;
	}
	snprintf(out, 17, "%016llx", (unsigned long long)h);
	return 1;
}

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
	char key[17];
	if (!image_key(image, key)) {
		note("cuModuleLoadData: cubin images are not emulated (register a fatbin or PTX)");
		return CUDA_ERROR_INVALID_IMAGE;
	}
	const char* dir = getenv("CNNC_FAKECUDA");
	char path[4096];
	snprintf(path, sizeof path, "%s/modules/%s.so", dir ? dir : ".", key);
	void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		note("cuModuleLoadData: no emulator library for this image: %s (compile the kernels with "
		     "CNNC_FAKECUDA set, so fakecuda.Register records them)",
		     dlerror());
		return CUDA_ERROR_INVALID_IMAGE;
	}
	int (*version)(void) = (int (*)(void))dlsym(lib, "cnnc_emu_abi_version");
	launch_sync_fn launch = (launch_sync_fn)dlsym(lib, "cnnc_emu_launch_sync");
	if (!version || version() != 1 || !launch) {
		note("cuModuleLoadData: %s is not an emulator library of ABI version 1", path);
		dlclose(lib);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	CUmodule mod = calloc(1, sizeof *mod);
	if (!mod) {
		dlclose(lib);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	mod->lib = lib;
	mod->launch_sync = launch;
	*m = mod;
	return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned int n, CUjit_option* o, void** v) {
	(void)n, (void)o, (void)v;
	return cuModuleLoadData(m, image);
}

CUresult cuModuleLoadFatBinary(CUmodule* m, const void* image) { return cuModuleLoadData(m, image); }

CUresult cuModuleUnload(CUmodule m) {
	if (!m) return CUDA_ERROR_INVALID_HANDLE;
	// Functions of the module are not freed: like the driver's handles they simply become
	// invalid; the library stays loaded so that a stale handle cannot jump into unmapped code.
	free(m);
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
	char sym[300];
	snprintf(sym, sizeof sym, "cnnc_emu_entry_%s", name);
	entry_fn entry = (entry_fn)dlsym(m->lib, sym);
	snprintf(sym, sizeof sym, "cnnc_emu_nparams_%s", name);
	int (*nparams)(void) = (int (*)(void))dlsym(m->lib, sym);
	if (!entry || !nparams || strlen(name) >= sizeof((*f)->name)) return CUDA_ERROR_NOT_FOUND;
	CUfunction fn = calloc(1, sizeof *fn);
	if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
	fn->launch_sync = m->launch_sync;
	fn->entry = entry;
	fn->nparams = nparams();
	fn->max_dynamic = MAX_DYNAMIC_DEFAULT;
	snprintf(fn->name, sizeof fn->name, "%s", name);
	*f = fn;
	return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!v || !f) return CUDA_ERROR_INVALID_VALUE;
	switch (a) {
	case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
	case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = 0; break; // static __shared__ is not measured
	case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *v = 0; break;
	case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *v = 0; break;
	case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; break;
	case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = 90; break;
	case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
	case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = f->max_dynamic; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
		note("cuFuncSetAttribute: attribute %d not emulated", (int)a);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (v < 0 || v > SHARED_OPTIN) return CUDA_ERROR_INVALID_VALUE;
	f->max_dynamic = v;
	return CUDA_SUCCESS;
}

// ---- launches --------------------------------------------------------------------------

static int workers(void) {
	const char* w = getenv("CNNC_FAKECUDA_WORKERS");
	int n = w && *w ? atoi(w) : (int)sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n;
}

static CUresult run_kernel(CUfunction f, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                           void** params) {
	char err[512] = {0};
	if (f->launch_sync(f->entry, params, grid, block, shared, workers(), err, sizeof err) != 0) {
		note("kernel %s failed: %s", f->name, err);
		pthread_mutex_lock(&mu);
		if (sticky == CUDA_SUCCESS) sticky = strstr(err, "assert") ? CUDA_ERROR_ASSERT : CUDA_ERROR_LAUNCH_FAILED;
		pthread_mutex_unlock(&mu);
	}
	// Like an asynchronous launch, the failure surfaces at the next synchronisation.
	return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void** params,
                        void** extra) {
	CUresult r = capturing ? ready() : settled();
	if (r != CUDA_SUCCESS) return r;
	if (!f) return CUDA_ERROR_INVALID_HANDLE;
	if (extra) {
		note("cuLaunchKernel: the extra argument is not emulated");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	uint64_t threads = (uint64_t)bx * by * bz;
	if (!gx || !gy || !gz || !bx || !by || !bz || threads > 1024 || bz > 64 || gy > 65535 || gz > 65535 ||
	    gx > 2147483647u)
		return CUDA_ERROR_INVALID_VALUE;
	if ((int)shared > f->max_dynamic) return CUDA_ERROR_INVALID_VALUE;
	if (f->nparams > 0 && !params) return CUDA_ERROR_INVALID_VALUE;
	if (capturing && s != capturing) return unsafe_in_capture();
	uint32_t grid[3] = {gx, gy, gz}, blk[3] = {bx, by, bz};
	if (s && s->graph) {
		// A captured launch keeps the parameter values of this moment, as the driver does.
		node nd = {.kind = NODE_KERNEL, .fn = f, .shared = shared};
		memcpy(nd.grid, grid, sizeof grid);
		memcpy(nd.block, blk, sizeof blk);
		nd.params = calloc((size_t)(f->nparams > 0 ? f->nparams : 1), 8);
		if (!nd.params) return CUDA_ERROR_OUT_OF_MEMORY;
		for (int i = 0; i < f->nparams; i++) memcpy(&nd.params[i], params[i], 8);
		if (!graph_add(s->graph, nd)) {
			free(nd.params);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		return CUDA_SUCCESS;
	}
	return run_kernel(f, grid, blk, shared, params);
}

// ---- streams and events ----------------------------------------------------------------

CUresult cuStreamCreate(CUstream* s, unsigned int flags) {
	(void)flags;
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!s) return CUDA_ERROR_INVALID_VALUE;
	*s = calloc(1, sizeof **s);
	return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuStreamDestroy(CUstream s) {
	if (!s) return CUDA_ERROR_INVALID_HANDLE;
	if (!capturing && initialized) settled();
	if (s->graph) {
		graph_free_nodes(s->graph);
		free(s->graph);
	}
	if (capturing == s) capturing = NULL;
	free(s);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (sticky != CUDA_SUCCESS) return sticky;
	if (!current) return CUDA_ERROR_INVALID_CONTEXT;
	if (capturing || (s && s->graph)) {
		if (s && s->graph) s->invalidated = 1;
		if (capturing) capturing->invalidated = 1;
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	return settled();
}

CUresult cuStreamQuery(CUstream s) {
	CUresult r = capturing ? ready() : settled();
	if (r != CUDA_SUCCESS) return r;
	if (s && s->graph) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* e, unsigned int flags) {
	(void)flags;
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!e) return CUDA_ERROR_INVALID_VALUE;
	*e = calloc(1, sizeof **e);
	return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuEventDestroy(CUevent e) {
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	if (e->pending && !capturing) settled(); // queued graphs record it: let them run first
	free(e);
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s, unsigned int flags) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	if (capturing || (s && s->graph)) {
		if (!(flags & CU_EVENT_RECORD_EXTERNAL) || s != capturing) {
			note("cuEventRecord during a stream capture is emulated only as an external event node "
			     "(cuEventRecordWithFlags with CU_EVENT_RECORD_EXTERNAL on the capturing stream)");
			return CUDA_ERROR_NOT_SUPPORTED;
		}
		node nd = {.kind = NODE_EVENT, .event = e};
		return graph_add(s->graph, nd) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	}
	if ((r = settled()) != CUDA_SUCCESS) return r;
	e->recorded = 1;
	e->ms = now_ms(); // everything issued before has finished
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) { return event_record(e, s, 0); }

CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) { return event_record(e, s, flags); }

static CUresult drain_until(CUevent e);

// A stream waiting for an event, as the driver: work queued on s after the call waits for the
// event's last record before the call (an event never recorded: no wait; recording it later
// changes no wait already queued). Here work runs when it is issued, in order, so what the
// event marks has run unless a queued graph records it: those graphs run now. Waits inside a
// stream capture (which join another stream into the capture) are not emulated.
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	if (flags != 0) return CUDA_ERROR_INVALID_VALUE; // CU_EVENT_WAIT_DEFAULT; _EXTERNAL is for captures
	if (capturing || (s && s->graph)) {
		note("cuStreamWaitEvent during a stream capture is not emulated");
		if (capturing) capturing->invalidated = 1;
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	return e->pending > 0 ? drain_until(e) : CUDA_SUCCESS;
}

// Waiting for an event runs the queued graph launches up to the last one that records it.
CUresult cuEventSynchronize(CUevent e) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	return drain_until(e);
}

CUresult cuEventQuery(CUevent e) { return cuEventSynchronize(e); }

// As the driver: both events must have been recorded and have completed.
CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!ms || !start || !end) return CUDA_ERROR_INVALID_HANDLE;
	if (start->pending || end->pending) return CUDA_ERROR_NOT_READY;
	if (!start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
	*ms = (float)(end->ms - start->ms);
	return CUDA_SUCCESS;
}

// ---- stream capture and graphs ---------------------------------------------------------

CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; // the legacy stream cannot be captured
	if (mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
		note("cuStreamBeginCapture: only CU_STREAM_CAPTURE_MODE_THREAD_LOCAL is emulated");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (s->graph || capturing) return CUDA_ERROR_ILLEGAL_STATE;
	if ((r = settled()) != CUDA_SUCCESS) return r;
	s->graph = calloc(1, sizeof *s->graph);
	if (!s->graph) return CUDA_ERROR_OUT_OF_MEMORY;
	s->invalidated = 0;
	capturing = s;
	return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (!s || !g) return CUDA_ERROR_INVALID_VALUE;
	if (!s->graph) return CUDA_ERROR_ILLEGAL_STATE;
	if (capturing != s) return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
	capturing = NULL;
	CUgraph graph = s->graph;
	s->graph = NULL;
	if (s->invalidated) {
		graph_free_nodes(graph);
		free(graph);
		*g = NULL;
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	}
	*g = graph;
	return CUDA_SUCCESS;
}

// The capture's state, and the node(s) the next captured operation would depend on: the last
// one captured (captures are chains here).
CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                   const CUgraphNode** deps, size_t* ndeps) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!status) return CUDA_ERROR_INVALID_VALUE;
	if (!s || !s->graph) {
		*status = CU_STREAM_CAPTURE_STATUS_NONE;
		return CUDA_SUCCESS;
	}
	*status = s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	if (id) *id = (cuuint64_t)(uintptr_t)s->graph;
	if (graph) *graph = s->graph;
	size_t n = s->graph->len;
	if (deps) *deps = n ? (const CUgraphNode*)&s->graph->nodes[n - 1].handle : NULL;
	if (ndeps) *ndeps = n ? 1 : 0;
	return CUDA_SUCCESS;
}

// New parameter values (and launch shape) for a kernel node of an instantiated graph; as in
// CUDA 11, the function must stay the same.
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS* p) {
	CUresult r = settled(); // launches queued before keep the parameters they were launched with
	if (r != CUDA_SUCCESS) return r;
	if (!e || !n || !p) return CUDA_ERROR_INVALID_VALUE;
	if (n->index >= e->g.len) return CUDA_ERROR_INVALID_VALUE;
	node* nd = &e->g.nodes[n->index];
	if (nd->kind != NODE_KERNEL || p->func != nd->fn || p->extra) return CUDA_ERROR_INVALID_VALUE;
	uint64_t threads = (uint64_t)p->blockDimX * p->blockDimY * p->blockDimZ;
	if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !threads || threads > 1024 ||
	    (int)p->sharedMemBytes > nd->fn->max_dynamic)
		return CUDA_ERROR_INVALID_VALUE;
	if (nd->fn->nparams > 0 && !p->kernelParams) return CUDA_ERROR_INVALID_VALUE;
	nd->grid[0] = p->gridDimX, nd->grid[1] = p->gridDimY, nd->grid[2] = p->gridDimZ;
	nd->block[0] = p->blockDimX, nd->block[1] = p->blockDimY, nd->block[2] = p->blockDimZ;
	nd->shared = p->sharedMemBytes;
	for (int i = 0; i < nd->fn->nparams; i++) memcpy(&nd->params[i], p->kernelParams[i], 8);
	return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long flags) {
	(void)flags;
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!e || !g) return CUDA_ERROR_INVALID_VALUE;
	CUgraphExec x = calloc(1, sizeof *x);
	if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
	x->g.len = x->g.cap = g->len;
	x->g.nodes = calloc(g->len ? g->len : 1, sizeof(node));
	if (!x->g.nodes) {
		free(x);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	for (size_t i = 0; i < g->len; i++) {
		x->g.nodes[i] = g->nodes[i];
		x->g.nodes[i].handle = NULL;
		if (g->nodes[i].params) {
			int n = g->nodes[i].fn->nparams > 0 ? g->nodes[i].fn->nparams : 1;
			x->g.nodes[i].params = malloc((size_t)n * 8);
			if (!x->g.nodes[i].params) {
				x->g.len = i;
				graph_free_nodes(&x->g);
				free(x);
				return CUDA_ERROR_OUT_OF_MEMORY;
			}
			memcpy(x->g.nodes[i].params, g->nodes[i].params, (size_t)n * 8);
		}
	}
	*e = x;
	return CUDA_SUCCESS;
}

// ---- the stream's queue ----------------------------------------------------------------
// A graph launch is queued, not run: it runs when something waits for it — an event it records
// is waited for (the queue runs up to the last launch recording it), or another call acts on the
// stream or on memory (settled: the whole queue runs first, in order). Until then the graph has
// read nothing, so host memory its copies read must not be rewritten: a host that does so gets
// the wrong results here, as on a GPU. One queue serves every stream (a stricter order).

static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static CUgraphExec* queue;
static size_t qhead, qlen, qcap;

static int enqueue(CUgraphExec e) {
	pthread_mutex_lock(&qmu);
	if (qhead + qlen == qcap) {
		if (qhead > 0) {
			memmove(queue, queue + qhead, qlen * sizeof *queue);
			qhead = 0;
		} else {
			size_t cap = qcap ? 2 * qcap : 16;
			CUgraphExec* q = realloc(queue, cap * sizeof *queue);
			if (!q) {
				pthread_mutex_unlock(&qmu);
				return 0;
			}
			queue = q;
			qcap = cap;
		}
	}
	queue[qhead + qlen++] = e;
	pthread_mutex_unlock(&qmu);
	return 1;
}

static CUgraphExec dequeue(void) {
	CUgraphExec e = NULL;
	pthread_mutex_lock(&qmu);
	if (qlen) {
		e = queue[qhead++];
		if (--qlen == 0) qhead = 0;
	}
	pthread_mutex_unlock(&qmu);
	return e;
}

// run_graph runs an instantiated graph's nodes in order; after a kernel failure the rest only
// settle their events' counts.
static void run_graph(CUgraphExec e) {
	for (size_t i = 0; i < e->g.len; i++) {
		node* n = &e->g.nodes[i];
		if (n->kind == NODE_EVENT) {
			n->event->pending--;
			if (sticky == CUDA_SUCCESS) {
				n->event->recorded = 1;
				n->event->ms = now_ms();
			}
			continue;
		}
		if (sticky != CUDA_SUCCESS) continue;
		if (n->kind == NODE_COPY) {
			memmove(n->dst, n->src, n->bytes);
			continue;
		}
		void* ptrs[256];
		for (int k = 0; k < n->fn->nparams; k++) ptrs[k] = &n->params[k];
		run_kernel(n->fn, n->grid, n->block, n->shared, ptrs);
	}
}

static CUresult drain_until(CUevent ev) {
	CUgraphExec e;
	while ((!ev || ev->pending > 0) && (e = dequeue())) run_graph(e);
	return sticky;
}

static CUresult settled(void) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	return drain_until(NULL);
}

CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!e) return CUDA_ERROR_INVALID_VALUE;
	if (capturing || (s && s->graph)) {
		note("cuGraphLaunch into a stream capture is not emulated");
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	for (size_t i = 0; i < e->g.len; i++) {
		node* n = &e->g.nodes[i];
		if (n->kind == NODE_KERNEL && n->fn->nparams > 256) return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (!enqueue(e)) return CUDA_ERROR_OUT_OF_MEMORY;
	for (size_t i = 0; i < e->g.len; i++)
		if (e->g.nodes[i].kind == NODE_EVENT) e->g.nodes[i].event->pending++;
	return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec e) {
	if (!e) return CUDA_ERROR_INVALID_VALUE;
	if (!capturing && initialized) settled(); // launches of it still queued run first
	graph_free_nodes(&e->g);
	free(e);
	return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g) {
	if (!g) return CUDA_ERROR_INVALID_VALUE;
	graph_free_nodes(g);
	free(g);
	return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int block, size_t shared) {
	CUresult r = ready();
	if (r != CUDA_SUCCESS) return r;
	if (!n || !f || block <= 0) return CUDA_ERROR_INVALID_VALUE;
	int by_threads = 2048 / block, by_shared = shared ? (int)((228 << 10) / shared) : 32;
	*n = by_threads < by_shared ? by_threads : by_shared;
	if (*n > 32) *n = 32;
	return CUDA_SUCCESS;
}

// ---- entry points by name and version (cuGetProcAddress) -------------------------------

// The versioned entry points the fake hands out: a base name, the CUDA version that introduced
// that ABI, and the function. cnnc's runtime/cuda resolves these (driver.c); a lookup of any
// other name says so on stderr, so a new one shows up here.
static const struct {
	const char* name;
	int version;
	void* fn;
} proc_table[] = {
    {"cuCtxCreate", 3020, (void*)cuCtxCreate},
    {"cuCtxDestroy", 4000, (void*)cuCtxDestroy},
    {"cuStreamBeginCapture", 10010, (void*)cuStreamBeginCapture},
    {"cuStreamGetCaptureInfo", 11030, (void*)cuStreamGetCaptureInfo_v2},
    {"cuGraphInstantiateWithFlags", 11040, (void*)cuGraphInstantiateWithFlags},
    {"cuGraphExecKernelNodeSetParams", 10010, (void*)cuGraphExecKernelNodeSetParams},
};

enum { PROC_FOUND = 0, PROC_SYMBOL_NOT_FOUND = 1, PROC_VERSION_NOT_SUFFICIENT = 2 }; // CUdriverProcAddressQueryResult

// hidden reports whether $CNNC_FAKECUDA_HIDE (comma-separated names) hides symbol, to act as
// a driver without it.
static int hidden(const char* symbol) {
	const char* h = getenv("CNNC_FAKECUDA_HIDE");
	size_t n = strlen(symbol);
	for (const char* p = h; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, symbol, n) == 0 && (p[n] == ',' || p[n] == 0)) return 1;
	return 0;
}

// proc_lookup finds the newest version of symbol not newer than the requested CUDA version
// nor than the driver, as the driver does.
static int proc_lookup(const char* symbol, int version, void** fn) {
	int best = -1, named = 0;
	for (size_t i = 0; i < sizeof proc_table / sizeof proc_table[0]; i++) {
		if (strcmp(proc_table[i].name, symbol) != 0 || proc_table[i].version > driver_version() || hidden(symbol))
			continue;
		named = 1;
		if (proc_table[i].version <= version && (best < 0 || proc_table[i].version > proc_table[best].version))
			best = (int)i;
	}
	*fn = best >= 0 ? proc_table[best].fn : NULL;
	if (best >= 0) return PROC_FOUND;
	if (!named) note("cuGetProcAddress: %s is not emulated (or hidden, or newer than driver %d)", symbol, driver_version());
	return named ? PROC_VERSION_NOT_SUFFICIENT : PROC_SYMBOL_NOT_FOUND;
}

static CUresult proc_args(const char* symbol, void** fn, unsigned long long flags) {
	if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
	if (!symbol || !fn || flags > 3) return CUDA_ERROR_INVALID_VALUE; // LEGACY_STREAM | PER_THREAD_DEFAULT_STREAM
	return CUDA_SUCCESS;
}

// CUDA 11.3-11.8's cuGetProcAddress: a missing symbol is CUDA_ERROR_NOT_FOUND.
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char* symbol, void** fn, int version, cuuint64_t flags) {
	CUresult r = proc_args(symbol, fn, flags);
	if (r != CUDA_SUCCESS) return r;
	return proc_lookup(symbol, version, fn) == PROC_FOUND ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

// CUDA 12's (what cuGetProcAddress means in 12.x and 13 headers): a missing symbol succeeds
// with a NULL function, and the query result says why. Declared here, as the fake's own
// headers may predate it.
#if CUDA_VERSION >= 12000
typedef CUdriverProcAddressQueryResult proc_status;
#else
typedef int proc_status;
CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int version, cuuint64_t flags, proc_status* status);
#endif
CUresult cuGetProcAddress_v2(const char* symbol, void** fn, int version, cuuint64_t flags, proc_status* status) {
	CUresult r = proc_args(symbol, fn, flags);
	if (r != CUDA_SUCCESS) return r;
	int found = proc_lookup(symbol, version, fn);
	if (status) *status = (proc_status)found;
	return CUDA_SUCCESS;
}
