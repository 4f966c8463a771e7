// Shadow mode's comparison on the GPU (DeviceComparison, kernels/shadow.h): the fp32 reference
// kernels, the bf16 widening, stream ordering, and the sums of one output's comparison, taken
// in fp64 in two passes with fixed orders (rows, then the rows folded by one block), so the
// same inputs give the same sums bit for bit.
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/shadow.h"

namespace divlab::cuda {

namespace {

constexpr int kRowSums = 4;  // per row: diff, ref, got, dot
constexpr int kRowWarpsPerBlock = 8;
constexpr int kFoldThreads = 256;

__device__ inline double widened(float x) {
  return x;
}
__device__ inline double widened(bf16 x) {
  return load(x);
}

// One warp per row: the row's four sums in fp64, the lanes' partial sums added in a fixed tree.
template <class V>
__global__ void row_sums_kernel(double* rows_out, const V* got, const float* ref, int64_t rows,
                                int64_t cols) {
  const int64_t row = int64_t(blockIdx.x) * kRowWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const V* g = got + row * cols;
  const float* r = ref + row * cols;
  double diff = 0, sref = 0, sgot = 0, dot = 0;
  for (int64_t c = lane; c < cols; c += 32) {
    const double a = widened(g[c]), b = r[c];
    diff += (a - b) * (a - b), sref += b * b, sgot += a * a, dot += a * b;
  }
  diff = warp_sum(diff), sref = warp_sum(sref), sgot = warp_sum(sgot), dot = warp_sum(dot);
  if (lane == 0) {
    double* o = rows_out + row * kRowSums;
    o[0] = diff, o[1] = sref, o[2] = sgot, o[3] = dot;
  }
}

// One block folds every row: each thread a contiguous run of rows in order, then the threads'
// partials in a fixed tree; the result is added into `sums` (ShadowSums).
__global__ void fold_rows_kernel(double* sums, const double* rows_in, int64_t rows, RowKey key,
                                 const int64_t* id_count, const TokenId* batch) {
  __shared__ double part[ShadowSums::Count][kFoldThreads];
  double mine[ShadowSums::Count];
  for (double& v : mine) v = 0;
  const int64_t per = (rows + kFoldThreads - 1) / kFoldThreads;
  const int64_t first = int64_t(threadIdx.x) * per;
  const int64_t last = first + per < rows ? first + per : rows;
  for (int64_t row = first; row < last; ++row) {
    const double* s = rows_in + row * kRowSums;
    const double diff = s[0], ref = s[1];
    mine[ShadowSums::Diff] += diff, mine[ShadowSums::Ref] += ref;
    mine[ShadowSums::Got] += s[2], mine[ShadowSums::Dot] += s[3];
    if (isnan(diff))
      mine[ShadowSums::NanRows] += 1;
    else if (ref > 0 || diff > 0)
      mine[ShadowSums::MaxRow] =
          fmax(mine[ShadowSums::MaxRow], ref > 0 ? sqrt(diff / ref) : INFINITY);
    const int b = row_bucket(key, row, id_count, batch);
    if (b >= 0) mine[ShadowSums::BucketDiff + b] += diff, mine[ShadowSums::BucketRef + b] += ref;
  }
  for (int i = 0; i < ShadowSums::Count; ++i) part[i][threadIdx.x] = mine[i];
  for (int half = kFoldThreads / 2; half > 0; half /= 2) {
    __syncthreads();
    if (threadIdx.x < half)
      for (int i = 0; i < ShadowSums::Count; ++i) {
        const double other = part[i][threadIdx.x + half];
        part[i][threadIdx.x] = i == ShadowSums::MaxRow ? fmax(part[i][threadIdx.x], other)
                                                       : part[i][threadIdx.x] + other;
      }
  }
  __syncthreads();
  if (threadIdx.x < ShadowSums::Count) {
    const int i = threadIdx.x;
    sums[i] = i == ShadowSums::MaxRow ? fmax(sums[i], part[i][0]) : sums[i] + part[i][0];
  }
}

void tally(const OpContext& ctx, double* sums, const void* got, Storage type, const float* ref,
           int64_t rows, int64_t cols, RowKey key, const int64_t* id_count, const TokenId* batch) {
  if (rows <= 0 || cols <= 0) return;
  auto* per_row = scratch_as<double>(ctx, Scratch::Shadow, size_t(rows) * kRowSums);
  const unsigned blocks = blocks_for(rows, kRowWarpsPerBlock);
  if (type == Storage::F32)
    row_sums_kernel<<<blocks, kRowWarpsPerBlock * 32, 0, stream_of(ctx)>>>(
        per_row, static_cast<const float*>(got), ref, rows, cols);
  else if (type == Storage::Bf16)
    row_sums_kernel<<<blocks, kRowWarpsPerBlock * 32, 0, stream_of(ctx)>>>(
        per_row, static_cast<const bf16*>(got), ref, rows, cols);
  else
    throw std::logic_error("shadow: a device comparison of fp64 outputs");
  DIVLAB_LAUNCHED(ctx, "shadow row sums");
  fold_rows_kernel<<<1, kFoldThreads, 0, stream_of(ctx)>>>(sums, per_row, rows, key, id_count,
                                                           batch);
  DIVLAB_LAUNCHED(ctx, "shadow fold rows");
}

void wait_for(void* waiting, void* stream) {
  cudaEvent_t e = nullptr;
  DIVLAB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, static_cast<cudaStream_t>(stream));
  const cudaError_t waited = recorded == cudaSuccess
                                 ? cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting), e, 0)
                                 : recorded;
  cudaEventDestroy(e);  // released once the wait has passed it
  DIVLAB_CUDA_CHECK(waited);
}

}  // namespace

const DeviceComparison& shadow_comparison() {
  static const KernelSet<float> reference = catalogue().select({});
  static const DeviceComparison c{
      &reference,
      widen_bf16,
      wait_for,
      check_fits,
      tally,
      "fp32_device: the GPU's fp32 reference kernels on the recorded inputs widened to fp32, "
      "compared on the GPU in fp64"};
  return c;
}

}  // namespace divlab::cuda
