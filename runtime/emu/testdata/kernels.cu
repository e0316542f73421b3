// Test kernels for package emu: ordinary CUDA C, compiled unchanged by g++ with cuda_emu.h.
#include <cassert>
#ifdef CNNC_EMU
#include <pthread.h>  // to record which OS thread ran a block (emulator-specific check)
#endif

#define TILE 16

// Reversal through shared memory: wrong without the barrier, since thread t reads the slot
// that thread n-1-t writes.
extern "C" __global__ void reverse_sync(const float* in, float* out) {
  __shared__ float s[1024];
  unsigned n = blockDim.x, t = threadIdx.x, base = blockIdx.x * n;
  s[t] = in[base + t];
  __syncthreads();
  out[base + t] = s[n - 1 - t];
}

extern "C" __global__ void reverse_nosync(const float* in, float* out) {
  __shared__ float s[1024];
  unsigned n = blockDim.x, t = threadIdx.x, base = blockIdx.x * n;
  s[t] = in[base + t];
  out[base + t] = s[n - 1 - t];
}

// Hillis-Steele inclusive scan: two barriers per step, log2(n) steps.
extern "C" __global__ void scan_block(const int* in, int* out) {
  __shared__ int buf[1024];
  unsigned t = threadIdx.x, n = blockDim.x, base = blockIdx.x * n;
  buf[t] = in[base + t];
  __syncthreads();
  for (unsigned off = 1; off < n; off <<= 1) {
    int v = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += v;
    __syncthreads();
  }
  out[base + t] = buf[t];
}

// Every block fills its shared array with its own values round after round; a value from
// another block would show that blocks running in parallel share memory.
extern "C" __global__ void isolation(int rounds, int* mismatches, unsigned long long* os_thread) {
  __shared__ int s[256];
  int t = threadIdx.x, id = blockIdx.x;
  for (int r = 0; r < rounds; r++) {
    s[t] = id * 1000 + r;
    __syncthreads();
    if (s[(t + 1 + r) % blockDim.x] != id * 1000 + r) atomicAdd(mismatches, 1);
    __syncthreads();
  }
#ifdef CNNC_EMU
  if (t == 0) os_thread[id] = (unsigned long long)pthread_self();
#else
  if (t == 0) os_thread[id] = 0;
#endif
}

// Block sums through dynamic shared memory, viewed as floats then ints.
extern "C" __global__ void dyn_sum(const float* in, float* out, int* counts) {
  CNNC_DYNAMIC_SHARED(float, sf);
  int* si = reinterpret_cast<int*>(sf + blockDim.x);
  unsigned t = threadIdx.x;
  sf[t] = in[blockIdx.x * blockDim.x + t];
  si[t] = 1;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      sf[t] += sf[t + s];
      si[t] += si[t + s];
    }
    __syncthreads();
  }
  if (t == 0) {
    out[blockIdx.x] = sf[0];
    counts[blockIdx.x] = si[0];
  }
}

// Reads dynamic shared memory before writing it (a bug the emulator's poisoning exposes),
// then leaves zeros behind for the next block.
extern "C" __global__ void dyn_uninit(float* out) {
  CNNC_DYNAMIC_SHARED(float, s);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[threadIdx.x];
  __syncthreads();
  s[threadIdx.x] = 0.0f;
}

// Each warp operation's result for thread t goes to out[k * n + t].
extern "C" __global__ void warp_ops(const int* in, int* out) {
  const int n = blockDim.x, t = threadIdx.x, lane = t & 31, v = in[t];
  const unsigned all = 0xffffffffu;
  int k = 0;
  out[k++ * n + t] = __shfl_sync(all, v, (lane * 7 + 3) & 31);
  out[k++ * n + t] = __shfl_sync(all, v, lane * 3, 8);
  out[k++ * n + t] = __shfl_up_sync(all, v, 3);
  out[k++ * n + t] = __shfl_up_sync(all, v, 2, 16);
  out[k++ * n + t] = __shfl_down_sync(all, v, 5);
  out[k++ * n + t] = __shfl_down_sync(all, v, 1, 4);
  out[k++ * n + t] = __shfl_xor_sync(all, v, 9);
  out[k++ * n + t] = __shfl_xor_sync(all, v, 3, 4);
  out[k++ * n + t] = (int)__ballot_sync(all, v % 3 == 0);
  out[k++ * n + t] = __any_sync(all, v == 40);
  out[k++ * n + t] = __all_sync(all, v >= 0);
  out[k++ * n + t] = __all_sync(all, v % 2 == 0);
  int s = v;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(all, s, o);
  out[k++ * n + t] = s;
  out[k++ * n + t] = __reduce_add_sync(all, v);
  out[k++ * n + t] = __reduce_max_sync(all, v);
  float f = v * 0.5f;
  out[k++ * n + t] = (int)(__shfl_down_sync(all, f, 1) * 2.0f);
  unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;  // two independent half-warps
  out[k++ * n + t] = __shfl_sync(half, v, 0, 16);
  out[k++ * n + t] = (int)__ballot_sync(half, v & 1);
  __syncwarp();
  out[k++ * n + t] = __syncthreads_count(v % 5 == 0);
  out[k++ * n + t] = __syncthreads_and(v >= 0);
  out[k++ * n + t] = __syncthreads_or(v == 7);
}

extern "C" __global__ void atomics(int* icount, unsigned long long* usum, float* fsum, double* dsum, int* imax,
                                   int* imin, unsigned* cas2, int* exch) {
  int g = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(icount, 1);
  atomicAdd(usum, (unsigned long long)g);
  atomicAdd(fsum, 1.0f);
  atomicAdd(dsum, 0.5);
  atomicMax(imax, (g * 7919) % 100003);
  atomicMin(imin, -((g * 7919) % 100003));
  unsigned old = atomicOr(cas2, 0u), assumed;
  do {
    assumed = old;
    old = atomicCAS(cas2, assumed, assumed + 2u);
  } while (old != assumed);
  atomicExch(exch, g);
}

// C[M x N] = A[M x K] * B[K x N] with shared-memory tiles.
extern "C" __global__ void __launch_bounds__(TILE * TILE)
    matmul_tiled(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE + 1];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TILE) {
    int ak = k0 + threadIdx.x, bk = k0 + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
    Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? __ldg(&B[bk * N + col]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void params(long long* out, double* dout, const int* p, long long a, int b, float c, double d,
                                  unsigned char e, short f, unsigned long long g) {
  out[0] = a;
  out[1] = b;
  out[2] = (long long)(c * 4.0f);
  out[3] = p[0];
  out[4] = e;
  out[5] = f;
  out[6] = (long long)g;
  dout[0] = d;
  dout[1] = c;
}

// Records the indices each thread sees, packed one byte per component.
extern "C" __global__ void indices(int* out) {
  int bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int nt = blockDim.x * blockDim.y * blockDim.z;
  int* o = out + 4 * (bid * nt + tid);
  o[0] = threadIdx.x | threadIdx.y << 8 | threadIdx.z << 16;
  o[1] = blockIdx.x | blockIdx.y << 8 | blockIdx.z << 16;
  o[2] = blockDim.x | blockDim.y << 8 | blockDim.z << 16;
  o[3] = gridDim.x | gridDim.y << 8 | gridDim.z << 16;
}

// Intrinsics with exactly known results.
extern "C" __global__ void intrinsics(float* f, int* i) {
  f[0] = __saturatef(1.5f);
  f[1] = __saturatef(-0.25f);
  f[2] = __int_as_float(__float_as_int(2.5f));
  f[3] = fmaxf(1.0f, 3.0f) + fminf(-2.0f, 4.0f);
  f[4] = rsqrtf(4.0f);
  f[5] = __fdividef(1.0f, 8.0f);
  f[6] = max(2.0f, 3.5f);
  float4 v = make_float4(1, 2, 3, 4);
  f[7] = v.x + v.y + v.z + v.w;
  i[0] = __float2int_rn(2.5f);
  i[1] = __float2int_rn(3.5f);
  i[2] = __popc(0xF0F0u);
  i[3] = __clz(1);
  i[4] = __ffs(8);
  i[5] = (int)__brev(1u);
  i[6] = min(-3, 7);
  i[7] = warpSize;
}

// --- kernels that fail ---
extern "C" __global__ void trap_at(int block, int thread) {
  if (blockIdx.x == (unsigned)block && threadIdx.x == (unsigned)thread) __trap();
  __syncthreads();
}

extern "C" __global__ void early_exit_barrier(float* x) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  x[threadIdx.x] = 1.0f;
}

// Odd lanes wait at the block barrier while even lanes wait for them in a full-warp shuffle.
extern "C" __global__ void warp_deadlock(int* out) {
  if (threadIdx.x & 1) __syncthreads();
  else out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);
}

extern "C" __global__ void device_assert(int limit) { assert(threadIdx.x < (unsigned)limit); }
