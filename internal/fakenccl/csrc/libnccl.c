// A stand-in for NVIDIA's NCCL (libnccl.so.2) that runs collectives between processes on one
// machine, so that cnnc's data-parallel host code — the binding (runtime/nccl), the bootstrap and
// the launcher (runtime/dist) — runs and is tested without GPUs. See ../fakenccl.go for how it
// is built and used.
//
// Topology: a star over Unix sockets. ncclGetUniqueId draws a random token; in ncclCommInitRank
// rank 0 listens on the abstract socket "cnnc-fakenccl-<token>", every other rank connects and
// says who it is, and rank 0 answers once all have joined. An all-reduce streams every rank's
// buffer to rank 0 in chunks; rank 0 sums each chunk in rank order, ((x0 + x1) + x2) + ..., and
// sends the sum back, so every rank gets the same bits in every run, whatever the timing.
//
// Buffers: with a CUDA driver in the process (cnnc's fake libcuda, whose device memory is host
// memory), the buffers are device pointers, read and written through cuMemcpyDtoH/HtoD: the
// driver checks that they lie inside allocations and that a context is current on the calling
// thread, as a GPU would fault. Without a driver (runtime/nccl's own tests) they are host
// memory. Under a real GPU driver the fake refuses to start: its copies would ignore streams.
//
// Execution is synchronous, as in the fake driver: a collective has finished when the call
// returns, and its failure is returned by the call (and kept as the communicator's asynchronous
// error, which real NCCL reports instead). Inside ncclGroupStart/End collectives are queued and
// run in order at ncclGroupEnd. Collectives inside a CUDA graph capture are not emulated.
//
// Failure, on purpose unlike real NCCL (which hangs): a rank that exits, is killed or aborts
// closes its sockets; rank 0 sees it at once, fails the collective naming that rank, and tells
// every other rank why before closing. With $CNNC_FAKENCCL_PEER_DEATH=hang the fake behaves as
// real NCCL does at worst (NVLink P2P, where no network layer notices): a collective that
// meets a rank that is gone (its connection closed) blocks, keeps its sockets open (so the
// ranks waiting on it block too) and leaves ncclCommGetAsyncError at ncclSuccess, until
// ncclCommAbort from another thread (then it fails, naming the abort; an aborting rank tells
// no one, so the others hang in turn) or the timeout below. A rank that stays silent for
// $CNNC_FAKENCCL_TIMEOUT seconds (default 600, as PyTorch's NCCL timeout) fails the collective
// too. Ranks that call
// different collectives (count, type or operation) are reported instead of exchanging garbage.
// A failed communicator stays failed; ncclGetLastError says why.
//
// Emulated: ncclAllReduce (sum) and ncclBroadcast (the root's data sent to every rank through
// rank 0), of int32, int64, float32, float64 and bfloat16 (rounded to bfloat16 after every
// addition, as NCCL's bf16 kernels do). Not emulated (ncclInvalidArgument, said on stderr):
// other operations and types, one process holding several ranks of one communicator.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

// ---- NCCL's public API types, from nccl.h (NVIDIA/nccl src/nccl.h.in), declared here so that
// the fake builds without NCCL's headers. The values are NCCL's ABI.

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclTimeout = 8,
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
	ncclInt8 = 0,
	ncclUint8 = 1,
	ncclInt32 = 2,
	ncclUint32 = 3,
	ncclInt64 = 4,
	ncclUint64 = 5,
	ncclFloat16 = 6,
	ncclFloat32 = 7,
	ncclFloat64 = 8,
	ncclBfloat16 = 9,
} ncclDataType_t;

typedef struct ncclComm* ncclComm_t;
typedef void* cudaStream_t;

#define API __attribute__((visibility("default")))

// The version the fake reports (NCCL_VERSION(2, 21, 5): the API it follows), unless
// $CNNC_FAKENCCL_VERSION gives another code (tests of version checks).
#define FAKE_VERSION_CODE 22105
#define FAKE_DEVICE_PREFIX "cnnc fake CUDA device"
#define CHUNK_BYTES (1u << 20)
#define ID_MAGIC "cnnc-fakenccl-1"

// ---- errors --------------------------------------------------------------------------------

static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];

static void debug_note(const char* msg) {
	const char* d = getenv("NCCL_DEBUG");
	if (d && *d) fprintf(stderr, "cnnc fake libnccl: %s\n", msg);
}

static void set_last(const char* msg) {
	pthread_mutex_lock(&last_mu);
	snprintf(last_error, sizeof last_error, "%s", msg);
	pthread_mutex_unlock(&last_mu);
	debug_note(msg);
}

// fail records why a call without a communicator failed and returns r.
static ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	set_last(msg);
	return r;
}

// not_emulated says so on stderr (always: it is a gap of the fake, not a user error).
static ncclResult_t not_emulated(const char* what) {
	fprintf(stderr, "cnnc fake libnccl: %s is not emulated\n", what);
	return fail(ncclInvalidArgument, "%s is not emulated by cnnc's fake libnccl", what);
}

API const char* ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	case ncclTimeout: return "timeout";
	}
	return "unknown result code";
}

// Like NCCL's, the last error is the process's, whatever the communicator.
API const char* ncclGetLastError(ncclComm_t comm) {
	(void)comm;
	return last_error;
}

API ncclResult_t ncclGetVersion(int* v) {
	if (!v) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
	const char* e = getenv("CNNC_FAKENCCL_VERSION");
	*v = e && *e ? atoi(e) : FAKE_VERSION_CODE;
	return ncclSuccess;
}

// ---- the CUDA driver, if the process has one ---------------------------------------------

typedef int (*cu_dtoh_fn)(void*, unsigned long long, size_t);
typedef int (*cu_htod_fn)(unsigned long long, const void*, size_t);
typedef int (*cu_capture_fn)(void*, int*, unsigned long long*, void**, const void**, size_t*);
typedef int (*cu_ctx_device_fn)(int*);
typedef int (*cu_device_name_fn)(char*, int, int);
typedef int (*cu_error_name_fn)(int, const char**);

static struct {
	int present;
	cu_dtoh_fn dtoh;
	cu_htod_fn htod;
	cu_capture_fn capture_info;
	cu_ctx_device_fn ctx_device;
	cu_device_name_fn device_name;
	cu_error_name_fn error_name;
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void find_driver(void) {
	drv.dtoh = (cu_dtoh_fn)dlsym(RTLD_DEFAULT, "cuMemcpyDtoH_v2");
	drv.htod = (cu_htod_fn)dlsym(RTLD_DEFAULT, "cuMemcpyHtoD_v2");
	drv.capture_info = (cu_capture_fn)dlsym(RTLD_DEFAULT, "cuStreamGetCaptureInfo_v2");
	drv.ctx_device = (cu_ctx_device_fn)dlsym(RTLD_DEFAULT, "cuCtxGetDevice");
	drv.device_name = (cu_device_name_fn)dlsym(RTLD_DEFAULT, "cuDeviceGetName");
	drv.error_name = (cu_error_name_fn)dlsym(RTLD_DEFAULT, "cuGetErrorName");
	drv.present = drv.dtoh || drv.htod;
}

static const char* cu_name(int r) {
	const char* s = NULL;
	if (drv.error_name && drv.error_name(r, &s) == 0 && s) return s;
	return "CUDA error";
}

// driver_check is done once per communicator: the buffers of a driver's process are device
// memory of a current context, and only the fake driver's device memory is host memory.
static ncclResult_t driver_check(void) {
	pthread_once(&drv_once, find_driver);
	if (!drv.present) return ncclSuccess;
	if (!drv.dtoh || !drv.htod || !drv.ctx_device || !drv.device_name || !drv.capture_info)
		return fail(ncclUnhandledCudaError, "the CUDA driver in this process lacks cuMemcpyDtoH_v2, cuMemcpyHtoD_v2, "
		                                    "cuCtxGetDevice, cuDeviceGetName or cuStreamGetCaptureInfo_v2");
	int dev = 0;
	int r = drv.ctx_device(&dev);
	if (r != 0)
		return fail(ncclUnhandledCudaError,
		            "cuCtxGetDevice: %s (%d): no CUDA context is current on the thread calling NCCL", cu_name(r), r);
	char name[256] = {0};
	r = drv.device_name(name, sizeof name, dev);
	if (r != 0) return fail(ncclUnhandledCudaError, "cuDeviceGetName: %s (%d)", cu_name(r), r);
	if (strncmp(name, FAKE_DEVICE_PREFIX, strlen(FAKE_DEVICE_PREFIX)) != 0)
		return fail(ncclInvalidUsage,
		            "cnnc's fake libnccl runs only under cnnc's fake CUDA driver (or without one), but this "
		            "process uses %s: put NVIDIA's libnccl.so.2 first on LD_LIBRARY_PATH",
		            name);
	return ncclSuccess;
}

// ---- communicators -------------------------------------------------------------------------

enum { MSG_HELLO = 1, MSG_WELCOME, MSG_ALLREDUCE, MSG_RESULT, MSG_FAIL, MSG_BROADCAST };

// Every message starts with this header (a broadcast's root in op); chunks of data follow
// MSG_ALLREDUCE and, from its root only, MSG_BROADCAST (from a rank to
// rank 0, raw) and MSG_RESULT (back).
typedef struct {
	uint32_t kind;
	int32_t rank, nranks, pid;
	int32_t dtype, op;
	uint64_t seq, count;
	char text[480]; // MSG_FAIL: why
} msg;

struct ncclComm {
	int rank, nranks;
	int root_fd;      // ranks > 0: the socket to rank 0
	int* fds;         // rank 0: fds[r], the socket to rank r (fds[0] unused)
	int* pids;        // the process of each rank, for messages (rank 0 knows all)
	char* partial;    // rank 0: partial[r] while a message to rank r is half sent
	uint64_t seq;     // collectives started
	ncclResult_t err; // the first failure (atomic): the communicator is unusable after it
	char tag[40];     // "AllReduce #12" while in one
	pthread_mutex_t mu; // guards the sockets, busy and aborted against ncclCommAbort
	int busy;         // collectives running
	int aborted;
};

// comm_fail records a communicator's failure, which stays.
static ncclResult_t comm_fail(ncclComm_t c, ncclResult_t r, const char* fmt, ...) {
	char msg_[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg_, sizeof msg_, fmt, ap);
	va_end(ap);
	char full[1100];
	snprintf(full, sizeof full, "rank %d: %s", c->rank, msg_);
	set_last(full);
	ncclResult_t none = ncclSuccess;
	__atomic_compare_exchange_n(&c->err, &none, r, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	return r;
}

static double now_s(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

// hang_mode is $CNNC_FAKENCCL_PEER_DEATH=hang: a peer's death blocks collectives (see the top).
static int hang_mode(void) {
	const char* e = getenv("CNNC_FAKENCCL_PEER_DEATH");
	return e && strcmp(e, "hang") == 0;
}

static double timeout_s(void) {
	const char* e = getenv("CNNC_FAKENCCL_TIMEOUT");
	double t = e && *e ? atof(e) : 600;
	return t > 0 ? t : 600;
}

// wait_fd polls fd for events until deadline: 1 ready (or hung up), 0 timed out, -1 error.
static int wait_fd(int fd, short events, double deadline) {
	for (;;) {
		double left = deadline - now_s();
		if (left <= 0) return 0;
		struct pollfd p = {.fd = fd, .events = events};
		int n = poll(&p, 1, left > 1 ? 1000 : (int)(left * 1000) + 1);
		if (n > 0) return 1;
		if (n < 0 && errno != EINTR) return -1;
	}
}

// io_result is what a blocking step of the protocol ended with.
// IO_HUNG: in hang mode, a rank was gone and nothing aborted the communicator within the timeout.
typedef enum { IO_OK, IO_CLOSED, IO_TIMEOUT, IO_ERROR, IO_HUNG } io_result;

static io_result send_all(int fd, const void* buf, size_t n, double limit) {
	const char* p = buf;
	double deadline = now_s() + limit;
	while (n > 0) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k > 0) {
			p += k, n -= (size_t)k;
			deadline = now_s() + limit; // progress
			continue;
		}
		if (k < 0 && errno == EINTR) continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			int w = wait_fd(fd, POLLOUT, deadline);
			if (w == 0) return IO_TIMEOUT;
			if (w < 0) return IO_ERROR;
			continue;
		}
		return (errno == EPIPE || errno == ECONNRESET) ? IO_CLOSED : IO_ERROR;
	}
	return IO_OK;
}

static io_result recv_all(int fd, void* buf, size_t n, double limit) {
	char* p = buf;
	double deadline = now_s() + limit;
	while (n > 0) {
		ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
		if (k > 0) {
			p += k, n -= (size_t)k;
			deadline = now_s() + limit;
			continue;
		}
		if (k == 0) return IO_CLOSED;
		if (errno == EINTR) continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			int w = wait_fd(fd, POLLIN, deadline);
			if (w == 0) return IO_TIMEOUT;
			if (w < 0) return IO_ERROR;
			continue;
		}
		return errno == ECONNRESET ? IO_CLOSED : IO_ERROR;
	}
	return IO_OK;
}

static void id_token(const ncclUniqueId* id, char hex[33]) {
	const unsigned char* t = (const unsigned char*)id->internal + 16;
	for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", t[i]);
}

static socklen_t socket_address(const ncclUniqueId* id, struct sockaddr_un* a) {
	char hex[33];
	id_token(id, hex);
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	// abstract namespace: a leading NUL, no file, gone with the socket
	int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "cnnc-fakenccl-%s", hex);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
	if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
	memset(id, 0, sizeof *id);
	memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC); // 16 bytes with its NUL
	size_t got = 0;
	while (got < 16) {
		ssize_t k = getrandom(id->internal + 16 + got, 16 - got, 0);
		if (k < 0 && errno != EINTR) return fail(ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
		if (k > 0) got += (size_t)k;
	}
	return ncclSuccess;
}

static void close_all_locked(ncclComm_t c) {
	if (c->root_fd >= 0) close(c->root_fd);
	c->root_fd = -1;
	if (c->fds)
		for (int r = 1; r < c->nranks; r++)
			if (c->fds[r] >= 0) close(c->fds[r]), c->fds[r] = -1;
}

static void close_all(ncclComm_t c) {
	pthread_mutex_lock(&c->mu);
	close_all_locked(c);
	pthread_mutex_unlock(&c->mu);
}

static void free_comm(ncclComm_t c) {
	close_all_locked(c);
	pthread_mutex_destroy(&c->mu);
	free(c->fds);
	free(c->pids);
	free(c->partial);
	free(c);
}

static void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// tell_fail is rank 0 telling rank r why the communicator failed, best effort: a rank that is
// blocked sending to rank 0 finds the message after its send fails.
static void tell_fail(int fd, const char* why) {
	msg m = {.kind = MSG_FAIL};
	snprintf(m.text, sizeof m.text, "%s", why);
	send(fd, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// root_abort fails rank 0's communicator, tells the other ranks why, and closes every socket.
static ncclResult_t root_abort(ncclComm_t c, ncclResult_t r, const char* fmt, ...) {
	char why[440];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	int aborted = __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST);
	if (aborted) snprintf(why, sizeof why, "%s: this rank aborted the communicator (ncclCommAbort)", c->tag);
	comm_fail(c, r, "%s", why);
	char told[480];
	snprintf(told, sizeof told, "rank 0 stopped: %s", why);
	// in hang mode an abort only closes the connections: the others hang, as with real NCCL
	for (int k = 1; k < c->nranks && !(aborted && hang_mode()); k++)
		if (c->fds[k] >= 0 && !c->partial[k]) tell_fail(c->fds[k], told); // else it would read it as data
	close_all(c);
	return r;
}

static const char* io_words(io_result io) {
	switch (io) {
	case IO_CLOSED: return "closed its connection (it exited, was killed or aborted its communicator)";
	case IO_TIMEOUT: return "sent nothing within the timeout ($CNNC_FAKENCCL_TIMEOUT seconds)";
	case IO_HUNG:
		return "closed its connection, and with $CNNC_FAKENCCL_PEER_DEATH=hang the collective waited "
		       "$CNNC_FAKENCCL_TIMEOUT seconds for ncclCommAbort";
	default: return "failed";
	}
}

static ncclResult_t io_code(io_result io) { return io == IO_TIMEOUT || io == IO_HUNG ? ncclTimeout : ncclRemoteError; }

// hang_on_death is what a collective does in hang mode when an exchange found a rank gone
// (io: IO_CLOSED): as real NCCL's kernels spin on a peer that never answers, it blocks until
// ncclCommAbort (returns IO_CLOSED, the failure then naming the abort) or the timeout (returns
// IO_HUNG). The asynchronous error stays ncclSuccess meanwhile. Other results, and every
// result outside hang mode, are returned as they are.
static io_result hang_on_death(ncclComm_t c, io_result io) {
	if (io != IO_CLOSED || !hang_mode()) return io;
	double limit = timeout_s(), deadline = now_s() + limit;
	while (!__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) {
		if (now_s() > deadline) return IO_HUNG;
		usleep(5000);
	}
	return IO_CLOSED;
}

static ncclResult_t root_init(ncclComm_t c, const ncclUniqueId* id) {
	struct sockaddr_un a;
	socklen_t alen = socket_address(id, &a);
	int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ls < 0) return comm_fail(c, ncclSystemError, "socket: %s", strerror(errno));
	if (bind(ls, (struct sockaddr*)&a, alen) != 0 || listen(ls, c->nranks) != 0) {
		int e = errno;
		close(ls);
		return comm_fail(c, ncclSystemError, "listening on @%s: %s (is this id used by another communicator?)",
		                 a.sun_path + 1, strerror(e));
	}
	set_nonblocking(ls);
	double limit = timeout_s(), deadline = now_s() + limit;
	int joined = 0;
	ncclResult_t r = ncclSuccess;
	char why[480] = "";
	while (joined < c->nranks - 1) {
		int w = wait_fd(ls, POLLIN, deadline);
		if (w <= 0) {
			char missing[256] = "";
			size_t n = 0;
			for (int k = 1; k < c->nranks && n + 12 < sizeof missing; k++)
				if (c->fds[k] < 0) n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%d", n ? ", " : "", k);
			r = w == 0 ? ncclTimeout : ncclSystemError;
			snprintf(why, sizeof why, "%s %s of %d did not join within %.0f s", c->nranks - 1 - joined > 1 ? "ranks" : "rank",
			         missing, c->nranks, limit);
			break;
		}
		int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) continue;
		msg h;
		io_result io = recv_all(fd, &h, sizeof h, limit);
		if (io != IO_OK || h.kind != MSG_HELLO) {
			close(fd); // not a rank, or one that died while joining: it may reconnect
			continue;
		}
		if (h.nranks != c->nranks || h.rank < 1 || h.rank >= c->nranks || c->fds[h.rank] >= 0) {
			r = ncclInvalidUsage;
			if (h.nranks != c->nranks)
				snprintf(why, sizeof why, "rank %d (pid %d) says there are %d ranks, rank 0 says %d", h.rank, h.pid,
				         h.nranks, c->nranks);
			else if (h.rank < 1 || h.rank >= c->nranks)
				snprintf(why, sizeof why, "a process (pid %d) says it is rank %d of %d", h.pid, h.rank, h.nranks);
			else
				snprintf(why, sizeof why, "two processes (pids %d and %d) claim rank %d", c->pids[h.rank], h.pid,
				         h.rank);
			tell_fail(fd, why);
			close(fd);
			break;
		}
		c->fds[h.rank] = fd;
		c->pids[h.rank] = h.pid;
		joined++;
	}
	close(ls);
	if (r != ncclSuccess) return root_abort(c, r, "ncclCommInitRank: %s", why);
	msg w = {.kind = MSG_WELCOME, .rank = 0, .nranks = c->nranks, .pid = getpid()};
	for (int k = 1; k < c->nranks; k++) {
		io_result io = send_all(c->fds[k], &w, sizeof w, limit);
		if (io != IO_OK)
			return root_abort(c, io_code(io), "ncclCommInitRank: rank %d (pid %d) %s", k, c->pids[k], io_words(io));
	}
	return ncclSuccess;
}

static ncclResult_t peer_init(ncclComm_t c, const ncclUniqueId* id) {
	struct sockaddr_un a;
	socklen_t alen = socket_address(id, &a);
	double limit = timeout_s(), deadline = now_s() + limit;
	int fd = -1;
	for (;;) { // rank 0 may not listen yet
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) return comm_fail(c, ncclSystemError, "socket: %s", strerror(errno));
		if (connect(fd, (struct sockaddr*)&a, alen) == 0) break;
		int e = errno;
		close(fd);
		if (now_s() > deadline)
			return comm_fail(c, ncclTimeout, "ncclCommInitRank: rank 0 did not listen on @%s within %.0f s (%s)",
			                 a.sun_path + 1, limit, strerror(e));
		usleep(10000);
	}
	set_nonblocking(fd);
	c->root_fd = fd;
	msg h = {.kind = MSG_HELLO, .rank = c->rank, .nranks = c->nranks, .pid = getpid()};
	io_result io = send_all(fd, &h, sizeof h, limit);
	msg w;
	// Rank 0 decides who did not join, by the same timeout: wait a little longer, to hear it.
	if (io == IO_OK) io = recv_all(fd, &w, sizeof w, limit + 5);
	if (io != IO_OK) {
		close_all(c);
		return comm_fail(c, io_code(io), "ncclCommInitRank: rank 0 %s", io_words(io));
	}
	if (w.kind == MSG_FAIL) {
		close_all(c);
		return comm_fail(c, ncclRemoteError, "%s", w.text);
	}
	c->pids[0] = w.pid;
	return ncclSuccess;
}

static __thread int group_depth;

API ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
	if (!out) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
	*out = NULL;
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
	if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0)
		return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is not one of the fake's ncclGetUniqueId");
	if (group_depth > 0) return not_emulated("ncclCommInitRank inside ncclGroupStart/End (one rank per process)");
	ncclResult_t r = driver_check();
	if (r != ncclSuccess) return r;
	ncclComm_t c = calloc(1, sizeof *c);
	if (!c) return fail(ncclSystemError, "out of host memory");
	c->rank = rank, c->nranks = nranks, c->root_fd = -1;
	pthread_mutex_init(&c->mu, NULL);
	c->fds = malloc(sizeof(int) * (size_t)nranks);
	c->pids = calloc((size_t)nranks, sizeof(int));
	c->partial = calloc((size_t)nranks, 1);
	if (!c->fds || !c->pids || !c->partial) {
		free_comm(c);
		return fail(ncclSystemError, "out of host memory");
	}
	for (int k = 0; k < nranks; k++) c->fds[k] = -1;
	c->pids[rank] = getpid();
	if (nranks > 1) r = rank == 0 ? root_init(c, &id) : peer_init(c, &id);
	if (r != ncclSuccess) {
		free_comm(c);
		return r;
	}
	*out = c;
	return ncclSuccess;
}

// Destroy frees the communicator; like NCCL's, it must not race with other calls on it.
API ncclResult_t ncclCommDestroy(ncclComm_t c) {
	if (!c) return ncclSuccess; // NCCL accepts NULL
	if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) return ncclSuccess; // already given up (and kept: see ncclCommAbort)
	free_comm(c);
	return ncclSuccess;
}

// Abort may be called while another thread is in a collective on c (a watchdog's way out): it
// shuts the sockets down, which wakes that thread, which fails, and the other ranks see the
// connection close. The communicator's memory is kept — another thread may still be about to
// use it — so that every later call fails cleanly.
API ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (!c) return ncclSuccess;
	pthread_mutex_lock(&c->mu);
	__atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
	if (c->busy) {
		if (c->root_fd >= 0) shutdown(c->root_fd, SHUT_RDWR);
		for (int k = 1; k < c->nranks && c->rank == 0; k++)
			if (c->fds[k] >= 0) shutdown(c->fds[k], SHUT_RDWR);
	} else {
		close_all_locked(c);
	}
	pthread_mutex_unlock(&c->mu);
	ncclResult_t none = ncclSuccess;
	__atomic_compare_exchange_n(&c->err, &none, ncclRemoteError, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
	return ncclSuccess;
}

API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) {
	if (!c || !e) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
	*e = __atomic_load_n(&c->err, __ATOMIC_SEQ_CST);
	return ncclSuccess;
}

API ncclResult_t ncclCommCount(const ncclComm_t c, int* n) {
	if (!c || !n) return fail(ncclInvalidArgument, "ncclCommCount: NULL argument");
	*n = c->nranks;
	return ncclSuccess;
}

API ncclResult_t ncclCommUserRank(const ncclComm_t c, int* r) {
	if (!c || !r) return fail(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
	*r = c->rank;
	return ncclSuccess;
}

// ---- reductions ----------------------------------------------------------------------------

static size_t type_size(ncclDataType_t t) {
	switch (t) {
	case ncclInt32:
	case ncclFloat32: return 4;
	case ncclInt64:
	case ncclFloat64: return 8;
	case ncclBfloat16: return 2;
	default: return 0;
	}
}

static const char* type_name(int t) {
	static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"};
	return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "unknown type";
}

static const char* op_name(int op) {
	static const char* names[] = {"sum", "prod", "max", "min", "avg"};
	return op >= 0 && op < 5 ? names[op] : "unknown op";
}

static float bf16_to_f32(uint16_t h) {
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

// f32_to_bf16 rounds to nearest, ties to even (as __float2bfloat16_rn); NaN stays NaN.
static uint16_t f32_to_bf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

// add_into sets acc[i] += x[i]. Integers wrap (two's complement, as on the GPU); a bfloat16 sum
// is the float32 sum of the two (exact: both have 8-bit significands, and when their exponents
// differ by more than 16 the float32 rounding cannot reach a bfloat16 tie) rounded to bfloat16.
static void add_into(void* acc, const void* x, size_t n, ncclDataType_t t) {
	switch (t) {
	case ncclInt32: {
		uint32_t* a = acc;
		const uint32_t* b = x;
		for (size_t i = 0; i < n; i++) a[i] += b[i];
		break;
	}
	case ncclInt64: {
		uint64_t* a = acc;
		const uint64_t* b = x;
		for (size_t i = 0; i < n; i++) a[i] += b[i];
		break;
	}
	case ncclFloat32: {
		float* a = acc;
		const float* b = x;
		for (size_t i = 0; i < n; i++) a[i] += b[i];
		break;
	}
	case ncclFloat64: {
		double* a = acc;
		const double* b = x;
		for (size_t i = 0; i < n; i++) a[i] += b[i];
		break;
	}
	case ncclBfloat16: {
		uint16_t* a = acc;
		const uint16_t* b = x;
		for (size_t i = 0; i < n; i++) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
		break;
	}
	default: break;
	}
}

// ---- all-reduce ----------------------------------------------------------------------------

// copy_in and copy_out move one chunk between the caller's buffer (device memory under a
// driver) and the fake's host memory; they return the driver's CUresult (0: done).
static int copy_in(void* dst, const char* src, size_t n) {
	if (!drv.present) return memcpy(dst, src, n), 0;
	return drv.dtoh(dst, (unsigned long long)(uintptr_t)src, n);
}

static int copy_out(char* dst, const void* src, size_t n) {
	if (!drv.present) return memcpy(dst, src, n), 0;
	return drv.htod((unsigned long long)(uintptr_t)dst, src, n);
}

#define COPY_IN_FAILED "%s: cuMemcpyDtoH of the send buffer: %s (%d)"
#define COPY_OUT_FAILED "%s: cuMemcpyHtoD to the receive buffer: %s (%d)"

// gather receives n bytes from every other rank k into into[k] (rank 0), from all of them at
// once, so that a rank that dies is noticed whichever rank is slow.
static ncclResult_t gather(ncclComm_t c, char** into, size_t n) {
	size_t* got = calloc((size_t)c->nranks, sizeof(size_t));
	struct pollfd* p = calloc((size_t)c->nranks, sizeof(struct pollfd));
	int* who = calloc((size_t)c->nranks, sizeof(int));
	if (!got || !p || !who) {
		free(got), free(p), free(who);
		return root_abort(c, ncclSystemError, "out of host memory");
	}
	double limit = timeout_s();
	double deadline = now_s() + limit;
	ncclResult_t r = ncclSuccess;
	for (;;) {
		int np = 0;
		for (int k = 1; k < c->nranks; k++)
			if (got[k] < n) p[np] = (struct pollfd){.fd = c->fds[k], .events = POLLIN}, who[np++] = k;
		if (np == 0) break;
		double left = deadline - now_s();
		if (left <= 0) {
			int k = who[0];
			r = root_abort(c, ncclTimeout, "%s: rank %d (pid %d) %s", c->tag, k, c->pids[k], io_words(IO_TIMEOUT));
			break;
		}
		int ready = poll(p, (nfds_t)np, left > 1 ? 1000 : (int)(left * 1000) + 1);
		if (ready < 0 && errno != EINTR) {
			r = root_abort(c, ncclSystemError, "%s: poll: %s", c->tag, strerror(errno));
			break;
		}
		for (int i = 0; i < np && ready > 0 && r == ncclSuccess; i++) {
			if (!p[i].revents) continue;
			int k = who[i];
			ssize_t m = recv(c->fds[k], into[k] + got[k], n - got[k], MSG_DONTWAIT);
			if (m > 0) {
				got[k] += (size_t)m;
				deadline = now_s() + limit;
			} else if (m == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
				io_result io = hang_on_death(c, IO_CLOSED);
				r = root_abort(c, io_code(io), "%s: rank %d (pid %d) %s", c->tag, k, c->pids[k], io_words(io));
			}
		}
		if (r != ncclSuccess) break;
	}
	free(got), free(p), free(who);
	return r;
}

// call_words describes a collective for messages: "AllReduce, sum", "Broadcast from rank 2".
static void call_words(char* out, size_t n, uint32_t kind, int op) {
	if (kind == MSG_BROADCAST)
		snprintf(out, n, "Broadcast from rank %d", op);
	else if (kind == MSG_ALLREDUCE)
		snprintf(out, n, "AllReduce, %s", op_name(op));
	else
		snprintf(out, n, "message %u", kind);
}

// root_check_calls makes sure that every rank is in the same collective as rank 0.
static ncclResult_t root_check_calls(ncclComm_t c, uint32_t kind, size_t count, ncclDataType_t t, int op) {
	msg* h = calloc((size_t)c->nranks, sizeof(msg));
	char** into = calloc((size_t)c->nranks, sizeof(char*));
	if (!h || !into) {
		free(h), free(into);
		return root_abort(c, ncclSystemError, "out of host memory");
	}
	for (int k = 0; k < c->nranks; k++) into[k] = (char*)&h[k];
	ncclResult_t r = gather(c, into, sizeof(msg));
	for (int k = 1; k < c->nranks && r == ncclSuccess; k++) {
		if (h[k].kind == kind && h[k].seq == c->seq && h[k].count == count && h[k].dtype == (int)t &&
		    h[k].op == (int)op)
			continue;
		char theirs[96], ours[96];
		call_words(theirs, sizeof theirs, h[k].kind, h[k].op);
		call_words(ours, sizeof ours, kind, op);
		r = root_abort(c, ncclInvalidUsage,
		               "%s: rank %d called collective #%llu with %llu x %s (%s), rank 0 #%llu with %zu x %s "
		               "(%s): every rank must make the same collective calls in the same order",
		               c->tag, k, (unsigned long long)h[k].seq, (unsigned long long)h[k].count, type_name(h[k].dtype),
		               theirs, (unsigned long long)c->seq, count, type_name(t), ours);
	}
	free(h), free(into);
	return r;
}

// root_send_result sends one chunk of the sum to rank k.
static ncclResult_t root_send_result(ncclComm_t c, int k, const char* sum, size_t n) {
	double limit = timeout_s();
	msg res = {.kind = MSG_RESULT, .seq = c->seq};
	c->partial[k] = 1;
	io_result io = send_all(c->fds[k], &res, sizeof res, limit);
	if (io == IO_OK) io = send_all(c->fds[k], sum, n, limit);
	io = hang_on_death(c, io);
	if (io != IO_OK) return root_abort(c, io_code(io), "%s: rank %d (pid %d) %s", c->tag, k, c->pids[k], io_words(io));
	c->partial[k] = 0;
	return ncclSuccess;
}

static ncclResult_t root_allreduce(ncclComm_t c, const char* send_p, char* recv_p, size_t count, ncclDataType_t t,
                                   ncclRedOp_t op) {
	ncclResult_t r = root_check_calls(c, MSG_ALLREDUCE, count, t, op);
	if (r != ncclSuccess) return r;
	size_t size = type_size(t), per = CHUNK_BYTES / size;
	char** staging = calloc((size_t)c->nranks, sizeof(char*));
	if (!staging) return root_abort(c, ncclSystemError, "out of host memory");
	for (int k = 0; k < c->nranks && r == ncclSuccess; k++)
		if (!(staging[k] = malloc(CHUNK_BYTES))) r = root_abort(c, ncclSystemError, "out of host memory");
	for (size_t at = 0; at < count && r == ncclSuccess; at += per) {
		size_t n = (count - at < per ? count - at : per) * size;
		int e = copy_in(staging[0], send_p + at * size, n);
		if (e != 0) {
			r = root_abort(c, ncclUnhandledCudaError, COPY_IN_FAILED, c->tag, cu_name(e), e);
			break;
		}
		if ((r = gather(c, staging, n)) != ncclSuccess) break;
		for (int k = 1; k < c->nranks; k++) add_into(staging[0], staging[k], n / size, t); // in rank order
		for (int k = 1; k < c->nranks && r == ncclSuccess; k++) r = root_send_result(c, k, staging[0], n);
		if (r == ncclSuccess && (e = copy_out(recv_p + at * size, staging[0], n)) != 0)
			r = root_abort(c, ncclUnhandledCudaError, COPY_OUT_FAILED, c->tag, cu_name(e), e);
	}
	for (int k = 0; k < c->nranks; k++) free(staging[k]);
	free(staging);
	return r;
}

// root_broadcast: chunk by chunk, rank 0 takes the root's data (its own buffer, or from the
// root's socket) and sends it to every other rank, the root included (which gets its own bits
// back), then writes it to its receive buffer.
static ncclResult_t root_broadcast(ncclComm_t c, const char* send_p, char* recv_p, size_t count, ncclDataType_t t,
                                   int root) {
	ncclResult_t r = root_check_calls(c, MSG_BROADCAST, count, t, root);
	if (r != ncclSuccess) return r;
	size_t size = type_size(t), per = CHUNK_BYTES / size;
	char* buf = malloc(CHUNK_BYTES);
	if (!buf) return root_abort(c, ncclSystemError, "out of host memory");
	for (size_t at = 0; at < count && r == ncclSuccess; at += per) {
		size_t n = (count - at < per ? count - at : per) * size;
		int e = 0;
		if (root == 0) {
			if ((e = copy_in(buf, send_p + at * size, n)) != 0) {
				r = root_abort(c, ncclUnhandledCudaError, COPY_IN_FAILED, c->tag, cu_name(e), e);
				break;
			}
		} else {
			io_result io = hang_on_death(c, recv_all(c->fds[root], buf, n, timeout_s()));
			if (io != IO_OK) {
				r = root_abort(c, io_code(io), "%s: rank %d (pid %d) %s", c->tag, root, c->pids[root], io_words(io));
				break;
			}
		}
		for (int k = 1; k < c->nranks && r == ncclSuccess; k++) r = root_send_result(c, k, buf, n);
		if (r == ncclSuccess && (e = copy_out(recv_p + at * size, buf, n)) != 0)
			r = root_abort(c, ncclUnhandledCudaError, COPY_OUT_FAILED, c->tag, cu_name(e), e);
	}
	free(buf);
	return r;
}

// peer_lost explains a failed exchange with rank 0: by rank 0's own message if it sent one.
static ncclResult_t peer_lost(ncclComm_t c, io_result io) {
	msg m;
	if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) {
		close_all(c);
		return comm_fail(c, ncclRemoteError, "%s: this rank aborted the communicator (ncclCommAbort)", c->tag);
	}
	if (io == IO_CLOSED && c->root_fd >= 0 && recv_all(c->root_fd, &m, sizeof m, 1.0) == IO_OK && m.kind == MSG_FAIL) {
		close_all(c);
		return comm_fail(c, ncclRemoteError, "%s", m.text);
	}
	io = hang_on_death(c, io); // rank 0 is gone without a word: in hang mode, wait for an abort
	if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) {
		close_all(c);
		return comm_fail(c, ncclRemoteError, "%s: this rank aborted the communicator (ncclCommAbort)", c->tag);
	}
	close_all(c);
	return comm_fail(c, io_code(io), "%s: rank 0 (pid %d) %s", c->tag, c->pids[0], io_words(io));
}

// peer_fail ends a rank's part for a reason of its own; closing tells rank 0 it left.
static ncclResult_t peer_fail(ncclComm_t c, ncclResult_t r, const char* fmt, const char* a, int e) {
	close_all(c);
	return comm_fail(c, r, fmt, c->tag, a, e);
}

// peer_collective is a rank's part of an all-reduce (kind MSG_ALLREDUCE, op the operation) or
// a broadcast (MSG_BROADCAST, op the root): per chunk, it sends its data to rank 0 (an
// all-reduce's every rank, a broadcast's root) and receives the result.
static ncclResult_t peer_collective(ncclComm_t c, uint32_t kind, const char* send_p, char* recv_p, size_t count,
                                    ncclDataType_t t, int op) {
	double limit = timeout_s();
	int sends = kind == MSG_ALLREDUCE || c->rank == op;
	msg h = {.kind = kind,
	         .rank = c->rank,
	         .nranks = c->nranks,
	         .pid = getpid(),
	         .dtype = t,
	         .op = op,
	         .seq = c->seq,
	         .count = count};
	io_result io = send_all(c->root_fd, &h, sizeof h, limit);
	if (io != IO_OK) return peer_lost(c, io);
	size_t size = type_size(t), per = CHUNK_BYTES / size;
	char* buf = malloc(CHUNK_BYTES);
	if (!buf) return peer_fail(c, ncclSystemError, "%s: %s (%d)", "out of host memory", 0);
	ncclResult_t r = ncclSuccess;
	for (size_t at = 0; at < count && r == ncclSuccess; at += per) {
		size_t n = (count - at < per ? count - at : per) * size;
		int e = sends ? copy_in(buf, send_p + at * size, n) : 0;
		if (e != 0) {
			r = peer_fail(c, ncclUnhandledCudaError, COPY_IN_FAILED, cu_name(e), e);
			break;
		}
		msg m;
		io = sends ? send_all(c->root_fd, buf, n, limit) : IO_OK;
		if (io == IO_OK) io = recv_all(c->root_fd, &m, sizeof m, limit);
		if (io == IO_OK && m.kind == MSG_FAIL) {
			close_all(c);
			r = comm_fail(c, ncclRemoteError, "%s", m.text);
			break;
		}
		if (io == IO_OK && (m.kind != MSG_RESULT || m.seq != c->seq)) {
			r = peer_fail(c, ncclInternalError, "%s: %s %d from rank 0", "unexpected message", (int)m.kind);
			break;
		}
		if (io == IO_OK) io = recv_all(c->root_fd, buf, n, limit);
		if (io != IO_OK) {
			r = peer_lost(c, io);
			break;
		}
		if ((e = copy_out(recv_p + at * size, buf, n)) != 0)
			r = peer_fail(c, ncclUnhandledCudaError, COPY_OUT_FAILED, cu_name(e), e);
	}
	free(buf);
	return r;
}

// local_copy is a one-rank all-reduce: the sum of one buffer.
static ncclResult_t local_copy(ncclComm_t c, const char* send_p, char* recv_p, size_t n) {
	char* buf = malloc(n < CHUNK_BYTES ? n : CHUNK_BYTES);
	if (!buf) return comm_fail(c, ncclSystemError, "out of host memory");
	ncclResult_t r = ncclSuccess;
	for (size_t at = 0; at < n && r == ncclSuccess; at += CHUNK_BYTES) {
		size_t m = n - at < CHUNK_BYTES ? n - at : CHUNK_BYTES;
		int e = copy_in(buf, send_p + at, m);
		if (e != 0)
			r = comm_fail(c, ncclUnhandledCudaError, COPY_IN_FAILED, c->tag, cu_name(e), e);
		else if ((e = copy_out(recv_p + at, buf, m)) != 0)
			r = comm_fail(c, ncclUnhandledCudaError, COPY_OUT_FAILED, c->tag, cu_name(e), e);
	}
	free(buf);
	return r;
}

static ncclResult_t capture_check(ncclComm_t c, cudaStream_t s) {
	if (!drv.present) return ncclSuccess;
	int status = 0;
	int r = drv.capture_info(s, &status, NULL, NULL, NULL, NULL);
	if (r != 0) return comm_fail(c, ncclUnhandledCudaError, "%s: cuStreamGetCaptureInfo: %s (%d)", c->tag, cu_name(r), r);
	if (status != 0) {
		fprintf(stderr, "cnnc fake libnccl: collectives inside a CUDA graph capture are not emulated\n");
		return comm_fail(c, ncclInvalidUsage, "%s: collectives inside a CUDA graph capture are not emulated", c->tag);
	}
	return ncclSuccess;
}

// run_collective runs an all-reduce (kind MSG_ALLREDUCE, op the operation) or a broadcast
// (MSG_BROADCAST, op the root) on the calling rank.
static ncclResult_t run_collective(uint32_t kind, const void* send_p, void* recv_p, size_t count, ncclDataType_t t,
                                   int op, ncclComm_t c, cudaStream_t s) {
	pthread_mutex_lock(&c->mu);
	c->busy++;
	pthread_mutex_unlock(&c->mu);
	snprintf(c->tag, sizeof c->tag, "%s #%llu", kind == MSG_BROADCAST ? "Broadcast" : "AllReduce",
	         (unsigned long long)c->seq);
	ncclResult_t r = ncclSuccess, before = __atomic_load_n(&c->err, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST))
		r = comm_fail(c, ncclInvalidUsage, "%s on a communicator aborted before (ncclCommAbort)", c->tag);
	else if (before != ncclSuccess)
		r = comm_fail(c, before, "%s on a communicator that failed before", c->tag);
	else if ((r = capture_check(c, s)) != ncclSuccess || count == 0)
		;
	else if (c->nranks == 1)
		r = send_p == recv_p ? ncclSuccess : local_copy(c, send_p, recv_p, count * type_size(t));
	else if (c->rank == 0 && kind == MSG_BROADCAST)
		r = root_broadcast(c, send_p, recv_p, count, t, op);
	else if (c->rank == 0)
		r = root_allreduce(c, send_p, recv_p, count, t, (ncclRedOp_t)op);
	else
		r = peer_collective(c, kind, send_p, recv_p, count, t, op);
	c->seq++; // every rank numbers its collectives alike, whatever became of them
	pthread_mutex_lock(&c->mu);
	c->busy--;
	pthread_mutex_unlock(&c->mu);
	return r;
}

// The calling thread's group: collectives queued until ncclGroupEnd.
typedef struct {
	uint32_t kind;
	const void* send;
	void* recv;
	size_t count;
	ncclDataType_t type;
	int op; // a broadcast's root
	ncclComm_t comm;
	cudaStream_t stream;
} queued;

static __thread queued* group_ops;
static __thread size_t group_len, group_cap;

// enqueue runs a collective now, or queues it inside a group.
static ncclResult_t enqueue(uint32_t kind, const void* send_p, void* recv_p, size_t count, ncclDataType_t t, int op,
                            ncclComm_t c, cudaStream_t s) {
	if (group_depth == 0) return run_collective(kind, send_p, recv_p, count, t, op, c, s);
	if (group_len == group_cap) {
		size_t cap = group_cap ? 2 * group_cap : 16;
		queued* v = realloc(group_ops, cap * sizeof *v);
		if (!v) return fail(ncclSystemError, "out of host memory");
		group_ops = v, group_cap = cap;
	}
	group_ops[group_len++] = (queued){kind, send_p, recv_p, count, t, op, c, s};
	return ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void* send_p, void* recv_p, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t c, cudaStream_t s) {
	if (!c) return fail(ncclInvalidArgument, "ncclAllReduce: comm is NULL");
	if (op != ncclSum) return not_emulated("ncclAllReduce with an operation other than ncclSum");
	if (!type_size(t)) {
		char what[96];
		snprintf(what, sizeof what, "ncclAllReduce of %s", type_name(t));
		return not_emulated(what);
	}
	if (count > 0 && (!send_p || !recv_p))
		return fail(ncclInvalidArgument, "ncclAllReduce: NULL buffer for %zu elements", count);
	return enqueue(MSG_ALLREDUCE, send_p, recv_p, count, t, op, c, s);
}

// ncclBroadcast copies the root's count elements at send_p to recv_p on every rank (send_p is
// read on the root only; send_p == recv_p: in place).
API ncclResult_t ncclBroadcast(const void* send_p, void* recv_p, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                               cudaStream_t s) {
	if (!c) return fail(ncclInvalidArgument, "ncclBroadcast: comm is NULL");
	if (root < 0 || root >= c->nranks)
		return fail(ncclInvalidArgument, "ncclBroadcast: root %d of %d ranks", root, c->nranks);
	if (!type_size(t)) {
		char what[96];
		snprintf(what, sizeof what, "ncclBroadcast of %s", type_name(t));
		return not_emulated(what);
	}
	if (count > 0 && (!recv_p || (c->rank == root && !send_p)))
		return fail(ncclInvalidArgument, "ncclBroadcast: NULL buffer for %zu elements", count);
	return enqueue(MSG_BROADCAST, send_p, recv_p, count, t, root, c, s);
}

API ncclResult_t ncclGroupStart(void) {
	group_depth++;
	return ncclSuccess;
}

// ncclGroupEnd runs the group's collectives in the order they were called (those of a
// communicator that has failed fail at once) and returns the first failure.
API ncclResult_t ncclGroupEnd(void) {
	if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0) return ncclSuccess;
	ncclResult_t r = ncclSuccess;
	for (size_t i = 0; i < group_len; i++) {
		queued* q = &group_ops[i];
		ncclResult_t e = run_collective(q->kind, q->send, q->recv, q->count, q->type, q->op, q->comm, q->stream);
		if (r == ncclSuccess) r = e;
	}
	group_len = 0;
	return r;
}
