// Test kernels for access traces (Module.Trace): accesses whose wavefronts and sectors are known.
using namespace nvcuda;

// out[i] = in[i * stride] for n threads' worth of floats: stride 1 reads 4 sectors per warp,
// stride 8 or more 32.
extern "C" __global__ void strided_copy(const float* in, float* out, int stride, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[(long)i * stride];
}

// Shared memory: each thread writes s[t * stride] and reads it back, and every thread reads
// s[first] (a broadcast); wavefronts per warp: the most lanes whose words share a bank. (first is
// a parameter: the instrumentation skips accesses to static arrays at constant in-bound indices.)
extern "C" __global__ void bank_stride(float* out, int stride, int first) {
  __shared__ float s[64 * 33];
  const int t = threadIdx.x;
  s[t * stride] = (float)t;
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = s[t * stride] + s[first];
}

// 128-bit shared loads of consecutive float4s (dynamic shared memory): 4 wavefronts per warp.
extern "C" __global__ void vector_loads(float* out) {
  CNNC_DYNAMIC_SHARED(float, s);
  const int t = threadIdx.x;
  for (int j = 0; j < 4; j++) s[4 * t + j] = (float)(t + j);
  __syncthreads();
  const float4 v = *reinterpret_cast<const float4*>(&s[4 * t]);
  out[t] = v.x + v.y + v.z + v.w;
}

// A TF32 A tile (16x8, row-major) loaded from shared memory with leading dimension ldm, and an
// accumulator stored to global memory.
extern "C" __global__ void wmma_tile(const float* in, float* out, int ldm) {
  __shared__ __align__(32) float s[16 * 64];
  for (int e = threadIdx.x; e < 16 * 64; e += 32) s[e] = in[e];
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
  wmma::load_matrix_sync(a, s, ldm);
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b;
  wmma::fill_fragment(b, 1.0f);
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
  wmma::fill_fragment(c, 0.0f);
  wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

// cp.async of one float4 per thread: 4 sectors of global memory per warp, 4 shared wavefronts.
extern "C" __global__ void async_copy(const float* in, float* out) {
  __shared__ __align__(16) float s[4 * 32];
  __pipeline_memcpy_async(&s[4 * threadIdx.x], &in[4 * threadIdx.x], 16);
  __pipeline_commit();
  __pipeline_wait_prior(0);
  out[threadIdx.x] = s[4 * threadIdx.x];
}
