// cuda_emu.h — run CUDA C kernels on the CPU (part of cnnc, package runtime/emu).
//
// Usage:   g++ -x c++ -std=c++20 -O2 -fPIC -shared -include cuda_emu.h kernel.cu
//
// The same header may also be given to nvcc/NVRTC: there it only defines the cnnc macros
// (CNNC_DYNAMIC_SHARED), so generated kernels can include it unconditionally.
//
// Model
//   * A launch is a grid of blocks. Blocks are handed to worker OS threads one at a time
//     (cnnc_emu_launch_work); a block runs from start to end on one OS thread, so
//     `__shared__` = `static thread_local` gives every block its own shared memory even when
//     blocks run in parallel.
//   * Each CUDA thread of a block runs on a fiber (its own stack). __syncthreads(), __syncwarp(),
//     shuffles and votes switch back to the block's scheduler (a hand-written x86-64 context
//     switch: ~10 instructions, no system call). The scheduler runs warp by warp; warp-synchronous
//     operations complete when every non-exited lane named in the mask has arrived, a barrier
//     completes when every thread of the block has arrived.
//   * A fiber whose thread finishes without blocking immediately starts the next thread, so a
//     barrier-free kernel costs one function call per thread and no context switch.
//   * Misuse becomes an error of the launch, not a hang: threads that exit while others wait at
//     __syncthreads(), lanes that wait in different warp operations, __trap(), device assert().
//
// Kernels must be written for this header in two respects: dynamic shared memory is declared with
// CNNC_DYNAMIC_SHARED(type, name) (not `extern __shared__`), and `static __shared__` is not
// allowed (plain `__shared__` is already static). Warp-synchronous code must use the *_sync
// intrinsics or __syncwarp(); implicit lock-step (volatile shared memory) is not emulated.
#ifndef CNNC_CUDA_EMU_H
#define CNNC_CUDA_EMU_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// Real CUDA: nothing to emulate, only the cnnc macros.
#define CNNC_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#if !defined(__CUDACC_RTC__)  // what the emulator offers of them: bf16, cp.async, wmma
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>
#endif
#else  // CPU emulation

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "cuda_emu.h: compile kernels as C++20: g++ -x c++ -std=c++20 -include cuda_emu.h"
#endif

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(CNNC_EMU_TRACE)
#include <algorithm>
#include <dlfcn.h>
#include <unordered_map>
#include <vector>
// Trace builds (emu.TraceFlags) are compiled with -fsanitize=kernel-address and calls for every
// access: the hooks below record them instead of checking them. The runtime's own helpers that
// kernels call are kept out of it.
#define CNNC_EMU_NO_TRACE __attribute__((no_sanitize_address))
#define CNNC_EMU_TRACE_SITE __attribute__((noinline, no_sanitize_address))
#else
#define CNNC_EMU_NO_TRACE
#define CNNC_EMU_TRACE_SITE inline
#endif

#if defined(__SANITIZE_ADDRESS__) && !defined(CNNC_EMU_TRACE)  // (trace builds instrument, not check)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define CNNC_EMU_ASAN 1
#else
#define CNNC_EMU_ASAN 0
#endif

#if defined(__x86_64__) && !defined(CNNC_EMU_USE_UCONTEXT)
#define CNNC_EMU_ASM_SWITCH 1
#else
#define CNNC_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#define CNNC_EMU 1

// Stack of one emulated CUDA thread. Only touched pages cost memory; ASan frames are larger and
// its error reports run on the faulting fiber's stack.
#ifndef CNNC_EMU_STACK_SIZE
#if CNNC_EMU_ASAN
#define CNNC_EMU_STACK_SIZE (1u << 20)
#else
#define CNNC_EMU_STACK_SIZE (256u << 10)
#endif
#endif

// ---------------------------------------------------------------------------------------------
// CUDA keywords
// ---------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __shared__ static thread_local
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

// CNNC_DYNAMIC_SHARED(float, buf) declares `buf` as the block's dynamic shared memory (the
// sharedBytes of the launch). On real CUDA it is `extern __shared__ __align__(16) float buf[]`.
#define CNNC_DYNAMIC_SHARED(type, name) \
  type* const name = reinterpret_cast<type*>(::cnnc_emu::dynamic_shared())

// Everything below is private to the module that includes it (one copy per compiled kernel
// library); only the C API at the end is exported.
//
// Built into a program instead (runtime/emu's BuiltinSource: cgo compiles the kernels into the
// Go binary), several kernel files can share one executable. CNNC_EMU_BUILTIN is then the name
// of a namespace given to this version of the header (it holds everything below, so files
// compiled with the same header share one runtime and files of another version never mix
// with it), the C API is internal to each file (reached through the file's symbol table, not
// the linker), and kernels are weak: two files with the same kernels (two packages generated
// from one model) merge into one copy, which is correct because they share the runtime.
#pragma GCC visibility push(hidden)
#ifdef CNNC_EMU_BUILTIN
#undef __global__
#define __global__ __attribute__((weak))
namespace CNNC_EMU_BUILTIN {}
using namespace CNNC_EMU_BUILTIN;  // before its members, which name each other ::cnnc_emu::...
namespace CNNC_EMU_BUILTIN {
#endif

// ---------------------------------------------------------------------------------------------
// Vector types
// ---------------------------------------------------------------------------------------------
#define CNNC_EMU_VEC2(T, N, A)                                  \
  struct __attribute__((aligned(A))) N { T x, y; };             \
  inline constexpr N make_##N(T x, T y) { return N{x, y}; }
#define CNNC_EMU_VEC3(T, N)                                     \
  struct N { T x, y, z; };                                      \
  inline constexpr N make_##N(T x, T y, T z) { return N{x, y, z}; }
#define CNNC_EMU_VEC4(T, N, A)                                  \
  struct __attribute__((aligned(A))) N { T x, y, z, w; };       \
  inline constexpr N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }

CNNC_EMU_VEC2(signed char, char2, 2)
CNNC_EMU_VEC4(signed char, char4, 4)
CNNC_EMU_VEC2(unsigned char, uchar2, 2)
CNNC_EMU_VEC4(unsigned char, uchar4, 4)
CNNC_EMU_VEC2(short, short2, 4)
CNNC_EMU_VEC4(short, short4, 8)
CNNC_EMU_VEC2(unsigned short, ushort2, 4)
CNNC_EMU_VEC4(unsigned short, ushort4, 8)
CNNC_EMU_VEC2(int, int2, 8)
CNNC_EMU_VEC3(int, int3)
CNNC_EMU_VEC4(int, int4, 16)
CNNC_EMU_VEC2(unsigned int, uint2, 8)
CNNC_EMU_VEC3(unsigned int, uint3)
CNNC_EMU_VEC4(unsigned int, uint4, 16)
CNNC_EMU_VEC2(long long, longlong2, 16)
CNNC_EMU_VEC2(unsigned long long, ulonglong2, 16)
CNNC_EMU_VEC2(float, float2, 8)
CNNC_EMU_VEC3(float, float3)
CNNC_EMU_VEC4(float, float4, 16)
CNNC_EMU_VEC2(double, double2, 16)
CNNC_EMU_VEC3(double, double3)

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

inline constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Runtime state and scheduler
// ---------------------------------------------------------------------------------------------
#if CNNC_EMU_ASM_SWITCH
// cnnc_emu_swap_context saves the callee-saved registers, MXCSR and the x87 control word on the
// current stack, stores the stack pointer in *save_sp, and resumes the context saved at load_sp.
// cnnc_emu_fiber_trampoline is where a fresh fiber starts: it calls r13(r12) and never returns.
extern "C" void cnnc_emu_swap_context(void** save_sp, void* load_sp);
extern "C" void cnnc_emu_fiber_trampoline();
asm(R"(
	.text
	.p2align 4
	.weak cnnc_emu_swap_context
	.hidden cnnc_emu_swap_context
	.type cnnc_emu_swap_context, @function
cnnc_emu_swap_context:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	subq $8, %rsp
	stmxcsr (%rsp)
	fnstcw 4(%rsp)
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	ldmxcsr (%rsp)
	fldcw 4(%rsp)
	addq $8, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size cnnc_emu_swap_context, .-cnnc_emu_swap_context

	.p2align 4
	.weak cnnc_emu_fiber_trampoline
	.hidden cnnc_emu_fiber_trampoline
	.type cnnc_emu_fiber_trampoline, @function
cnnc_emu_fiber_trampoline:
	.cfi_startproc
	.cfi_undefined rip
	movq %r12, %rdi
	callq *%r13
	ud2
	.cfi_endproc
	.size cnnc_emu_fiber_trampoline, .-cnnc_emu_fiber_trampoline
)");
#endif

namespace cnnc_emu {

inline constexpr unsigned kWarpSize = 32;
inline constexpr unsigned kMaxThreads = 1024;
// Launch flags (cnnc_emu_launch_new). The race-mode orders run the threads of every barrier interval
// in another order than the default (warp by warp, lane by lane): a kernel whose result depends on
// the order has a race. They also give wmma fragments another element layout (see WmmaLayout).
inline constexpr uint32_t kFlagFillShared = 1;    // fill dynamic shared memory with 0xFF per block
inline constexpr uint32_t kFlagReverse = 2;       // race mode: warps and lanes in reverse order
inline constexpr uint32_t kFlagShuffle = 4;       // race mode: warps and lanes in a seeded random order
inline constexpr uint32_t kFlagPoisonShared = 8;  // 0xFF (NaN) into dynamic and static shared memory per block
inline constexpr uint32_t kOrderFlags = kFlagReverse | kFlagShuffle;
inline constexpr unsigned kSeedShift = 8;         // flags bits 8..31: the seed of kFlagShuffle

enum ThreadState : uint8_t { kNotStarted, kRunnable, kAtBarrier, kAtWarpOp, kExited };

enum WarpOp : uint8_t {
  kOpNone,
  kOpSyncWarp,
  kOpShflIdx,
  kOpShflUp,
  kOpShflDown,
  kOpShflXor,
  kOpBallot,
  kOpAny,
  kOpAll,
  kOpRedAdd,
  kOpRedMinU,
  kOpRedMaxU,
  kOpRedMinS,
  kOpRedMaxS,
  kOpRedAnd,
  kOpRedOr,
  kOpRedXor,
  kOpMma,  // wmma::mma_sync: value points at the lane's MmaArgs
};

inline const char* warp_op_name(uint8_t op) {
  switch (op) {
    case kOpSyncWarp: return "__syncwarp";
    case kOpShflIdx: return "__shfl_sync";
    case kOpShflUp: return "__shfl_up_sync";
    case kOpShflDown: return "__shfl_down_sync";
    case kOpShflXor: return "__shfl_xor_sync";
    case kOpBallot: return "__ballot_sync";
    case kOpAny: return "__any_sync";
    case kOpAll: return "__all_sync";
    case kOpRedAdd: return "__reduce_add_sync";
    case kOpRedMinU: case kOpRedMinS: return "__reduce_min_sync";
    case kOpRedMaxU: case kOpRedMaxS: return "__reduce_max_sync";
    case kOpRedAnd: return "__reduce_and_sync";
    case kOpRedOr: return "__reduce_or_sync";
    case kOpRedXor: return "__reduce_xor_sync";
    case kOpMma: return "wmma::mma_sync";
    default: return "?";
  }
}

struct Fiber;

// One cp.async copy in flight: done (read and written) when the thread waits for its group.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  uint32_t size, zfill;
  uint64_t group;
};

// One emulated CUDA thread of the block being run.
struct ThreadCtx {
  uint3 idx;        // threadIdx
  uint8_t state;    // ThreadState
  uint8_t op;       // WarpOp while state == kAtWarpOp
  Fiber* fiber;     // stack it runs on, from its start until it exits
  uint32_t mask;    // warp op: member mask
  int32_t arg;      // warp op: source lane, delta or lane mask
  int32_t width;    // warp op: shuffle width
  int32_t pred;     // barrier predicate (__syncthreads_count & co)
  uint64_t value;   // warp op input
  uint64_t result;  // warp op output
  // cp.async copies issued and not yet completed (see __pipeline_memcpy_async), in issue order
  struct AsyncCopy* copies;
  uint32_t ncopies, copies_cap;
  uint64_t committed;  // cp.async groups committed so far; a copy's group is the count at its issue
};

struct BlockCtx {
  uint3 blockIdx;
  dim3 blockDim;
  dim3 gridDim;
  unsigned char* dynamic_shared;
  int32_t barrier_count;  // number of true predicates at the last barrier
};

#if CNNC_EMU_ASM_SWITCH
struct Context {
  void* sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context ctx;
  char* stack_lo = nullptr;      // lowest usable byte (a guard page lies below)
  size_t stack_size = 0;
  void* fake_stack = nullptr;    // ASan bookkeeping across switches
  bool dirty = false;            // abandoned mid-kernel: its ASan shadow may hold stale poison
};

using EntryFn = void (*)(void** params);

struct Trace;
struct TraceWorker;

struct Launch {
  Trace* trace = nullptr;  // trace builds: the access trace this launch records into
  EntryFn entry = nullptr;
  void** params = nullptr;
  dim3 grid, block;
  uint64_t shared_bytes = 0;
  uint32_t flags = 0;
  uint64_t nblocks = 0;
  // race mode: the blocks run in the order block_at(i) = (order_a * i + order_c) mod nblocks (then
  // reversed for kFlagReverse), a bijection since gcd(order_a, nblocks) = 1 (block_order_init)
  uint64_t order_a = 1, order_c = 0;
  uint32_t nthreads = 0;
  std::atomic<uint64_t> next_block{0};
  std::atomic<int> failed{0};
  char error[768] = {};
  // wmma fragment layouts: element slot i*32 + lane of a fragment holds tile element
  // wmma_map[use][size][slot] (use: matrix_a, matrix_b, accumulator; size: 128 or 256 elements)
  uint16_t wmma_map[3][2][256] = {};
};

// A worker runs blocks on the OS thread that calls cnnc_emu_launch_work. It owns the fibers and
// the dynamic shared memory buffer and is reused across blocks and launches.
struct Worker {
  Launch* launch = nullptr;
  BlockCtx block{};
  dim3 idx_dims{0, 0, 0};  // block shape for which threads[].idx is filled in
  ThreadCtx threads[kMaxThreads] = {};
  Fiber* fibers[kMaxThreads] = {};  // every fiber of the current cnnc_emu_launch_work call
  uint32_t nfibers = 0;
  Fiber* idle[kMaxThreads] = {};    // fibers with no thread on them
  uint32_t nidle = 0;
  Context sched;                    // the scheduler's own (OS thread) stack
  Fiber* running = nullptr;
  ThreadCtx* starting = nullptr;    // thread a fresh fiber must start with
  uint32_t sweep = 0, sweep_end = 0;  // scheduler position in order[] while running a warp
  uint32_t sweep_lo = 0;              // the warp's first thread
  uint8_t order[kWarpSize] = {};      // the warp's lanes in the order of the current sweep
  bool order_identity = false;        // order[] is 0..31
  uint32_t interval = 0;              // barrier intervals completed by the current block
  unsigned char* tls_lo = nullptr;    // the OS thread's copy of the module's thread-local storage
  size_t tls_size = 0;                // (static __shared__ arrays live there), found on first use
  bool tls_known = false;
  unsigned char* dyn = nullptr;
  size_t dyn_size = 0;
  bool dyn_ready = false;
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
  void* sched_fake_stack = nullptr;
  bool block_failed = false;
  char fail[640] = {};
  TraceWorker* trace = nullptr;  // trace builds: this worker's records while a traced launch runs
  double block_weight = 0;       // how many blocks of the grid the block being traced stands for
  bool in_trace = false;         // recording an access
  ~Worker() {
    for (ThreadCtx& t : threads) free(t.copies);
  }
};

inline thread_local ThreadCtx* t_thread = nullptr;
inline thread_local BlockCtx* t_block = nullptr;
inline thread_local Worker* t_worker = nullptr;

inline unsigned char* dynamic_shared() { return t_block ? t_block->dynamic_shared : nullptr; }

#if defined(CNNC_EMU_TRACE)
// ---------------------------------------------------------------------------------------------
// Access traces (trace builds): every load and store a kernel makes to shared or global memory
// is recorded with its lane and its site (the instruction's address); when a warp reaches a
// barrier or exits, the records are grouped into warp accesses — the n-th execution of a site by
// each lane — and each is costed as the GPU's memory pipeline would: shared memory in wavefronts
// (32 banks of 4 bytes; 8- and 16-byte accesses in phases of 16 and 8 lanes; lanes reading one
// word share it), global memory in 32-byte sectors. Only a sample of the grid's blocks runs, each
// weighted by the blocks it stands for (chosen by the caller).
// ---------------------------------------------------------------------------------------------
enum TraceFlag : uint8_t {
  kTraceStore = 1,
  kTraceShared = 2,    // else global
  kTraceMatrix = 4,    // a wmma load/store of a whole tile (one per warp call)
  kTraceColMajor = 8,  // matrix: stored column by column
  kTraceAsync = 16,    // cp.async (its global read and its shared write)
};

struct TraceRecord {
  uint64_t site;  // instruction address - the module's base
  uint64_t addr;
  uint32_t size;  // bytes (matrix: bytes per element)
  uint32_t seq;   // order of recording
  uint32_t instance;
  uint32_t ldm;   // matrix: leading dimension in elements
  uint16_t lane, rows, cols;
  uint8_t flags;
};

// Totals of one access site, over the sampled blocks, weighted.
struct TraceSite {
  uint64_t site;
  uint32_t width;  // bytes per lane (matrix: per element)
  uint8_t flags;
  uint8_t pad[3];
  double accesses;      // warp-level accesses (instructions; a matrix call counts once)
  double lanes;         // lanes taking part, summed
  double transactions;  // shared: wavefronts; global: 32-byte sectors
  double bytes;         // bytes requested
};

struct TraceWorker {
  std::vector<TraceRecord> recs;
  std::unordered_map<uint64_t, TraceSite> sites;
  uint32_t seq = 0;
};

struct Trace {
  std::vector<uint64_t> span_lo, span_hi;  // global memory: the device allocations, sorted
  std::vector<uint64_t> blocks;            // linear indices of the blocks to run
  std::vector<double> weights;
  uintptr_t base = 0;
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  std::unordered_map<uint64_t, TraceSite> sites;
  std::atomic<int> overflow{0};
};

inline constexpr size_t kTraceMaxRecords = size_t(1) << 24;  // per warp between barriers

inline void locate_tls(Worker* w);

// Turns the launch's b-th block into the b-th sampled block; false when none is left.
CNNC_EMU_NO_TRACE inline bool trace_block(Launch* L, Worker* w, uint64_t& b) {
  Trace* T = L->trace;
  if (b >= T->blocks.size()) return false;
  w->block_weight = T->weights[b];
  b = T->blocks[b];
  if (!w->trace) w->trace = new TraceWorker();
  locate_tls(w);
  return true;
}

CNNC_EMU_NO_TRACE inline bool in_global(const Trace* T, uint64_t a) {
  auto it = std::upper_bound(T->span_lo.begin(), T->span_lo.end(), a);
  if (it == T->span_lo.begin()) return false;
  const size_t i = size_t(it - T->span_lo.begin()) - 1;
  return a < T->span_hi[i];
}

CNNC_EMU_NO_TRACE inline void trace_keep(Worker* w, const void* p, uint32_t size, uint8_t flags, const void* pc, uint32_t ldm,
                                         uint16_t rows, uint16_t cols);

// Records one access of the running thread (dropped unless it is to shared or global memory).
// The recorder's own accesses (in library code that is instrumented too) are not recorded.
CNNC_EMU_NO_TRACE inline void trace_record(const void* p, uint32_t size, uint8_t flags, const void* pc, uint32_t ldm = 0,
                                           uint16_t rows = 0, uint16_t cols = 0) {
  Worker* w = t_worker;
  if (!w || !w->running || !w->trace || w->in_trace) return;
  w->in_trace = true;
  trace_keep(w, p, size, flags, pc, ldm, rows, cols);
  w->in_trace = false;
}

CNNC_EMU_NO_TRACE inline void trace_keep(Worker* w, const void* p, uint32_t size, uint8_t flags, const void* pc, uint32_t ldm,
                                         uint16_t rows, uint16_t cols) {
  ThreadCtx* t = t_thread;
  const Launch* L = w->launch;
  const auto* c = static_cast<const unsigned char*>(p);
  if (w->dyn && c >= w->dyn && c < w->dyn + L->shared_bytes) {
    flags |= kTraceShared;
  } else if (w->tls_known && w->tls_lo && c >= w->tls_lo && c < w->tls_lo + w->tls_size) {
    const void* v = p;  // the runtime's own thread-locals are not shared memory
    if (v == &t_thread || v == &t_block || v == &t_worker) return;
    flags |= kTraceShared;
  } else if (!in_global(L->trace, uint64_t(uintptr_t(p)))) {
    return;
  }
  TraceWorker* tw = w->trace;
  if (tw->recs.size() >= kTraceMaxRecords) {
    L->trace->overflow.store(1);
    return;
  }
  TraceRecord r{};
  r.site = uint64_t(uintptr_t(pc) - L->trace->base);
  r.addr = uint64_t(uintptr_t(p));
  r.size = size;
  r.seq = tw->seq++;
  r.ldm = ldm;
  r.lane = uint16_t(uint32_t(t - w->threads) % kWarpSize);
  r.rows = rows;
  r.cols = cols;
  r.flags = flags;
  tw->recs.push_back(r);
}

// Shared-memory wavefronts of one warp access: per phase, the most distinct 4-byte words that
// fall into one bank.
CNNC_EMU_NO_TRACE inline double shared_wavefronts(const uint64_t* addr, const uint32_t* lane, uint32_t n, uint32_t size) {
  const uint32_t per_phase = size <= 4 ? 32u : size == 8 ? 16u : 8u;
  double total = 0;
  for (uint32_t phase = 0; phase < 32 / per_phase; ++phase) {
    uint64_t words[128];
    uint32_t nw = 0;
    for (uint32_t i = 0; i < n; ++i) {
      if (lane[i] / per_phase != phase) continue;
      for (uint64_t wd = addr[i] >> 2; wd <= (addr[i] + size - 1) >> 2 && nw < 128; ++wd) words[nw++] = wd;
    }
    if (!nw) continue;
    std::sort(words, words + nw);
    nw = uint32_t(std::unique(words, words + nw) - words);
    uint32_t per_bank[32] = {};
    uint32_t most = 0;
    for (uint32_t i = 0; i < nw; ++i) most = std::max(most, ++per_bank[words[i] & 31]);
    total += most;
  }
  return total;
}

// Distinct 32-byte sectors of byte ranges [addr, addr + size).
CNNC_EMU_NO_TRACE inline double global_sectors(const uint64_t* addr, const uint32_t* size, uint32_t n) {
  std::vector<uint64_t> sectors;
  for (uint32_t i = 0; i < n; ++i)
    for (uint64_t sct = addr[i] >> 5; sct <= (addr[i] + size[i] - 1) >> 5; ++sct) sectors.push_back(sct);
  std::sort(sectors.begin(), sectors.end());
  return double(std::unique(sectors.begin(), sectors.end()) - sectors.begin());
}

// A wmma tile's cost: its rows (columns when column-major) cut into 16-byte chunks taken 8 per
// phase, as the GPU's 128-bit shared loads and ldmatrix do (which lane holds which element is
// unspecified, so the chunks stand in for lanes), or its distinct sectors in global memory.
CNNC_EMU_NO_TRACE inline double matrix_cost(const TraceRecord& r, double* bytes) {
  const uint32_t lines = (r.flags & kTraceColMajor) ? r.cols : r.rows;
  const uint32_t line_bytes = ((r.flags & kTraceColMajor) ? r.rows : r.cols) * r.size;
  std::vector<uint64_t> a;
  std::vector<uint32_t> sz, ln;
  for (uint32_t i = 0; i < lines; ++i)
    for (uint32_t off = 0; off < line_bytes; off += 16) {
      a.push_back(r.addr + uint64_t(i) * r.ldm * r.size + off);
      sz.push_back(std::min(16u, line_bytes - off));
    }
  *bytes = double(lines) * line_bytes;
  if (!(r.flags & kTraceShared)) return global_sectors(a.data(), sz.data(), uint32_t(a.size()));
  double total = 0;
  for (size_t first = 0; first < a.size(); first += 8) {
    const uint32_t n = uint32_t(std::min<size_t>(8, a.size() - first));
    uint32_t lanes[8];
    for (uint32_t i = 0; i < n; ++i) lanes[i] = i;
    total += shared_wavefronts(&a[first], lanes, n, 16);
  }
  return total;
}

CNNC_EMU_NO_TRACE inline void trace_add(TraceWorker* tw, const TraceRecord& r, uint32_t width, double weight, double lanes,
                                        double transactions, double bytes) {
  const uint8_t flags = r.flags;
  const uint64_t key = r.site ^ (uint64_t(flags) << 48) ^ (uint64_t(width) << 56);
  TraceSite& s = tw->sites[key];
  s.site = r.site;
  s.flags = flags;
  s.width = width;
  s.accesses += weight;
  s.lanes += weight * lanes;
  s.transactions += weight * transactions;
  s.bytes += weight * bytes;
}

// Turns the records of the warp that just reached a barrier (or exited) into warp accesses.
CNNC_EMU_NO_TRACE inline void trace_warp(Worker* w) {
  TraceWorker* tw = w->trace;
  auto& rs = tw->recs;
  if (rs.empty()) return;
  // the n-th execution of a site by a lane is its instance n
  std::sort(rs.begin(), rs.end(), [](const TraceRecord& a, const TraceRecord& b) {
    if (a.site != b.site) return a.site < b.site;
    if (a.flags != b.flags) return a.flags < b.flags;
    if (a.lane != b.lane) return a.lane < b.lane;
    return a.seq < b.seq;
  });
  for (size_t i = 0; i < rs.size(); ++i) {
    const bool same = i > 0 && rs[i].site == rs[i - 1].site && rs[i].flags == rs[i - 1].flags && rs[i].lane == rs[i - 1].lane;
    rs[i].instance = same ? rs[i - 1].instance + 1 : 0;
  }
  std::sort(rs.begin(), rs.end(), [](const TraceRecord& a, const TraceRecord& b) {
    if (a.site != b.site) return a.site < b.site;
    if (a.flags != b.flags) return a.flags < b.flags;
    if (a.instance != b.instance) return a.instance < b.instance;
    return a.lane < b.lane;
  });
  const double weight = w->block_weight;
  uint64_t addr[kWarpSize * 4];
  uint32_t size[kWarpSize * 4], lane[kWarpSize * 4];
  for (size_t i = 0; i < rs.size();) {
    size_t j = i;
    while (j < rs.size() && rs[j].site == rs[i].site && rs[j].flags == rs[i].flags && rs[j].instance == rs[i].instance) ++j;
    const TraceRecord& r = rs[i];
    if (r.flags & kTraceMatrix) {
      double bytes = 0;
      const double cost = matrix_cost(r, &bytes);
      trace_add(tw, r, r.size, weight, double(j - i), cost, bytes);
    } else {
      const uint32_t n = uint32_t(std::min<size_t>(j - i, kWarpSize * 4));
      uint32_t width = 0;
      double bytes = 0;
      for (uint32_t k = 0; k < n; ++k) {
        addr[k] = rs[i + k].addr;
        size[k] = rs[i + k].size;
        lane[k] = rs[i + k].lane;
        width = std::max(width, size[k]);
        bytes += size[k];
      }
      const double cost = (r.flags & kTraceShared) ? shared_wavefronts(addr, lane, n, width) : global_sectors(addr, size, n);
      trace_add(tw, r, width, weight, double(n), cost, bytes);
    }
    i = j;
  }
  rs.clear();
}

CNNC_EMU_NO_TRACE inline void trace_merge(Launch* L, Worker* w) {
  if (!w->trace) return;
  Trace* T = L->trace;
  pthread_mutex_lock(&T->mu);
  for (auto& [key, s] : w->trace->sites) {
    TraceSite& d = T->sites[key];
    const double acc = d.accesses + s.accesses, ln = d.lanes + s.lanes, tr = d.transactions + s.transactions,
                 by = d.bytes + s.bytes;
    d = s;
    d.accesses = acc, d.lanes = ln, d.transactions = tr, d.bytes = by;
  }
  pthread_mutex_unlock(&T->mu);
  delete w->trace;
  w->trace = nullptr;
}
#endif  // CNNC_EMU_TRACE

__attribute__((format(printf, 2, 3))) inline void fail(Worker* w, const char* fmt, ...) {
  if (w->block_failed) return;  // keep the first reason
  w->block_failed = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->fail, sizeof w->fail, fmt, ap);
  va_end(ap);
}

// --- AddressSanitizer fiber annotations (no-ops otherwise) ---
inline void asan_start_switch(void** fake_stack_save, const void* bottom, size_t size) {
#if CNNC_EMU_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}
inline void asan_finish_switch(void* fake_stack_save, const void** bottom_old, size_t* size_old) {
#if CNNC_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
#else
  (void)fake_stack_save, (void)bottom_old, (void)size_old;
#endif
}

// --- context switching ---
[[noreturn]] inline void fiber_main(void* arg);

#if CNNC_EMU_ASM_SWITCH
inline void context_switch(Context* from, Context* to) { cnnc_emu_swap_context(&from->sp, to->sp); }

inline void context_make(Context* c, char* lo, size_t size, void (*fn)(void*), void* arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(lo) + size) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 128);  // 16-aligned, as the swap expects
  uint32_t mxcsr;
  uint16_t fpcw;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
  sp[0] = uint64_t(mxcsr) | (uint64_t(fpcw) << 32);
  sp[1] = 0;                                            // r15
  sp[2] = 0;                                            // r14
  sp[3] = reinterpret_cast<uint64_t>(fn);               // r13: function
  sp[4] = reinterpret_cast<uint64_t>(arg);              // r12: its argument
  sp[5] = 0;                                            // rbx
  sp[6] = 0;                                            // rbp = 0 ends frame-pointer walks
  sp[7] = reinterpret_cast<uint64_t>(&cnnc_emu_fiber_trampoline);  // return address
  c->sp = sp;
}
#else
inline void ucontext_entry() { fiber_main(t_worker); }
inline void context_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
inline void context_make(Context* c, char* lo, size_t size, void (*)(void*), void*) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = lo;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, ucontext_entry, 0);
}
#endif

// Fiber stacks. Each has a guard page below it, so an overflow faults instead of corrupting a
// neighbour. A guard page costs the process two kernel memory areas (vm.max_map_count is about
// 65000), so stacks are not owned by modules: a worker borrows them for one
// cnnc_emu_launch_work call from a provider that pools them across all modules of the process
// (the Go package installs one; standalone programs use the per-library default below).
using StackAcquireFn = void* (*)(size_t* size);
using StackReleaseFn = void (*)(void* lo, size_t size);

inline size_t page_size() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

inline pthread_mutex_t g_stack_mu = PTHREAD_MUTEX_INITIALIZER;
inline void** g_stack_free = nullptr;
inline size_t g_stack_nfree = 0, g_stack_cap = 0;

inline void* default_stack_acquire(size_t* size) {
  const size_t page = page_size();
  *size = (size_t(CNNC_EMU_STACK_SIZE) + page - 1) / page * page;
  pthread_mutex_lock(&g_stack_mu);
  void* lo = g_stack_nfree ? g_stack_free[--g_stack_nfree] : nullptr;
  pthread_mutex_unlock(&g_stack_mu);
  if (lo) return lo;
  void* base = mmap(nullptr, *size + page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  mprotect(base, page, PROT_NONE);
  return static_cast<char*>(base) + page;
}

inline void default_stack_release(void* lo, size_t size) {
  pthread_mutex_lock(&g_stack_mu);
  if (g_stack_nfree == g_stack_cap) {
    size_t cap = g_stack_cap ? 2 * g_stack_cap : 64;
    void** grown = static_cast<void**>(realloc(g_stack_free, cap * sizeof(void*)));
    if (!grown) {
      pthread_mutex_unlock(&g_stack_mu);
      munmap(static_cast<char*>(lo) - page_size(), size + page_size());
      return;
    }
    g_stack_free = grown;
    g_stack_cap = cap;
  }
  g_stack_free[g_stack_nfree++] = lo;
  pthread_mutex_unlock(&g_stack_mu);
}

inline StackAcquireFn g_stack_acquire = default_stack_acquire;
inline StackReleaseFn g_stack_release = default_stack_release;

inline Fiber* fiber_new() {
  Fiber* f = new (std::nothrow) Fiber();
  if (!f) return nullptr;
  f->stack_lo = static_cast<char*>(g_stack_acquire(&f->stack_size));
  if (!f->stack_lo) {
    delete f;
    return nullptr;
  }
  return f;
}

inline void fiber_free(Fiber* f) {
#if CNNC_EMU_ASAN
  // The stack may next serve another module: clear the poison of frames that never returned
  // (fiber_main's own, or a whole abandoned thread's).
  size_t keep = f->dirty || f->stack_size < (64u << 10) ? 0 : f->stack_size - (64u << 10);
  __asan_unpoison_memory_region(f->stack_lo + keep, f->stack_size - keep);
#endif
  g_stack_release(f->stack_lo, f->stack_size);
  delete f;
}

// Scheduler → fiber; returns when the fiber yields or finishes.
inline void switch_to_fiber(Worker* w, Fiber* f) {
  w->running = f;
  asan_start_switch(&w->sched_fake_stack, f->stack_lo, f->stack_size);
  context_switch(&w->sched, &f->ctx);
  asan_finish_switch(w->sched_fake_stack, nullptr, nullptr);
  w->running = nullptr;
}

// Fiber → scheduler; returns when the scheduler resumes this fiber.
__attribute__((noinline)) inline void yield_to_scheduler(Worker* w) {
  Fiber* f = w->running;
  asan_start_switch(&f->fake_stack, w->sched_stack_bottom, w->sched_stack_size);
  context_switch(&f->ctx, &w->sched);
  asan_finish_switch(f->fake_stack, &w->sched_stack_bottom, &w->sched_stack_size);
}

// Fiber → scheduler for good; the fiber is restarted from scratch when next used.
[[noreturn]] inline void leave_fiber(Worker* w) {
  Fiber* f = w->running;
  asan_start_switch(nullptr, w->sched_stack_bottom, w->sched_stack_size);
  context_switch(&f->ctx, &w->sched);
  __builtin_unreachable();
}

#define CNNC_EMU_BLOCK_FMT "block (%u,%u,%u)"
#define CNNC_EMU_BLOCK_ARGS(w) (w)->block.blockIdx.x, (w)->block.blockIdx.y, (w)->block.blockIdx.z

// Body of every fiber: run the thread it was started for, then — while the scheduler's sweep
// finds fresh threads next — keep running threads without switching. Blocked threads keep
// their fiber; the scheduler resumes them inside the kernel.
[[noreturn]] inline void fiber_main(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  asan_finish_switch(nullptr, &w->sched_stack_bottom, &w->sched_stack_size);
  Fiber* f = w->running;
  Launch* L = w->launch;
  ThreadCtx* t = w->starting;
  for (;;) {
    t->state = kRunnable;
    t->fiber = f;
    t_thread = t;
    L->entry(L->params);
    t->state = kExited;
    t->fiber = nullptr;
    if (t->ncopies) {
      fail(w, CNNC_EMU_BLOCK_FMT " thread (%u,%u,%u) exited with %u cp.async copies not waited for "
              "(__pipeline_wait_prior)", CNNC_EMU_BLOCK_ARGS(w), t->idx.x, t->idx.y, t->idx.z, t->ncopies);
      break;
    }
    uint32_t next = w->sweep + 1;
    if (next >= w->sweep_end) break;
    ThreadCtx* nt = &w->threads[w->sweep_lo + w->order[next]];
    if (nt->state != kNotStarted) break;
    w->sweep = next;
    t = nt;
  }
  w->idle[w->nidle++] = f;
  leave_fiber(w);
}

inline Fiber* acquire_fiber(Worker* w) {
  Fiber* f;
  if (w->nidle > 0) {
    f = w->idle[--w->nidle];
  } else {
    if (w->nfibers >= kMaxThreads || !(f = fiber_new())) return nullptr;
    w->fibers[w->nfibers++] = f;
  }
#if CNNC_EMU_ASAN
  if (f->dirty) __asan_unpoison_memory_region(f->stack_lo, f->stack_size);
#endif
  f->dirty = false;
  context_make(&f->ctx, f->stack_lo, f->stack_size, fiber_main, w);
  return f;
}

inline void resume(Worker* w, ThreadCtx* t) {
  if (t->state == kNotStarted) {
    Fiber* f = acquire_fiber(w);
    if (!f) {
      fail(w, "cannot allocate a fiber stack");
      return;
    }
    w->starting = t;
    switch_to_fiber(w, f);
  } else {
    t->state = kRunnable;
    t_thread = t;
    switch_to_fiber(w, t->fiber);
  }
}

// Threads that are still inside the kernel when a block fails are never resumed: their fibers
// go back to the idle list and are restarted from scratch.
inline void abandon_block(Worker* w, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    ThreadCtx* t = &w->threads[i];
    if (t->fiber) {
      t->fiber->dirty = true;
      w->idle[w->nidle++] = t->fiber;
      t->fiber = nullptr;
    }
    t->ncopies = 0;
  }
  t_thread = nullptr;
}

inline void mma_resolve(Worker* w, uint32_t lo);  // wmma::mma_sync of a whole warp (defined with wmma)

// Completes the warp-synchronous operations of one warp whose member lanes have all arrived.
// Semantics follow PTX shfl.sync / vote.sync / redux.sync; exited lanes are not waited for.
inline bool resolve_warp(Worker* w, uint32_t lo, uint32_t hi, uint32_t waiting, uint32_t exited) {
  const uint32_t existing = (hi - lo == 32) ? 0xFFFFFFFFu : ((1u << (hi - lo)) - 1u);
  const uint32_t warp = lo / kWarpSize;
  uint32_t pending = waiting;
  bool progressed = false;
  while (pending) {
    const uint32_t lane0 = uint32_t(std::countr_zero(pending));
    const ThreadCtx* t0 = &w->threads[lo + lane0];
    const uint32_t mask = t0->mask;
    if (!((mask >> lane0) & 1u)) {
      fail(w, CNNC_EMU_BLOCK_FMT " warp %u lane %u: %s with mask 0x%08x that does not include the calling lane",
           CNNC_EMU_BLOCK_ARGS(w), warp, lane0, warp_op_name(t0->op), mask);
      return false;
    }
    const uint32_t group = mask & existing & ~exited;
    if (group & ~waiting) {  // some member is elsewhere (barrier or another warp op)
      pending &= ~group;
      continue;
    }
    for (uint32_t g = group; g; g &= g - 1) {
      const ThreadCtx* t = &w->threads[lo + uint32_t(std::countr_zero(g))];
      if (t->mask != mask || t->op != t0->op) {
        fail(w, CNNC_EMU_BLOCK_FMT " warp %u: lanes %u and %u disagree: %s(mask 0x%08x) vs %s(mask 0x%08x)",
             CNNC_EMU_BLOCK_ARGS(w), warp, lane0, unsigned(std::countr_zero(g)), warp_op_name(t0->op),
             mask, warp_op_name(t->op), t->mask);
        return false;
      }
    }
    const uint8_t op = t0->op;
    if (op == kOpMma) {
      if (group != 0xFFFFFFFFu) {
        fail(w, CNNC_EMU_BLOCK_FMT " warp %u: wmma::mma_sync needs all 32 lanes of the warp, but only lanes 0x%08x "
                "are in the block and have not exited", CNNC_EMU_BLOCK_ARGS(w), warp, group);
        return false;
      }
      mma_resolve(w, lo);
      if (w->block_failed) return false;
      for (uint32_t g = group; g; g &= g - 1) w->threads[lo + uint32_t(std::countr_zero(g))].state = kRunnable;
      pending &= ~group;
      progressed = true;
      continue;
    }
    uint64_t common = 0;
    if (op >= kOpBallot) {
      uint32_t ballot = 0;
      uint32_t acc_u = (op == kOpRedMinU || op == kOpRedAnd) ? 0xFFFFFFFFu : 0;
      int32_t acc_s = (op == kOpRedMinS) ? INT32_MAX : INT32_MIN;
      for (uint32_t g = group; g; g &= g - 1) {
        const uint32_t lane = uint32_t(std::countr_zero(g));
        const uint64_t v = w->threads[lo + lane].value;
        const uint32_t u = uint32_t(v);
        const int32_t s = int32_t(u);
        if (v) ballot |= 1u << lane;
        switch (op) {
          case kOpRedAdd: acc_u += u; break;
          case kOpRedMinU: acc_u = u < acc_u ? u : acc_u; break;
          case kOpRedMaxU: acc_u = u > acc_u ? u : acc_u; break;
          case kOpRedMinS: acc_s = s < acc_s ? s : acc_s; break;
          case kOpRedMaxS: acc_s = s > acc_s ? s : acc_s; break;
          case kOpRedAnd: acc_u &= u; break;
          case kOpRedOr: acc_u |= u; break;
          case kOpRedXor: acc_u ^= u; break;
          default: break;
        }
      }
      switch (op) {
        case kOpBallot: common = ballot; break;
        case kOpAny: common = ballot != 0; break;
        case kOpAll: common = ballot == group; break;
        case kOpRedMinS: case kOpRedMaxS: common = uint32_t(acc_s); break;
        default: common = acc_u; break;
      }
    }
    for (uint32_t g = group; g; g &= g - 1) {
      const int lane = std::countr_zero(g);
      ThreadCtx* t = &w->threads[lo + uint32_t(lane)];
      uint64_t r = common;
      if (op >= kOpShflIdx && op <= kOpShflXor) {
        if (t->width < 1 || t->width > 32) {
          fail(w, CNNC_EMU_BLOCK_FMT " warp %u lane %d: %s with width %d", CNNC_EMU_BLOCK_ARGS(w), warp,
               lane, warp_op_name(op), t->width);
          return false;
        }
        const int segmask = (32 - t->width) & 31;
        const int b = t->arg & 31;
        const int min_lane = lane & segmask;
        const int max_lane = (op == kOpShflUp) ? min_lane : (min_lane | (31 & ~segmask));
        int j = lane;
        bool ok = true;
        switch (op) {
          case kOpShflUp: j = lane - b; ok = j >= max_lane; break;
          case kOpShflDown: j = lane + b; ok = j <= max_lane; break;
          case kOpShflXor: j = lane ^ b; ok = j <= max_lane; break;
          default: j = min_lane | (b & ~segmask); ok = j <= max_lane; break;
        }
        if (!ok || !((group >> j) & 1u)) j = lane;  // out of segment or not participating
        r = w->threads[lo + uint32_t(j)].value;
      }
      t->result = r;
      t->state = kRunnable;
    }
    pending &= ~group;
    progressed = true;
  }
  if (!progressed) {
    const uint32_t lane0 = uint32_t(std::countr_zero(waiting));
    const ThreadCtx* t0 = &w->threads[lo + lane0];
    fail(w, CNNC_EMU_BLOCK_FMT " warp %u: deadlock: lanes 0x%08x wait in %s(mask 0x%08x) but lanes 0x%08x "
            "are at __syncthreads() or in another warp operation",
         CNNC_EMU_BLOCK_ARGS(w), warp, waiting, warp_op_name(t0->op), t0->mask,
         (t0->mask & existing & ~exited & ~waiting));
    return false;
  }
  return true;
}

// --- race-mode orders ---
inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// order[0..n) = 0..n-1 in the launch's order for the key (a seeded Fisher-Yates shuffle for
// kFlagShuffle, so a run is reproducible from the seed).
inline void fill_order(const Launch* L, uint8_t* order, uint32_t n, uint64_t key) {
  const bool reverse = L->flags & kFlagReverse;
  for (uint32_t i = 0; i < n; ++i) order[i] = uint8_t(reverse ? n - 1 - i : i);
  if (!(L->flags & kFlagShuffle)) return;
  uint64_t r = mix64(key ^ mix64(L->flags >> kSeedShift));
  for (uint32_t i = n - 1; i > 0; --i) {
    r = mix64(r);
    const uint32_t j = uint32_t(r % (i + 1));
    const uint8_t tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
}

// The race-mode orders also take the blocks of the grid in another order than 0, 1, 2, ... (the
// default): reversed for kFlagReverse; for kFlagShuffle an affine permutation i -> (a·i + c) mod n
// with a seeded stride a coprime to n and a seeded offset c. A kernel whose blocks communicate
// through global memory (a "last block reduces" counter: which block arrives last depends on the
// order) must give the same bits in every order; with one worker the order is exactly this one.
inline uint64_t gcd64(uint64_t a, uint64_t b) {
  while (b) {
    const uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

inline void block_order_init(Launch* L) {
  L->order_a = 1, L->order_c = 0;
  const uint64_t n = L->nblocks;
  if (!(L->flags & kFlagShuffle) || n < 2) return;
  const uint64_t r = mix64(mix64(L->flags >> kSeedShift) ^ 0xB10C);
  uint64_t a = 1 + r % n;  // 1..n
  while (gcd64(a, n) != 1) a = a % n + 1;
  L->order_a = a;
  L->order_c = mix64(r) % n;
}

// block_at is the block that the i-th block taken from the grid runs as.
inline uint64_t block_at(const Launch* L, uint64_t i) {
  if (!(L->flags & kOrderFlags) || L->trace) return i;  // a traced launch samples in the default order
  const uint64_t n = L->nblocks;
  if (L->flags & kFlagReverse) i = n - 1 - i;
  // a·i can pass 64 bits (a grid holds up to 2^63 blocks): a 128-bit product
  return uint64_t((unsigned __int128)L->order_a * i % n + L->order_c) % n;
}

inline uint64_t block_linear(const Worker* w) {
  const BlockCtx& B = w->block;
  return (uint64_t(B.blockIdx.z) * B.gridDim.y + B.blockIdx.y) * B.gridDim.x + B.blockIdx.x;
}

// Runs the lanes of one warp until each has exited or waits at __syncthreads().
inline bool run_warp(Worker* w, uint32_t warp, uint32_t n) {
  const uint32_t lo = warp * kWarpSize;
  const uint32_t hi = lo + kWarpSize < n ? lo + kWarpSize : n;
  const bool ordered = w->launch->flags & kOrderFlags;
  for (uint32_t sweep = 0;; ++sweep) {
    if (ordered) {
      fill_order(w->launch, w->order, hi - lo,
                 mix64(block_linear(w)) ^ (uint64_t(w->interval) << 40) ^ (uint64_t(warp) << 16) ^ sweep);
      w->order_identity = false;
    } else if (!w->order_identity) {
      for (uint32_t i = 0; i < kWarpSize; ++i) w->order[i] = uint8_t(i);
      w->order_identity = true;
    }
    w->sweep_lo = lo;
    w->sweep_end = hi - lo;
    for (w->sweep = 0; w->sweep < w->sweep_end; ++w->sweep) {
      ThreadCtx* t = &w->threads[lo + w->order[w->sweep]];
      if (t->state == kNotStarted || t->state == kRunnable) {
        resume(w, t);
        if (w->block_failed) return false;
      }
    }
    uint32_t waiting = 0, exited = 0;
    for (uint32_t i = lo; i < hi; ++i) {
      const uint8_t s = w->threads[i].state;
      if (s == kAtWarpOp) waiting |= 1u << (i - lo);
      else if (s == kExited) exited |= 1u << (i - lo);
    }
    if (!waiting) {
#if defined(CNNC_EMU_TRACE)
      if (w->trace) trace_warp(w);
#endif
      return true;
    }
    if (!resolve_warp(w, lo, hi, waiting, exited)) return false;
  }
}

// --- the module's thread-local storage: static __shared__ arrays are `static thread_local` ---
struct TlsSearch {
  const void* probe;
  unsigned char* lo;
  size_t size;
};

inline int find_tls(dl_phdr_info* info, size_t, void* arg) {
  auto* s = static_cast<TlsSearch*>(arg);
  if (!info->dlpi_tls_data) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_TLS) continue;
    auto* lo = static_cast<unsigned char*>(info->dlpi_tls_data);
    if (s->probe >= lo && s->probe < lo + ph.p_memsz) {
      s->lo = lo;
      s->size = ph.p_memsz;
      return 1;
    }
  }
  return 0;
}

// The calling OS thread's copy of this module's TLS block (found through t_worker, which lives
// in it), once per cnnc_emu_launch_work call.
inline void locate_tls(Worker* w) {
  if (w->tls_known) return;
  TlsSearch s{&t_worker, nullptr, 0};
  dl_iterate_phdr(find_tls, &s);
  w->tls_lo = s.lo;
  w->tls_size = s.size;
  w->tls_known = true;
}

// Whether [p, p+n) lies in the block's shared memory (dynamic, or static in the TLS block).
inline bool in_shared(Worker* w, const void* p, size_t n) {
  auto* c = static_cast<const unsigned char*>(p);
  if (w->dyn && c >= w->dyn && c + n <= w->dyn + w->launch->shared_bytes) return true;
  locate_tls(w);
  return w->tls_lo && c >= w->tls_lo && c + n <= w->tls_lo + w->tls_size;
}

// Fills static shared memory with 0xFF bytes (NaN floats): the whole TLS block, keeping the
// runtime's own thread-local variables.
inline void poison_static_shared(Worker* w) {
  locate_tls(w);
  if (!w->tls_lo) return;
  ThreadCtx* const t = t_thread;
  BlockCtx* const b = t_block;
  Worker* const wk = t_worker;
  memset(w->tls_lo, 0xFF, w->tls_size);
  t_thread = t;
  t_block = b;
  t_worker = wk;
}

inline bool run_block(Worker* w, uint64_t b) {
  Launch* L = w->launch;
  BlockCtx& B = w->block;
  const uint64_t gxy = uint64_t(L->grid.x) * L->grid.y;
  B.blockIdx = uint3{uint32_t(b % L->grid.x), uint32_t((b / L->grid.x) % L->grid.y), uint32_t(b / gxy)};
  B.blockDim = L->block;
  B.gridDim = L->grid;
  B.dynamic_shared = w->dyn;
  B.barrier_count = 0;
  const uint32_t n = L->nthreads;
  if (w->idx_dims.x != L->block.x || w->idx_dims.y != L->block.y || w->idx_dims.z != L->block.z) {
    for (uint32_t i = 0; i < n; ++i) {
      w->threads[i].idx = uint3{i % L->block.x, (i / L->block.x) % L->block.y, i / (L->block.x * L->block.y)};
    }
    w->idx_dims = L->block;
  }
  for (uint32_t i = 0; i < n; ++i) {
    w->threads[i].state = kNotStarted;
    w->threads[i].fiber = nullptr;
    w->threads[i].ncopies = 0;
    w->threads[i].committed = 0;
  }
  if ((L->flags & (kFlagFillShared | kFlagPoisonShared)) && L->shared_bytes) memset(w->dyn, 0xFF, L->shared_bytes);
  if (L->flags & kFlagPoisonShared) poison_static_shared(w);
  w->block_failed = false;
  w->interval = 0;
  t_block = &w->block;
  const uint32_t nwarps = (n + kWarpSize - 1) / kWarpSize;
  uint8_t warp_order[kMaxThreads / kWarpSize];
  for (;; ++w->interval) {
    for (uint32_t i = 0; i < nwarps; ++i) warp_order[i] = uint8_t(i);
    if (L->flags & kOrderFlags) fill_order(L, warp_order, nwarps, mix64(~block_linear(w)) ^ w->interval);
    for (uint32_t i = 0; i < nwarps; ++i) {
      if (!run_warp(w, warp_order[i], n)) {
        abandon_block(w, n);
        return false;
      }
    }
    uint32_t exited = 0, at_barrier = 0;
    int32_t count = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const ThreadCtx& t = w->threads[i];
      if (t.state == kExited) {
        ++exited;
      } else {
        ++at_barrier;
        count += t.pred != 0;
      }
    }
    if (at_barrier == 0) return true;
    if (exited) {
      fail(w, CNNC_EMU_BLOCK_FMT ": %u of %u threads exited while %u wait at __syncthreads() "
              "(a barrier must be reached by every thread of the block)",
           CNNC_EMU_BLOCK_ARGS(w), exited, n, at_barrier);
      abandon_block(w, n);
      return false;
    }
    B.barrier_count = count;
    for (uint32_t i = 0; i < n; ++i) w->threads[i].state = kRunnable;
  }
}

__attribute__((noinline)) inline void set_tls(Worker* w) {
  t_worker = w;
  t_thread = nullptr;
  t_block = w ? &w->block : nullptr;
}

inline void launch_work(Launch* L, Worker* w) {
  if (L->failed.load(std::memory_order_relaxed)) return;
  // Dynamic shared memory. Under ASan the buffer has exactly the launch's size, so overruns of
  // dynamic shared memory are reported; otherwise it only grows.
  bool need = !w->dyn_ready || (CNNC_EMU_ASAN ? w->dyn_size != L->shared_bytes : w->dyn_size < L->shared_bytes);
  if (need) {
    free(w->dyn);
    void* p = nullptr;
    const size_t bytes = (L->shared_bytes || CNNC_EMU_ASAN) ? L->shared_bytes : 1;  // ASan: 0 means none
    if (posix_memalign(&p, 64, bytes) != 0) p = nullptr;
    w->dyn = static_cast<unsigned char*>(p);
    w->dyn_size = p ? L->shared_bytes : 0;
    w->dyn_ready = p != nullptr;
    if (!p) {
      int expected = 0;
      if (L->failed.compare_exchange_strong(expected, 1))
        snprintf(L->error, sizeof L->error, "cannot allocate %llu bytes of dynamic shared memory",
                 (unsigned long long)L->shared_bytes);
      return;
    }
    memset(w->dyn, 0xFF, L->shared_bytes);  // never looks like zero-initialised memory
  }
  w->launch = L;
  w->tls_known = false;  // a worker may run on another OS thread in every call
  set_tls(w);
  for (;;) {
    if (L->failed.load(std::memory_order_relaxed)) break;
    uint64_t b = L->next_block.fetch_add(1, std::memory_order_relaxed);
#if defined(CNNC_EMU_TRACE)
    if (L->trace) {  // a traced launch runs its sample of blocks only
      if (!trace_block(L, w, b)) break;
    } else if (b >= L->nblocks) {
      break;
    }
#else
    if (b >= L->nblocks) break;
#endif
    if (!run_block(w, block_at(L, b))) {
      int expected = 0;
      if (L->failed.compare_exchange_strong(expected, 1)) memcpy(L->error, w->fail, sizeof w->fail);
      break;
    }
  }
#if defined(CNNC_EMU_TRACE)
  if (L->trace) trace_merge(L, w);
#endif
  set_tls(nullptr);
  w->launch = nullptr;
  // Every fiber is idle now (blocks end with all threads exited or abandoned): give the stacks
  // back, so that idle modules hold none.
  for (uint32_t i = 0; i < w->nfibers; ++i) fiber_free(w->fibers[i]);
  w->nfibers = w->nidle = 0;
}

// --- calls made by kernels (on a fiber) ---
__attribute__((noinline)) inline int barrier_wait(int pred) {
  ThreadCtx* t = t_thread;
  Worker* w = t_worker;
  if (!t || !w || !w->running) return pred != 0;  // host code: nothing to wait for
  t->pred = pred;
  t->state = kAtBarrier;
  yield_to_scheduler(w);
  return t_block->barrier_count;
}

__attribute__((noinline)) inline uint64_t warp_op(uint8_t op, uint32_t mask, uint64_t value, int32_t arg,
                                                  int32_t width) {
  ThreadCtx* t = t_thread;
  Worker* w = t_worker;
  if (!t || !w || !w->running) {  // host code: a warp of one
    switch (op) {
      case kOpBallot: return value != 0;
      case kOpAny: case kOpAll: return value != 0;
      default: return value;
    }
  }
  t->op = op;
  t->mask = mask;
  t->value = value;
  t->arg = arg;
  t->width = width;
  t->state = kAtWarpOp;
  yield_to_scheduler(w);
  return t->result;
}

[[noreturn]] __attribute__((noinline)) inline void trap_with(const char* what) {
  Worker* w = t_worker;
  ThreadCtx* t = t_thread;
  if (!w || !t || !w->running) {
    fprintf(stderr, "cnnc emu: %s outside an emulated launch\n", what);
    abort();
  }
  fail(w, "%s in " CNNC_EMU_BLOCK_FMT " thread (%u,%u,%u)", what, CNNC_EMU_BLOCK_ARGS(w), t->idx.x, t->idx.y,
       t->idx.z);
  leave_fiber(w);
}

template <class T>
inline T warp_shuffle(uint8_t op, unsigned mask, T var, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffled values must be at most 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &var, sizeof(T));
  uint64_t r = warp_op(op, mask, bits, arg, width);
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}

inline unsigned active_mask() {
  Worker* w = t_worker;
  ThreadCtx* t = t_thread;
  if (!w || !t || !w->running) return 1u;
  const uint32_t me = uint32_t(t - w->threads);
  const uint32_t lo = me / kWarpSize * kWarpSize;
  const uint32_t n = w->launch->nthreads;
  unsigned m = 0;
  for (uint32_t i = lo; i < lo + kWarpSize && i < n; ++i)
    if (w->threads[i].state != kExited) m |= 1u << (i - lo);
  return m;
}

// --- TF32 and BF16 roundings, bit-exact ---

// cvt.rna.tf32.f32 (wmma::__float_to_tf32): round to nearest, ties away from zero, to 10 mantissa
// bits; the low 13 bits of the result are zero. This is the code ptxas (CUDA 11.8) emits for it on
// sm_80 and sm_90 — FSETP.GEU |x| >= +INF; @!P0 IADD x += 0x1000; LOP3 x &= 0xffffe000 — so
// infinities keep their bits, a NaN loses the low 13 bits of its payload (a NaN whose payload
// lies only there becomes an infinity, as on the GPU), finite values past the largest TF32
// round to infinity, and subnormals round like any other value (no flush to zero).
inline float tf32_round(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) < 0x7F800000u) u += 0x1000u;
  return std::bit_cast<float>(u & 0xFFFFE000u);
}

// What a tensor core reads of an fp32 register holding a TF32 operand: the top 19 bits (the low
// 13 are ignored, i.e. truncated). Kernels round with __float_to_tf32 first.
inline float tf32_truncate(float x) { return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xFFFFE000u); }

// cvt.rn.bf16.f32 (__float2bfloat16_rn): round to nearest, ties to even; any NaN becomes the
// canonical 0x7FFF; overflow rounds to infinity; subnormals round like any other value. (The
// integer formulation of CUDA's own host implementation in cuda_bf16.hpp.)
inline uint16_t bf16_round(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  const uint32_t rem = u << 16;
  uint16_t r = uint16_t(u >> 16);
  if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u))) ++r;
  return r;
}
inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

// --- wmma fragment layouts ---
// A fragment holds num_elements = tile/32 elements per lane, like the hardware's; which tile
// element x[i] of a lane holds is the emulator's choice (the hardware's is unspecified). By default
// slot i*32 + lane holds element i*32 + lane (row-major tile index); the race-mode orders use a
// seeded permutation, so a kernel that depends on the layout gives different results there.
enum WmmaUse : uint8_t { kUseA, kUseB, kUseAcc };

inline void init_wmma_maps(Launch* L) {
  for (int use = 0; use < 3; ++use)
    for (int sz = 0; sz < 2; ++sz) {
      uint16_t* m = L->wmma_map[use][sz];
      const uint32_t n = sz ? 256u : 128u;
      for (uint32_t i = 0; i < n; ++i) m[i] = uint16_t(i);
      if (!(L->flags & kOrderFlags)) continue;
      uint64_t r = mix64((uint64_t(use) << 8 | sz) ^ mix64(L->flags));
      for (uint32_t i = n - 1; i > 0; --i) {
        r = mix64(r);
        const uint32_t j = uint32_t(r % (i + 1));
        const uint16_t tmp = m[i];
        m[i] = m[j];
        m[j] = tmp;
      }
    }
}

// What one lane hands to the warp-wide mma_sync.
struct MmaArgs {
  const void* a;   // the lane's matrix_a elements (float holding TF32, or bf16 bits)
  const void* b;   // matrix_b
  const float* c;  // accumulator in
  float* d;        // accumulator out (may be c)
  int k;           // 8: TF32 m16n16k8; 16: BF16 m16n16k16
};

// D = A·B + C for a whole warp (16x16 tiles): each product is exact, the K products and C are
// summed in double precision in k order and the sum is rounded once to fp32 (round to nearest).
// Tensor cores also form exact products and round once per instruction, though their internal
// alignment and rounding are undocumented, so results can differ from the GPU in the last bit.
inline void mma_resolve(Worker* w, uint32_t lo) {
  const MmaArgs* args[kWarpSize];
  for (uint32_t l = 0; l < kWarpSize; ++l) args[l] = reinterpret_cast<const MmaArgs*>(w->threads[lo + l].value);
  const int K = args[0]->k;
  for (uint32_t l = 1; l < kWarpSize; ++l)
    if (args[l]->k != K) {
      fail(w, CNNC_EMU_BLOCK_FMT " warp %u: lanes 0 and %u call wmma::mma_sync with different shapes",
           CNNC_EMU_BLOCK_ARGS(w), lo / kWarpSize, l);
      return;
    }
  const Launch* L = w->launch;
  const int sz = K == 16;  // A and B hold 16*K elements: 128 (TF32) or 256 (BF16)
  const uint16_t* mapA = L->wmma_map[kUseA][sz];
  const uint16_t* mapB = L->wmma_map[kUseB][sz];
  const uint16_t* mapC = L->wmma_map[kUseAcc][1];
  const uint32_t nab = uint32_t(16 * K) / kWarpSize;
  double A[256], B[256], C[256];
  for (uint32_t l = 0; l < kWarpSize; ++l) {
    const MmaArgs* m = args[l];
    for (uint32_t i = 0; i < nab; ++i) {
      const uint32_t slot = i * kWarpSize + l;
      if (K == 8) {
        A[mapA[slot]] = tf32_truncate(static_cast<const float*>(m->a)[i]);
        B[mapB[slot]] = tf32_truncate(static_cast<const float*>(m->b)[i]);
      } else {
        A[mapA[slot]] = bf16_to_float(static_cast<const uint16_t*>(m->a)[i]);
        B[mapB[slot]] = bf16_to_float(static_cast<const uint16_t*>(m->b)[i]);
      }
    }
    for (uint32_t i = 0; i < 8; ++i) C[mapC[i * kWarpSize + l]] = m->c[i];
  }
  float D[256];
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      double s = C[r * 16 + c];
      for (int k = 0; k < K; ++k) s += A[r * K + k] * B[k * 16 + c];
      D[r * 16 + c] = float(s);
    }
  for (uint32_t l = 0; l < kWarpSize; ++l)
    for (uint32_t i = 0; i < 8; ++i) args[l]->d[i] = D[mapC[i * kWarpSize + l]];
}

// The calling thread's lane, or a trap outside a launch.
inline uint32_t current_lane(const char* what) {
  Worker* w = t_worker;
  ThreadCtx* t = t_thread;
  if (!w || !t || !w->running) trap_with(what);
  return uint32_t(t - w->threads) % kWarpSize;
}

// --- kernel entry: unpack cuLaunchKernel-style parameters (params[i] points at argument i) ---
template <class... A, size_t... I>
inline void invoke_impl(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
  kernel(*static_cast<A*>(params[I])...);
}

template <class... A>
inline void invoke(void (*kernel)(A...), void** params) {
  static_assert(((sizeof(A) <= 8 && std::is_trivially_copyable_v<A>) && ...),
                "cnnc emu: kernel parameters must be pointers or scalars of at most 8 bytes");
  invoke_impl(kernel, params, std::index_sequence_for<A...>{});
}

template <class... A>
constexpr int arity(void (*)(A...)) {
  return int(sizeof...(A));
}

template <auto Kernel>
void entry_for(void** params) {
  invoke(Kernel, params);
}

}  // namespace cnnc_emu

// ---------------------------------------------------------------------------------------------
// C API (what the Go package calls, through dlsym)
// ---------------------------------------------------------------------------------------------
#ifdef CNNC_EMU_BUILTIN
#define CNNC_EMU_API static __attribute__((unused))
#else
#define CNNC_EMU_API extern "C" __attribute__((weak, visibility("default")))
#endif

CNNC_EMU_API int cnnc_emu_abi_version(void) { return 1; }

// Installs the process-wide fiber stack pool (see StackAcquireFn); call before any launch.
CNNC_EMU_API void cnnc_emu_set_stack_provider(void* (*acquire)(size_t* size), void (*release)(void* lo, size_t size)) {
  cnnc_emu::g_stack_acquire = acquire;
  cnnc_emu::g_stack_release = release;
}

CNNC_EMU_API void* cnnc_emu_worker_new(void) { return new (std::nothrow) cnnc_emu::Worker(); }

CNNC_EMU_API void cnnc_emu_worker_free(void* worker) {
  auto* w = static_cast<cnnc_emu::Worker*>(worker);
  if (!w) return;
  free(w->dyn);
  delete w;
}

// Returns nullptr when the configuration is invalid (the caller validates first).
CNNC_EMU_API void* cnnc_emu_launch_new(void (*entry)(void**), void** params, const uint32_t* grid,
                                       const uint32_t* block, uint64_t shared_bytes, uint32_t flags) {
  const uint64_t nthreads = uint64_t(block[0]) * block[1] * block[2];
  if (!entry || !grid[0] || !grid[1] || !grid[2] || !nthreads || nthreads > cnnc_emu::kMaxThreads) return nullptr;
  auto* L = new (std::nothrow) cnnc_emu::Launch();
  if (!L) return nullptr;
  L->entry = entry;
  L->params = params;
  L->grid = dim3(grid[0], grid[1], grid[2]);
  L->block = dim3(block[0], block[1], block[2]);
  L->shared_bytes = shared_bytes;
  L->flags = flags;
  L->nblocks = uint64_t(grid[0]) * grid[1] * grid[2];
  L->nthreads = uint32_t(nthreads);
  cnnc_emu::init_wmma_maps(L);
  cnnc_emu::block_order_init(L);
  return L;
}

// Runs blocks of the launch on the calling OS thread until none is left or one failed. Call it
// from several OS threads at once, each with its own worker, to run blocks in parallel.
CNNC_EMU_API void cnnc_emu_launch_work(void* launch, void* worker) {
  cnnc_emu::launch_work(static_cast<cnnc_emu::Launch*>(launch), static_cast<cnnc_emu::Worker*>(worker));
}

// The first failure of the launch, or nullptr.
CNNC_EMU_API const char* cnnc_emu_launch_error(void* launch) {
  auto* L = static_cast<cnnc_emu::Launch*>(launch);
  return L->failed.load() ? L->error : nullptr;
}

CNNC_EMU_API void cnnc_emu_launch_free(void* launch) { delete static_cast<cnnc_emu::Launch*>(launch); }

#if defined(CNNC_EMU_TRACE)
// The instrumentation's calls (-fsanitize=kernel-address with calls for every access).
#define CNNC_EMU_TRACE_HOOK(n)                                                                     \
  extern "C" CNNC_EMU_NO_TRACE void __asan_load##n##_noabort(void* p) {                            \
    ::cnnc_emu::trace_record(p, n, 0, __builtin_return_address(0));                                \
  }                                                                                                \
  extern "C" CNNC_EMU_NO_TRACE void __asan_store##n##_noabort(void* p) {                           \
    ::cnnc_emu::trace_record(p, n, ::cnnc_emu::kTraceStore, __builtin_return_address(0));          \
  }
CNNC_EMU_TRACE_HOOK(1)
CNNC_EMU_TRACE_HOOK(2)
CNNC_EMU_TRACE_HOOK(4)
CNNC_EMU_TRACE_HOOK(8)
CNNC_EMU_TRACE_HOOK(16)
#undef CNNC_EMU_TRACE_HOOK
extern "C" CNNC_EMU_NO_TRACE void __asan_loadN_noabort(void* p, size_t n) {
  ::cnnc_emu::trace_record(p, uint32_t(n), 0, __builtin_return_address(0));
}
extern "C" CNNC_EMU_NO_TRACE void __asan_storeN_noabort(void* p, size_t n) {
  ::cnnc_emu::trace_record(p, uint32_t(n), ::cnnc_emu::kTraceStore, __builtin_return_address(0));
}
extern "C" CNNC_EMU_NO_TRACE void __asan_handle_no_return(void) {}

// A trace of the blocks blocks[0..n) (linear indices), block i standing for weights[i] blocks of
// the grid; global memory is the spans [lo, hi) (sorted, disjoint).
CNNC_EMU_API void* cnnc_emu_trace_new(const uint64_t* span_lo, const uint64_t* span_hi, size_t nspans, const uint64_t* blocks,
                                      const double* weights, size_t nblocks) {
  auto* T = new (std::nothrow) cnnc_emu::Trace();
  if (!T) return nullptr;
  T->span_lo.assign(span_lo, span_lo + nspans);
  T->span_hi.assign(span_hi, span_hi + nspans);
  T->blocks.assign(blocks, blocks + nblocks);
  T->weights.assign(weights, weights + nblocks);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&cnnc_emu_trace_new), &info)) T->base = uintptr_t(info.dli_fbase);
  return T;
}

// Records the launch's accesses into the trace (before cnnc_emu_launch_work).
CNNC_EMU_API int cnnc_emu_launch_set_trace(void* launch, void* trace) {
  auto* L = static_cast<cnnc_emu::Launch*>(launch);
  auto* T = static_cast<cnnc_emu::Trace*>(trace);
  for (uint64_t b : T->blocks)
    if (b >= L->nblocks) return -1;
  L->trace = T;
  return 0;
}

// Copies up to cap sites into out and returns how many there are; -1 if a warp made more
// accesses between two barriers than the trace holds.
CNNC_EMU_API long cnnc_emu_trace_sites(void* trace, cnnc_emu::TraceSite* out, size_t cap) {
  auto* T = static_cast<cnnc_emu::Trace*>(trace);
  if (T->overflow.load()) return -1;
  size_t i = 0;
  for (auto& [key, site] : T->sites) {
    if (i < cap) out[i] = site;
    ++i;
  }
  return long(i);
}

CNNC_EMU_API void cnnc_emu_trace_free(void* trace) { delete static_cast<cnnc_emu::Trace*>(trace); }
#endif  // CNNC_EMU_TRACE

namespace cnnc_emu {
struct SyncJob {
  Launch* launch;
  Worker* worker;
};
inline void* sync_job_main(void* arg) {
  auto* job = static_cast<SyncJob*>(arg);
  launch_work(job->launch, job->worker);
  return nullptr;
}
}  // namespace cnnc_emu

// Standalone convenience: a whole synchronous launch on `workers` OS threads (<= 0: one per CPU).
// Returns 0, or -1 with the reason in err.
CNNC_EMU_API int cnnc_emu_launch_sync(void (*entry)(void**), void** params, const uint32_t* grid,
                                      const uint32_t* block, uint64_t shared_bytes, int workers, char* err,
                                      size_t errlen) {
  using namespace cnnc_emu;
  auto fail_with = [&](const char* msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
    return -1;
  };
  void* lp = cnnc_emu_launch_new(entry, params, grid, block, shared_bytes, 0);
  if (!lp) return fail_with("invalid launch configuration");
  auto* L = static_cast<Launch*>(lp);
  if (workers <= 0) workers = int(sysconf(_SC_NPROCESSORS_ONLN));
  if (workers < 1) workers = 1;
  if (uint64_t(workers) > L->nblocks) workers = int(L->nblocks);
  SyncJob* jobs = new SyncJob[size_t(workers)];
  pthread_t* tids = new pthread_t[size_t(workers)];
  bool* started = new bool[size_t(workers)]();
  for (int i = 0; i < workers; ++i) {
    jobs[i] = SyncJob{L, static_cast<Worker*>(cnnc_emu_worker_new())};
    if (!jobs[i].worker) continue;
    if (i > 0) started[i] = pthread_create(&tids[i], nullptr, sync_job_main, &jobs[i]) == 0;
  }
  if (jobs[0].worker) launch_work(L, jobs[0].worker);
  for (int i = 1; i < workers; ++i)
    if (started[i]) pthread_join(tids[i], nullptr);
  // Blocks a worker could not be given to are run by the ones that could.
  for (int i = 0; i < workers; ++i)
    if (jobs[i].worker) {
      launch_work(L, jobs[i].worker);
      break;
    }
  int rc = 0;
  if (const char* e = cnnc_emu_launch_error(L)) rc = fail_with(e);
  else if (L->next_block.load() < L->nblocks) rc = fail_with("out of memory");
  for (int i = 0; i < workers; ++i) cnnc_emu_worker_free(jobs[i].worker);
  delete[] started;
  delete[] tids;
  delete[] jobs;
  cnnc_emu_launch_free(L);
  return rc;
}

namespace cnnc_emu {
// Standalone C++ launch: cnnc_emu::launch<my_kernel>(grid, block, sharedBytes, args...).
template <auto Kernel, class... P, class... Args>
int launch_as(void (*)(P...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
  static_assert(sizeof...(P) == sizeof...(Args), "wrong number of kernel arguments");
  uint64_t values[sizeof...(P) + 1] = {};
  void* ptrs[sizeof...(P) + 1] = {};
  size_t i = 0;
  auto put = [&](auto v) {
    memcpy(&values[i], &v, sizeof v);
    ptrs[i] = &values[i];
    ++i;
  };
  (put(P(args)), ...);
  const uint32_t g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
  char err[768];
  int rc = cnnc_emu_launch_sync(&entry_for<Kernel>, ptrs, g, b, shared_bytes, 0, err, sizeof err);
  if (rc) fprintf(stderr, "cnnc emu: launch failed: %s\n", err);
  return rc;
}
template <auto Kernel, class... Args>
int launch(dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
  return launch_as<Kernel>(Kernel, grid, block, shared_bytes, args...);
}
}  // namespace cnnc_emu

// ---------------------------------------------------------------------------------------------
// CUDA device functions
// ---------------------------------------------------------------------------------------------
#define threadIdx (::cnnc_emu::t_thread->idx)
#define blockIdx (::cnnc_emu::t_block->blockIdx)
#define blockDim (::cnnc_emu::t_block->blockDim)
#define gridDim (::cnnc_emu::t_block->gridDim)

// The compiler must not move memory accesses across a synchronisation point: other "threads"
// run inside the call, invisibly to it.
#define CNNC_EMU_CLOBBER() asm volatile("" ::: "memory")

inline void __syncthreads() {
  CNNC_EMU_CLOBBER();
  ::cnnc_emu::barrier_wait(0);
  CNNC_EMU_CLOBBER();
}
inline int __syncthreads_count(int pred) {
  CNNC_EMU_CLOBBER();
  int r = ::cnnc_emu::barrier_wait(pred);
  CNNC_EMU_CLOBBER();
  return r;
}
inline int __syncthreads_and(int pred) {
  CNNC_EMU_CLOBBER();
  int r = ::cnnc_emu::barrier_wait(pred != 0) == int(blockDim.x * blockDim.y * blockDim.z);
  CNNC_EMU_CLOBBER();
  return r;
}
inline int __syncthreads_or(int pred) {
  CNNC_EMU_CLOBBER();
  int r = ::cnnc_emu::barrier_wait(pred) != 0;
  CNNC_EMU_CLOBBER();
  return r;
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  CNNC_EMU_CLOBBER();
  ::cnnc_emu::warp_op(::cnnc_emu::kOpSyncWarp, mask, 0, 0, 32);
  CNNC_EMU_CLOBBER();
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  return ::cnnc_emu::warp_shuffle(::cnnc_emu::kOpShflIdx, mask, var, srcLane, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
  return ::cnnc_emu::warp_shuffle(::cnnc_emu::kOpShflUp, mask, var, int(delta), width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize) {
  return ::cnnc_emu::warp_shuffle(::cnnc_emu::kOpShflDown, mask, var, int(delta), width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  return ::cnnc_emu::warp_shuffle(::cnnc_emu::kOpShflXor, mask, var, laneMask, width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpBallot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) {
  return int(::cnnc_emu::warp_op(::cnnc_emu::kOpAny, mask, pred != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int pred) {
  return int(::cnnc_emu::warp_op(::cnnc_emu::kOpAll, mask, pred != 0, 0, 32));
}
inline unsigned __activemask() { return ::cnnc_emu::active_mask(); }
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedAdd, mask, v, 0, 32));
}
inline int __reduce_add_sync(unsigned mask, int v) {
  return int(unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedAdd, mask, unsigned(v), 0, 32)));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedMinU, mask, v, 0, 32));
}
inline int __reduce_min_sync(unsigned mask, int v) {
  return int(unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedMinS, mask, unsigned(v), 0, 32)));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedMaxU, mask, v, 0, 32));
}
inline int __reduce_max_sync(unsigned mask, int v) {
  return int(unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedMaxS, mask, unsigned(v), 0, 32)));
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned v) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedAnd, mask, v, 0, 32));
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedOr, mask, v, 0, 32));
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v) {
  return unsigned(::cnnc_emu::warp_op(::cnnc_emu::kOpRedXor, mask, v, 0, 32));
}

[[noreturn]] inline void __trap() { ::cnnc_emu::trap_with("__trap()"); }
[[noreturn]] inline void __brkpt() { ::cnnc_emu::trap_with("__brkpt()"); }

// Device assert(): g++'s assert() calls __assert_fail; this module's own (hidden) definition
// turns a failed assertion into a launch error instead of aborting the process.
extern "C" [[noreturn]] inline void __assert_fail(const char* expr, const char* file, unsigned int line,
                                                  const char* func) noexcept {
  char what[384];
  snprintf(what, sizeof what, "assertion `%s' failed at %s:%u in %s", expr, file, line, func);
  ::cnnc_emu::trap_with(what);
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }

inline long long clock64() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// --- loads/stores with cache hints: plain accesses here ---
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// --- atomics: relaxed read-modify-write, atomic across OS threads ---
namespace cnnc_emu {
template <class T>
inline std::atomic_ref<T> aref(T* p) {
  return std::atomic_ref<T>(*p);
}
template <class T, class F>
inline T atomic_update(T* p, F f) {  // CAS loop for operations std::atomic_ref lacks
  std::atomic_ref<T> a(*p);
  T old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, f(old), std::memory_order_relaxed)) {
  }
  return old;
}
}  // namespace cnnc_emu

#define CNNC_EMU_ATOMIC_ADD_SUB(T)                                                                   \
  inline T atomicAdd(T* p, T v) { return ::cnnc_emu::aref(p).fetch_add(v, std::memory_order_relaxed); } \
  inline T atomicSub(T* p, T v) { return ::cnnc_emu::aref(p).fetch_sub(v, std::memory_order_relaxed); }
CNNC_EMU_ATOMIC_ADD_SUB(int)
CNNC_EMU_ATOMIC_ADD_SUB(unsigned int)
CNNC_EMU_ATOMIC_ADD_SUB(unsigned long long)
CNNC_EMU_ATOMIC_ADD_SUB(float)
CNNC_EMU_ATOMIC_ADD_SUB(double)
#undef CNNC_EMU_ATOMIC_ADD_SUB

#define CNNC_EMU_ATOMIC_INT(T)                                                                        \
  inline T atomicExch(T* p, T v) { return ::cnnc_emu::aref(p).exchange(v, std::memory_order_relaxed); } \
  inline T atomicCAS(T* p, T compare, T v) {                                                          \
    ::cnnc_emu::aref(p).compare_exchange_strong(compare, v, std::memory_order_relaxed);              \
    return compare;                                                                                    \
  }                                                                                                    \
  inline T atomicMin(T* p, T v) {                                                                     \
    return ::cnnc_emu::atomic_update(p, [v](T o) { return v < o ? v : o; });                           \
  }                                                                                                    \
  inline T atomicMax(T* p, T v) {                                                                     \
    return ::cnnc_emu::atomic_update(p, [v](T o) { return v > o ? v : o; });                           \
  }                                                                                                    \
  inline T atomicAnd(T* p, T v) { return ::cnnc_emu::aref(p).fetch_and(v, std::memory_order_relaxed); } \
  inline T atomicOr(T* p, T v) { return ::cnnc_emu::aref(p).fetch_or(v, std::memory_order_relaxed); }   \
  inline T atomicXor(T* p, T v) { return ::cnnc_emu::aref(p).fetch_xor(v, std::memory_order_relaxed); }
CNNC_EMU_ATOMIC_INT(int)
CNNC_EMU_ATOMIC_INT(unsigned int)
CNNC_EMU_ATOMIC_INT(long long)
CNNC_EMU_ATOMIC_INT(unsigned long long)
#undef CNNC_EMU_ATOMIC_INT

inline float atomicExch(float* p, float v) { return ::cnnc_emu::aref(p).exchange(v, std::memory_order_relaxed); }
inline unsigned int atomicInc(unsigned int* p, unsigned int limit) {
  return ::cnnc_emu::atomic_update(p, [limit](unsigned int o) { return o >= limit ? 0u : o + 1u; });
}
inline unsigned int atomicDec(unsigned int* p, unsigned int limit) {
  return ::cnnc_emu::atomic_update(p, [limit](unsigned int o) { return (o == 0 || o > limit) ? limit : o - 1u; });
}

// --- math intrinsics (CUDA's fast versions are the accurate ones here) ---
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }  // NaN → 0
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline unsigned int __float_as_uint(float x) { return std::bit_cast<unsigned int>(x); }
inline float __uint_as_float(unsigned int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

namespace cnnc_emu {
// float → integer as the GPU does it: NaN → 0, out of range saturates.
template <class I>
inline I float_to_int(double r) {
  if (r != r) return 0;
  if (r <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(r);
}
}  // namespace cnnc_emu
inline int __float2int_rn(float x) { return ::cnnc_emu::float_to_int<int>(nearbyint(double(x))); }
inline int __float2int_rz(float x) { return ::cnnc_emu::float_to_int<int>(trunc(double(x))); }
inline int __float2int_rd(float x) { return ::cnnc_emu::float_to_int<int>(floor(double(x))); }
inline int __float2int_ru(float x) { return ::cnnc_emu::float_to_int<int>(ceil(double(x))); }
inline unsigned int __float2uint_rn(float x) { return ::cnnc_emu::float_to_int<unsigned int>(nearbyint(double(x))); }
inline unsigned int __float2uint_rz(float x) { return ::cnnc_emu::float_to_int<unsigned int>(trunc(double(x))); }
inline long long __float2ll_rn(float x) { return ::cnnc_emu::float_to_int<long long>(nearbyint(double(x))); }
inline long long __float2ll_rz(float x) { return ::cnnc_emu::float_to_int<long long>(trunc(double(x))); }
inline float __int2float_rn(int x) { return float(x); }
inline float __uint2float_rn(unsigned int x) { return float(x); }
inline float __ll2float_rn(long long x) { return float(x); }

// --- integer intrinsics ---
inline int __popc(unsigned int x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(unsigned(x)); }
inline int __clzll(long long x) { return std::countl_zero((unsigned long long)x); }
inline int __ffs(int x) { return x ? std::countr_zero(unsigned(x)) + 1 : 0; }
inline int __ffsll(long long x) { return x ? std::countr_zero((unsigned long long)x) + 1 : 0; }
inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  x = ((x >> 8) & 0x00FF00FFu) | ((x & 0x00FF00FFu) << 8);
  return (x >> 16) | (x << 16);
}
inline int __mulhi(int a, int b) { return int((long long)a * b >> 32); }
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return unsigned((unsigned long long)a * b >> 32); }
inline int __mul24(int a, int b) { return int(unsigned(a << 8 >> 8) * unsigned(b << 8 >> 8)); }
inline unsigned int __umul24(unsigned int a, unsigned int b) { return (a & 0xFFFFFFu) * (b & 0xFFFFFFu); }

// min/max: CUDA's overload set, so that a call nvcc finds ambiguous (max(int, float)) fails here
// too. Floating-point versions follow fminf/fmaxf (a NaN operand yields the other one).
#define CNNC_EMU_MINMAX(R, A, B)                                  \
  inline R min(A a, B b) {                                        \
    R x = static_cast<R>(a), y = static_cast<R>(b);               \
    return y < x ? y : x;                                         \
  }                                                               \
  inline R max(A a, B b) {                                        \
    R x = static_cast<R>(a), y = static_cast<R>(b);               \
    return x < y ? y : x;                                         \
  }
CNNC_EMU_MINMAX(int, int, int)
CNNC_EMU_MINMAX(unsigned int, unsigned int, unsigned int)
CNNC_EMU_MINMAX(unsigned int, int, unsigned int)
CNNC_EMU_MINMAX(unsigned int, unsigned int, int)
CNNC_EMU_MINMAX(long, long, long)
CNNC_EMU_MINMAX(unsigned long, unsigned long, unsigned long)
CNNC_EMU_MINMAX(unsigned long, long, unsigned long)
CNNC_EMU_MINMAX(unsigned long, unsigned long, long)
CNNC_EMU_MINMAX(long long, long long, long long)
CNNC_EMU_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CNNC_EMU_MINMAX(unsigned long long, long long, unsigned long long)
CNNC_EMU_MINMAX(unsigned long long, unsigned long long, long long)
#undef CNNC_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

// ---------------------------------------------------------------------------------------------
// bfloat16 (cuda_bf16.h): storage and conversions
// ---------------------------------------------------------------------------------------------
struct __nv_bfloat16_raw {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::cnnc_emu::bf16_round(f)) {}  // round to nearest even, as CUDA's
  __nv_bfloat16(double f) : __x(::cnnc_emu::bf16_round(float(f))) {}
  operator float() const { return ::cnnc_emu::bf16_to_float(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }

// ---------------------------------------------------------------------------------------------
// Tensor cores (mma.h): nvcuda::wmma for TF32 m16n16k8 and BF16 m16n16k16 with fp32 accumulators
// ---------------------------------------------------------------------------------------------
// Fragments hold tile/32 elements per lane; which element is where is the emulator's own layout
// (cnnc_emu::init_wmma_maps), so kernels may only use fill/load/store/mma and operations applied
// alike to every x[i]. load/store check the alignment rules of the CUDA C++ Programming Guide on
// every call (pointer 256-bit aligned, ldm a multiple of 16 bytes) and trap when they are broken;
// mma_sync is a warp-wide operation that needs all 32 lanes.
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

inline float __float_to_tf32(float in) { return ::cnnc_emu::tf32_round(in); }

namespace detail {
template <class T> struct storage { using type = T; };
template <> struct storage<precision::tf32> { using type = float; };
template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
  static constexpr uint8_t use = ::cnnc_emu::kUseA;
};
template <int M, int N, int K> struct dims<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
  static constexpr uint8_t use = ::cnnc_emu::kUseB;
};
template <int M, int N, int K> struct dims<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
  static constexpr uint8_t use = ::cnnc_emu::kUseAcc;
};
template <class Use, int M, int N, int K, class T, class Layout>
constexpr bool supported() {
  if (M != 16 || N != 16 || (K != 8 && K != 16)) return false;
  if constexpr (std::is_same_v<Use, accumulator>) return std::is_same_v<T, float> && std::is_void_v<Layout>;
  else
    return (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>) &&
           (K == 8 ? std::is_same_v<T, precision::tf32> : std::is_same_v<T, __nv_bfloat16>);
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(detail::supported<Use, M, N, K, T, Layout>(),
                "cuda_emu.h: wmma fragments are matrix_a/matrix_b (row_major or col_major) of precision::tf32 "
                "m16n16k8 or __nv_bfloat16 m16n16k16, and float accumulators of those shapes");

 public:
  using element_type = T;
  using storage_element_type = typename detail::storage<T>::type;
  static constexpr int rows = detail::dims<Use, M, N, K>::rows, cols = detail::dims<Use, M, N, K>::cols;
  enum { num_elements = rows * cols / 32, num_storage_elements = rows * cols / 32 };
  storage_element_type x[num_elements];
};

namespace detail {
// The emulator's element map of a fragment type: slot i*32 + lane holds tile element map[slot].
template <class Frag, uint8_t Use>
inline const uint16_t* element_map(const char* what) {
  (void)::cnnc_emu::current_lane(what);
  return ::cnnc_emu::t_worker->launch->wmma_map[Use][Frag::rows * Frag::cols == 256];
}

inline void check_matrix(const void* p, unsigned ldm, size_t elem, const char* what) {
  char msg[256];
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    snprintf(msg, sizeof msg, "%s: pointer %p is not 256-bit (32-byte) aligned", what, p);
    ::cnnc_emu::trap_with(msg);
  }
  if ((size_t(ldm) * elem) % 16 != 0) {
    snprintf(msg, sizeof msg, "%s: ldm %u is not a multiple of %zu elements (16 bytes)", what, ldm, 16 / elem);
    ::cnnc_emu::trap_with(msg);
  }
}

template <class Frag, class S, bool RowMajor>
CNNC_EMU_TRACE_SITE void load(Frag& f, const S* p, unsigned ldm, uint8_t use, const char* what) {
  check_matrix(p, ldm, sizeof(S), what);
#if defined(CNNC_EMU_TRACE)
  ::cnnc_emu::trace_record(p, sizeof(S), ::cnnc_emu::kTraceMatrix | (RowMajor ? 0 : ::cnnc_emu::kTraceColMajor),
                           __builtin_return_address(0), ldm, Frag::rows, Frag::cols);
#endif
  const uint32_t lane = ::cnnc_emu::current_lane(what);
  const uint16_t* map = ::cnnc_emu::t_worker->launch->wmma_map[use][Frag::rows * Frag::cols == 256];
  for (int i = 0; i < Frag::num_elements; ++i) {
    const int e = map[i * 32 + int(lane)], r = e / Frag::cols, c = e % Frag::cols;
    f.x[i] = p[RowMajor ? size_t(r) * ldm + c : size_t(c) * ldm + r];
  }
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout>
  requires(!std::is_same_v<Use, accumulator>)
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const typename detail::storage<T>::type* p,
                             unsigned ldm) {
  detail::load<fragment<Use, M, N, K, T, Layout>, typename detail::storage<T>::type,
               std::is_same_v<Layout, row_major>>(f, p, ldm, detail::dims<Use, M, N, K>::use, "wmma::load_matrix_sync");
}

template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  if (layout == mem_row_major)
    detail::load<F, float, true>(f, p, ldm, ::cnnc_emu::kUseAcc, "wmma::load_matrix_sync");
  else
    detail::load<F, float, false>(f, p, ldm, ::cnnc_emu::kUseAcc, "wmma::load_matrix_sync");
}

template <int M, int N, int K>
CNNC_EMU_TRACE_SITE void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                                           layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  const char* what = "wmma::store_matrix_sync";
  detail::check_matrix(p, ldm, sizeof(float), what);
#if defined(CNNC_EMU_TRACE)
  ::cnnc_emu::trace_record(p, sizeof(float),
                           ::cnnc_emu::kTraceMatrix | ::cnnc_emu::kTraceStore |
                               (layout == mem_row_major ? 0 : ::cnnc_emu::kTraceColMajor),
                           __builtin_return_address(0), ldm, F::rows, F::cols);
#endif
  const uint32_t lane = ::cnnc_emu::current_lane(what);
  const uint16_t* map = ::cnnc_emu::t_worker->launch->wmma_map[::cnnc_emu::kUseAcc][1];
  for (int i = 0; i < F::num_elements; ++i) {
    const int e = map[i * 32 + int(lane)], r = e / F::cols, c = e % F::cols;
    p[layout == mem_row_major ? size_t(r) * ldm + c : size_t(c) * ldm + r] = f.x[i];
  }
}

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f,
                          const typename fragment<Use, M, N, K, T, Layout>::storage_element_type& v) {
  for (int i = 0; i < fragment<Use, M, N, K, T, Layout>::num_elements; ++i) f.x[i] = v;
}

template <int M, int N, int K, class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
                     const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  (void)::cnnc_emu::current_lane("wmma::mma_sync");
  ::cnnc_emu::MmaArgs args{a.x, b.x, c.x, d.x, K};
  CNNC_EMU_CLOBBER();
  ::cnnc_emu::warp_op(::cnnc_emu::kOpMma, 0xFFFFFFFFu, reinterpret_cast<uintptr_t>(&args), 0, 32);
  CNNC_EMU_CLOBBER();
}
}  // namespace wmma
}  // namespace nvcuda

// ---------------------------------------------------------------------------------------------
// cp.async (cuda_pipeline.h primitives): a copy is queued when issued and done — source read,
// destination written, zero fill added — when the thread waits for its group, the latest moment
// the GPU may do it; so a kernel that reads the destination before waiting sees stale data.
// ---------------------------------------------------------------------------------------------
namespace cnnc_emu {
// Completes the calling thread's copies of committed groups older than its `keep` newest ones.
inline void pipeline_complete(ThreadCtx* t, uint64_t keep) {
  const uint64_t limit = t->committed > keep ? t->committed - keep : 0;  // groups < limit complete
  uint32_t kept = 0;
  for (uint32_t i = 0; i < t->ncopies; ++i) {
    AsyncCopy& c = t->copies[i];
    if (c.group < limit) {
      memcpy(c.dst, c.src, c.size - c.zfill);
      memset(c.dst + (c.size - c.zfill), 0, c.zfill);
    } else {
      t->copies[kept++] = c;
    }
  }
  t->ncopies = kept;
}
}  // namespace cnnc_emu

CNNC_EMU_TRACE_SITE void __pipeline_memcpy_async(void* __restrict__ dst_shared, const void* __restrict__ src_global,
                                                 size_t size_and_align, size_t zfill = 0) {
  using namespace ::cnnc_emu;
#if defined(CNNC_EMU_TRACE)
  if (size_and_align > zfill)
    trace_record(src_global, uint32_t(size_and_align - zfill), kTraceAsync, __builtin_return_address(0));
  trace_record(dst_shared, uint32_t(size_and_align), kTraceAsync | kTraceStore, __builtin_return_address(0));
#endif
  (void)current_lane("__pipeline_memcpy_async");
  char msg[256];
  if (size_and_align != 4 && size_and_align != 8 && size_and_align != 16) {
    snprintf(msg, sizeof msg, "__pipeline_memcpy_async: size %zu is not 4, 8 or 16", size_and_align);
    trap_with(msg);
  }
  if (zfill > size_and_align) {
    snprintf(msg, sizeof msg, "__pipeline_memcpy_async: zero fill %zu exceeds the size %zu", zfill, size_and_align);
    trap_with(msg);
  }
  if (reinterpret_cast<uintptr_t>(dst_shared) % size_and_align || reinterpret_cast<uintptr_t>(src_global) % size_and_align) {
    snprintf(msg, sizeof msg, "__pipeline_memcpy_async: %p <- %p is not aligned to its size %zu", dst_shared, src_global,
             size_and_align);
    trap_with(msg);
  }
  if (!in_shared(t_worker, dst_shared, size_and_align)) {
    snprintf(msg, sizeof msg, "__pipeline_memcpy_async: destination %p is not shared memory", dst_shared);
    trap_with(msg);
  }
  ThreadCtx* t = t_thread;
  if (t->ncopies == t->copies_cap) {
    const uint32_t cap = t->copies_cap ? 2 * t->copies_cap : 16;
    auto* grown = static_cast<AsyncCopy*>(realloc(t->copies, cap * sizeof(AsyncCopy)));
    if (!grown) trap_with("__pipeline_memcpy_async: out of memory");
    t->copies = grown;
    t->copies_cap = cap;
  }
  t->copies[t->ncopies++] = AsyncCopy{static_cast<unsigned char*>(dst_shared), static_cast<const unsigned char*>(src_global),
                                      uint32_t(size_and_align), uint32_t(zfill), t->committed};
}
inline void __pipeline_commit() {
  (void)::cnnc_emu::current_lane("__pipeline_commit");
  ++::cnnc_emu::t_thread->committed;
}
inline void __pipeline_wait_prior(size_t prior) {
  (void)::cnnc_emu::current_lane("__pipeline_wait_prior");
  CNNC_EMU_CLOBBER();
  ::cnnc_emu::pipeline_complete(::cnnc_emu::t_thread, prior);
  CNNC_EMU_CLOBBER();
}

#ifdef CNNC_EMU_BUILTIN
}  // namespace CNNC_EMU_BUILTIN
#endif
#pragma GCC visibility pop

#endif  // CPU emulation
#endif  // CNNC_CUDA_EMU_H
