#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
constexpr int kColumnChunks = 64;  // rows are split into this many chunks (fixed: determinism)

__global__ void column_partial_sums(float* partial, const float* in, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= cols) return;
  const int per = (rows + kColumnChunks - 1) / kColumnChunks;
  const int r0 = chunk * per, r1 = min(rows, r0 + per);
  float s = 0;
  for (int r = r0; r < r1; ++r) s += in[int64_t(r) * cols + c];
  partial[int64_t(chunk) * cols + c] = s;
}

__global__ void column_add_partials(float* out, const float* partial, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (int k = 0; k < kColumnChunks; ++k) s += partial[int64_t(k) * cols + c];
  out[c] += s;
}
}  // namespace

void column_sums_add(const OpContext& ctx, float* out, const float* in, int rows, int cols) {
  float* partial = scratch_as<float>(ctx, Scratch::Reduce, size_t(kColumnChunks) * cols);
  const dim3 grid(blocks_for(cols, 128), kColumnChunks);
  column_partial_sums<<<grid, 128, 0, stream_of(ctx)>>>(partial, in, rows, cols);
  DIVLAB_LAUNCHED(ctx, "column_partial_sums");
  column_add_partials<<<blocks_for(cols, 128), 128, 0, stream_of(ctx)>>>(out, partial, cols);
  DIVLAB_LAUNCHED(ctx, "column_add_partials");
}

}  // namespace divlab::cuda
