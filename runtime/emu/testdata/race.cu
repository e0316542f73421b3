// Test kernels for the emulator's race mode (Module.SetSchedule): kernels with and without the
// synchronisation they need. Ordinary CUDA C.

// Reads the neighbour's slot without a barrier: right in the default order by luck (thread t-1
// runs before thread t, warp by warp), wrong when thread t runs first.
extern "C" __global__ void neighbour_nosync(const float* in, float* out) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  out[blockIdx.x * blockDim.x + t] = t > 0 ? s[t - 1] : 0.0f;
}

// The same with the barrier: right in every order.
extern "C" __global__ void neighbour_sync(const float* in, float* out) {
  __shared__ float s[256];
  const int t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = t > 0 ? s[t - 1] : 0.0f;
}

// A warp exchanges through dynamic shared memory with __syncwarp, then reduces with shuffles:
// right in every order.
extern "C" __global__ void warp_exchange(const float* in, float* out) {
  CNNC_DYNAMIC_SHARED(float, s);
  const int t = threadIdx.x, lane = t % 32;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncwarp();
  float v = s[t ^ 1] * (float)(lane + 1);
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[blockIdx.x * blockDim.x + t] = v;
}

// Reads static shared memory nothing wrote (write is 0; were nothing ever to write it, the C++
// compiler could assume zeros): poison in race mode.
extern "C" __global__ void read_unwritten(unsigned* out, int write) {
  __shared__ unsigned s[64];
  if (write) s[threadIdx.x] = 1u;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

// "The last block reduces" (split-K fix-up): each block writes its 32 partials, fences, and takes a
// ticket from a counter; the block that draws the last ticket adds every block's partials and resets
// the counter. ordered != 0 adds them in block order 0..n-1 (right in every block order); ordered == 0
// starts after the last block (its result depends on which block arrives last: a race).
extern "C" __global__ void last_block_sum(const float* x, float* partial, unsigned* counter, float* out,
                                          unsigned* last, int ordered) {
  __shared__ bool isLast;
  const unsigned lane = threadIdx.x, n = gridDim.x;
  partial[blockIdx.x * 32 + lane] = x[blockIdx.x * 32 + lane] * 3.0f;
  __threadfence();
  __syncthreads();
  if (lane == 0) isLast = atomicAdd(counter, 1u) == n - 1;
  __syncthreads();
  if (!isLast) return;
  __threadfence();
  float sum = 0.0f;
  for (unsigned s = 0; s < n; ++s) sum += partial[(ordered ? s : (blockIdx.x + 1 + s) % n) * 32 + lane];
  out[lane] = sum;
  if (lane == 0) {
    *last = blockIdx.x;
    *counter = 0;
  }
}
