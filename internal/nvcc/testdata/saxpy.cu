// A toolchain smoke test: a trivial kernel that must compile for every target.
extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
