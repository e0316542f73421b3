// The header without Go: g++ -x c++ -std=c++20 -include cuda_emu.h standalone.cu && ./a.out
extern "C" __global__ void block_sum(const int* in, int* out) {
  __shared__ int partial[32];
  int t = threadIdx.x, v = in[blockIdx.x * blockDim.x + t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (t % 32 == 0) partial[t / 32] = v;
  __syncthreads();
  if (t == 0) {
    int s = 0;
    for (int w = 0; w < (int)blockDim.x / 32; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

extern "C" __global__ void traps(int at) {
  if ((int)threadIdx.x == at) __trap();
}

int main() {
  const int blocks = 40, threads = 256;
  static int in[blocks * threads], out[blocks];
  for (int i = 0; i < blocks * threads; ++i) in[i] = i % 7;
  if (cnnc_emu::launch<block_sum>(dim3(blocks), dim3(threads), 0, (const int*)in, out) != 0) return 1;
  for (int b = 0; b < blocks; ++b) {
    int want = 0;
    for (int i = 0; i < threads; ++i) want += in[b * threads + i];
    if (out[b] != want) {
      printf("block %d: %d, want %d\n", b, out[b], want);
      return 1;
    }
  }
  printf("block_sum ok\n");
  int rc = cnnc_emu::launch<traps>(dim3(2), dim3(64), 0, 9);  // prints the reason on stderr
  printf("traps rc=%d\n", rc);
  return 0;
}
