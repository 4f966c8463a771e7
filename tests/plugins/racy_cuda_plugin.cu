// A CUDA plug-in (ABI 2) with a race no single call shows: `add` written through a staging buffer
// in static device memory, shared by every call in the process. One call at a time it is exact;
// two calls in flight on different streams overwrite each other's staged sums. `divlab check
// --backend cuda` must fail it under "concurrent load" only (tests/gpu/test_gpu_cli.cpp).
#include <cuda_runtime.h>

#include "kernels/plugin_abi.h"

namespace {

constexpr int64_t kStageValues = int64_t(1) << 21;
__device__ float g_stage[kStageValues];

__global__ void stage_sum(const float* a, const float* b, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) g_stage[i] = a[i] + b[i];
}
__global__ void copy_out(float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = g_stage[i];
}
__global__ void add_direct(float* y, const float* a, const float* b, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

void add_staged(const divlab_op_context* ctx, float* y, const float* a, const float* b, int64_t n) {
  const auto stream = static_cast<cudaStream_t>(ctx->stream);
  const unsigned blocks = unsigned((n + 255) / 256);
  if (n > kStageValues) {
    add_direct<<<blocks, 256, 0, stream>>>(y, a, b, n);
    return;
  }
  stage_sum<<<blocks, 256, 0, stream>>>(a, b, n);
  copy_out<<<blocks, 256, 0, stream>>>(y, n);
}

const divlab_variant2 kVariants[] = {
    {"add", "racy_staging", "cuda", DIVLAB_FP32, 0, reinterpret_cast<void (*)(void)>(&add_staged),
     "y = a + b through a staging buffer in static device memory",
     "every call shares the staging buffer: concurrent calls overwrite each other's sums",
     "two calls in flight at once (several streams, several models in one process)",
     "one stream, one call at a time"},
};
const divlab_plugin2 kPlugin = {DIVLAB_PLUGIN_ABI2_VERSION, 1, kVariants};

}  // namespace

const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin;
}
