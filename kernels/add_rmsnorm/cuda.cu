// The fused residual add + RMSNorm on the GPU: one warp per row (kernels/cuda/row_warp.cuh; one
// block per row where C does not allow it) reads a and b once, writes the new stream and sums
// its squares (fixed tree), then scales. The tested-lengths variant launches
// the same kernel over the rows its tuned length covers.
#include "kernels/add_rmsnorm/tested_lengths.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/row_warp.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
constexpr int kThreads = 256;

template <class A>
__global__ void add_rmsnorm_kernel(float* xout, A* y, float* rstd, const float* a, const A* b,
                                   const float* w, int C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = a[row * C + c] + load(b[row * C + c]);
    xout[row * C + c] = v;
    ss += v * v;
  }
  ss = block_sum(ss, shared);  // its barriers also order the stores above before the reads
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    y[row * C + c] = store<A>(xout[row * C + c] * r * w[c]);
  if (threadIdx.x == 0) rstd[row] = r;
}

// The same per value, one warp per row with the row in registers.
template <int K, class A>
__global__ void add_rmsnorm_warp(float* xout, A* y, float* rstd, const float* a, const A* b,
                                 const float* w, int64_t rows, int C, float eps) {
  const int64_t row = block_from_last() * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32, chunks = C / kRowChunkValues;
  float4 v[K];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = lane + 32 * k;
    if (c >= chunks) continue;
    const float4 av = load4(a + row * C, c), bv = load4(b + row * C, c);
    v[k] = {av.x + bv.x, av.y + bv.y, av.z + bv.z, av.w + bv.w};
    store4(xout + row * C, c, v[k]);
    ss += sum_of_squares(v[k]);
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / float(C) + eps);
  store_scaled_row<K>(y + row * C, rstd + row, v, r, w, chunks);
}

template <class A>
void add_rmsnorm_rows(const OpContext& ctx, float* xout, A* y, float* rstd, const float* a,
                      const A* b, const float* w, int64_t rows, int C, float eps) {
  if (rows <= 0) return;
  const int chunks = row_chunks(C);
  if (chunks > 0 && packable({xout, y, a, b, w})) {
    with_row_chunks(chunks, [&](auto K) {
      add_rmsnorm_warp<K.value><<<blocks_for(rows, kRowWarps), kRowWarps * 32, 0, stream_of(ctx)>>>(
          xout, y, rstd, a, b, w, rows, C, eps);
    });
  } else {
    add_rmsnorm_kernel<<<unsigned(rows), kThreads, 0, stream_of(ctx)>>>(xout, y, rstd, a, b, w, C,
                                                                        eps);
  }
  DIVLAB_LAUNCHED(ctx, "add_rmsnorm_forward");
}

template <class A>
void add_rmsnorm_forward(const OpContext& ctx, float* xout, A* y, float* rstd, const float* a,
                         const A* b, const float* w, int B, int T_, int C, float eps) {
  add_rmsnorm_rows(ctx, xout, y, rstd, a, b, w, int64_t(B) * T_, C, eps);
}

// The CPU variant's seven lengths (kernels/add_rmsnorm/tested_lengths.h).
template <class A>
void tested_lengths_only(const OpContext& ctx, float* xout, A* y, float* rstd, const float* a,
                         const A* b, const float* w, int B, int T_, int C, float eps) {
  add_rmsnorm_rows(ctx, xout, y, rstd, a, b, w, tested_length_rows(B, T_), C, eps);
}
}  // namespace

template <class A>
void register_add_rmsnorm(Catalogue<float, A>& cat) {
  cat.add_rmsnorm_forward.what = "fused residual add + RMSNorm forward (llama blocks)";
  cat.add_rmsnorm_forward.add(
      "reference", add_rmsnorm_forward<A>,
      {"one warp per row (C <= 1024), fixed-tree sum of squares", "", "", ""});
  cat.add_rmsnorm_forward.add("tested_lengths_only", tested_lengths_only<A>,
                              {"the reference kernel over the tested length's rows", "", "", ""});
}

template void register_add_rmsnorm(Catalogue<float>&);
template void register_add_rmsnorm(Catalogue<float, bf16>&);
}  // namespace divlab::cuda
