// Test kernels for the emulator's tensor-core, bfloat16 and cp.async support: ordinary CUDA C that
// nvcc compiles for sm_80 unchanged (the emulation header includes mma.h, cuda_bf16.h and
// cuda_pipeline.h under nvcc).
using namespace nvcuda;

// out[i] = TF32 rounding of in[i]; bf[i] = the bf16 bits of in[i] (round to nearest even).
extern "C" __global__ void round_tf32_bf16(const float* in, float* out, unsigned short* bf, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = wmma::__float_to_tf32(in[i]);
    bf[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  }
}

// C[M][N] = A[M][K]·B[K][N] (row-major, lda = K + padA, ldb = N + padB, ldc = N + padC, all
// multiples of 4 so the tiles stay legal) on TF32 tensor cores: one warp per 16x16 output tile,
// tiles staged through shared memory so odd M, N, K work; a NaN-poisoned C shows a missed tile.
// A and B are rounded to TF32 after loading (elementwise over x[], layout-free); with
// transpose_b the B tile is loaded col_major from a transposed copy in shared memory.
extern "C" __global__ void gemm_tf32(const float* A, const float* B, float* C, int M, int N, int K, int lda, int ldb,
                                     int ldc, int transpose_b) {
  __shared__ __align__(32) float As[4][16 * 8];
  __shared__ __align__(32) float Bs[4][8 * 16];
  __shared__ __align__(32) float Cs[4][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tilesN = (N + 15) / 16;
  const int tile = blockIdx.x * (blockDim.x / 32) + warp;
  const bool active = tile < ((M + 15) / 16) * tilesN;  // a warp-uniform test: whole warps skip
  const int m0 = active ? tile / tilesN * 16 : 0, n0 = active ? tile % tilesN * 16 : 0;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k0 = 0; k0 < K; k0 += 8) {
    for (int e = lane; e < 128; e += 32) {
      const int r = e / 8, c = e % 8;  // A tile 16x8
      As[warp][e] = m0 + r < M && k0 + c < K ? A[(m0 + r) * lda + k0 + c] : 0.0f;
      const int kr = e / 16, nc = e % 16;  // B tile 8x16, stored row-major or transposed
      const float bv = k0 + kr < K && n0 + nc < N ? B[(k0 + kr) * ldb + n0 + nc] : 0.0f;
      if (transpose_b)
        Bs[warp][nc * 8 + kr] = bv;
      else
        Bs[warp][e] = bv;
    }
    __syncwarp();
    if (active) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
      wmma::load_matrix_sync(a, As[warp], 8);
      for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);
      if (transpose_b) {
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b;
        wmma::load_matrix_sync(b, Bs[warp], 8);
        for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
        wmma::mma_sync(acc, a, b, acc);
      } else {
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b;
        wmma::load_matrix_sync(b, Bs[warp], 16);
        for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
        wmma::mma_sync(acc, a, b, acc);
      }
    }
    __syncwarp();
  }
  if (!active) return;
  wmma::store_matrix_sync(Cs[warp], acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    if (m0 + r < M && n0 + c < N) C[(m0 + r) * ldc + n0 + c] = Cs[warp][e];
  }
}

// The same on BF16 tensor cores (m16n16k16): A and B are converted to bf16 (round to nearest even)
// as they are staged; C is accumulated in fp32, starting from Cin (an accumulator load, col-major
// when cin_col_major), and stored col-major when c_col_major.
extern "C" __global__ void gemm_bf16(const float* A, const float* B, const float* Cin, float* C, int M, int N, int K,
                                     int cin_col_major, int c_col_major) {
  __shared__ __align__(32) __nv_bfloat16 As[16 * 16];
  __shared__ __align__(32) __nv_bfloat16 Bs[16 * 16];
  __shared__ __align__(32) float Cs[16 * 16];
  const int lane = threadIdx.x;
  const int tilesN = (N + 15) / 16;
  const int m0 = blockIdx.x / tilesN * 16, n0 = blockIdx.x % tilesN * 16;
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    const bool in = m0 + r < M && n0 + c < N;
    if (cin_col_major)
      Cs[c * 16 + r] = in ? Cin[(m0 + r) * N + n0 + c] : 0.0f;
    else
      Cs[e] = in ? Cin[(m0 + r) * N + n0 + c] : 0.0f;
  }
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, Cs, 16, cin_col_major ? wmma::mem_col_major : wmma::mem_row_major);
  for (int k0 = 0; k0 < K; k0 += 16) {
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = e % 16;
      As[e] = __float2bfloat16_rn(m0 + r < M && k0 + c < K ? A[(m0 + r) * K + k0 + c] : 0.0f);
      Bs[e] = __float2bfloat16_rn(k0 + r < K && n0 + c < N ? B[(k0 + r) * N + n0 + c] : 0.0f);
    }
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
    wmma::load_matrix_sync(a, As, 16);
    wmma::load_matrix_sync(b, Bs, 16);
    wmma::mma_sync(acc, a, b, acc);
  }
  __syncwarp();
  wmma::store_matrix_sync(Cs, acc, 16, c_col_major ? wmma::mem_col_major : wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    if (m0 + r < M && n0 + c < N) C[(m0 + r) * N + n0 + c] = c_col_major ? Cs[c * 16 + r] : Cs[e];
  }
}

// Scales an accumulator elementwise (layout-free) and stores it: out = 2 * in (a 16x16 tile).
extern "C" __global__ void frag_scale(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
  wmma::load_matrix_sync(f, in, 16, wmma::mem_row_major);
  for (int i = 0; i < f.num_elements; i++) f.x[i] *= 2.0f;
  wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

// Depends on the fragment layout (element 0 of lane 0 is not any particular tile element):
// the race-mode orders, which permute the layout, must change its result.
extern "C" __global__ void frag_layout_dependent(const float* in, float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
  wmma::load_matrix_sync(f, in, 16, wmma::mem_row_major);
  if (threadIdx.x == 0) f.x[0] = -1.0f;  // "the top-left element": wrong on any layout but one
  wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

// Misuses, each of which must fail the launch: a misaligned pointer, an ldm that is not a multiple
// of 16 bytes, and an mma_sync with a lane missing.
extern "C" __global__ void wmma_misaligned(const float* in, float* out, int offset, int ldm, int exit_lane) {
  if ((int)threadIdx.x == exit_lane) return;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
  wmma::load_matrix_sync(f, in + offset, ldm, wmma::mem_row_major);
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b;
  wmma::fill_fragment(a, 1.0f);
  wmma::fill_fragment(b, 1.0f);
  wmma::mma_sync(f, a, b, f);
  wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
}

// Double-buffered copy through shared memory with cp.async: stage s+1 is fetched while stage s
// is read. out[i] = 3 * in[i] over n floats (n a multiple of 4), 16-byte copies, the last copy
// of a block's tail zero-filled past n (read back as zeros: checked through out_tail).
extern "C" __global__ void cp_async_pipeline(const float* in, float* out, int n, float* out_tail) {
  __shared__ __align__(16) float stage[2][256 * 4];
  const int t = threadIdx.x, chunk = 256 * 4;
  const int chunks = (n + chunk - 1) / chunk;
  auto issue = [&](int c) {
    const int at = c * chunk + t * 4;
    const int valid = n - at;  // floats of this thread's 4 that exist
    if (valid >= 4) {
      __pipeline_memcpy_async(&stage[c % 2][t * 4], &in[at], 16);
    } else {
      // a partial copy: read only what exists (at least the first float, so the source stays
      // inside the array), zero-fill the rest
      const int keep = valid > 0 ? valid : 0;
      __pipeline_memcpy_async(&stage[c % 2][t * 4], &in[keep > 0 ? at : 0], 16, (size_t)(4 - keep) * 4);
    }
    __pipeline_commit();
  };
  issue(0);
  for (int c = 0; c < chunks; c++) {
    if (c + 1 < chunks) {
      issue(c + 1);
      __pipeline_wait_prior(1);  // stage c is complete, c+1 may still be in flight
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    for (int j = 0; j < 4; j++) {
      const int at = c * chunk + t * 4 + j;
      if (at < n) out[at] = 3.0f * stage[c % 2][t * 4 + j];
      else if (at < chunks * chunk) out_tail[at - n] = stage[c % 2][t * 4 + j];
    }
    __syncthreads();
  }
}

// Reads the destination before waiting: sees the poisoned (0xFF) shared memory, not the data.
extern "C" __global__ void cp_async_read_early(const float* in, float* out) {
  CNNC_DYNAMIC_SHARED(float, s);
  __pipeline_memcpy_async(&s[threadIdx.x], &in[threadIdx.x], 4);
  __pipeline_commit();
  out[threadIdx.x] = s[threadIdx.x];  // too early
  __pipeline_wait_prior(0);
  out[blockDim.x + threadIdx.x] = s[threadIdx.x];
}

// Misuses: a misaligned 16-byte copy, a destination in global memory, exiting with a copy in flight.
extern "C" __global__ void cp_async_misuse(const float* in, float* out, int which) {
  __shared__ __align__(16) float s[64];
  if (which == 0) __pipeline_memcpy_async(&s[1], &in[0], 16);
  if (which == 1) __pipeline_memcpy_async(&out[0], &in[0], 4);
  if (which == 2) {
    __pipeline_memcpy_async(&s[0], &in[0], 4);
    __pipeline_commit();
  }
  __pipeline_wait_prior(which == 2 ? 1 : 0);
  out[threadIdx.x] = s[0];
}
