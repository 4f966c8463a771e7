// RMSNorm on the GPU: one warp per row with the row in registers (kernels/cuda/row_warp.cuh)
// where C allows, else one block per row; the weight gradient through fixed-order column sums.
#include <cuda_bf16.h>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/row_warp.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
constexpr int kRowThreads = 256;

enum class Rstd { Reference, EpsOutsideSqrt, NoEps };

template <Rstd mode>
__device__ inline float rstd_of(float mean_square, float eps) {
  if (mode == Rstd::EpsOutsideSqrt) return 1.0f / (sqrtf(mean_square) + eps);
  if (mode == Rstd::NoEps) return 1.0f / sqrtf(mean_square);
  return 1.0f / sqrtf(mean_square + eps);
}

template <Rstd mode, class A>
__global__ void rmsnorm_forward_kernel(A* y, float* rstd, const float* x, const float* w, int C,
                                       float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  float ss = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, shared);
  const float r = rstd_of<mode>(ss / float(C), eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) y[row * C + c] = store<A>(xr[c] * r * w[c]);
  if (threadIdx.x == 0) rstd[row] = r;
}

// The same per value (y = (x r) w), one warp per row.
template <Rstd mode, int K, class A>
__global__ void rmsnorm_forward_warp(A* y, float* rstd, const float* x, const float* w, int N,
                                     int C, float eps) {
  const int64_t row = block_from_last() * kRowWarps + threadIdx.x / 32;
  if (row >= N) return;
  const int lane = threadIdx.x % 32, chunks = C / kRowChunkValues;
  const float* xr = x + row * C;
  float4 v[K];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = lane + 32 * k;
    v[k] = c < chunks ? load4(xr, c) : float4{0, 0, 0, 0};
    ss += sum_of_squares(v[k]);
  }
  const float r = rstd_of<mode>(warp_sum(ss) / float(C), eps);
  store_scaled_row<K>(y + row * C, rstd + row, v, r, w, chunks);
}

template <Rstd mode, class A>
void rmsnorm_forward(const OpContext& ctx, A* y, float* rstd, const float* x, const float* w, int N,
                     int C, float eps) {
  const int chunks = row_chunks(C);
  if (chunks > 0 && packable({y, x, w})) {
    with_row_chunks(chunks, [&](auto K) {
      rmsnorm_forward_warp<mode, K.value>
          <<<blocks_for(N, kRowWarps), kRowWarps * 32, 0, stream_of(ctx)>>>(y, rstd, x, w, N, C,
                                                                            eps);
    });
  } else {
    rmsnorm_forward_kernel<mode><<<N, kRowThreads, 0, stream_of(ctx)>>>(y, rstd, x, w, C, eps);
  }
  DIVLAB_LAUNCHED(ctx, "rmsnorm_forward");
}

template <class A>
__global__ void rmsnorm_backward_rows_kernel(float* dx, float* prod, const A* dy, const float* x,
                                             const float* w, const float* rstd, int C,
                                             const float* base) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float r = rstd[row];
  float dot = 0;  // sum_c dy w x
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += load(dy[row * C + c]) * w[c] * x[row * C + c];
  dot = block_sum(dot, shared);
  const float k = r * r * r * dot / float(C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t i = row * C + c;
    const float d = load(dy[i]);
    const float g = r * w[c] * d - x[i] * k;
    dx[i] = base[i] + g;
    prod[i] = d * x[i] * r;
  }
}

// The rows of the backward, one warp per row: dx = base + g as above, every value of the row
// read in one round trip (x, dy and base together). The block's kRowWarps rows each leave their
// dw products (dy x r) in shared memory, and the block sums them over its rows in row order into
// one row of `partial` [ceil(N / kRowWarps), C] instead of an [N, C] product. (Each warp used to
// walk eight rows in turn, summing in the same row order: at 8 192 rows that left 8 warps on an SM,
// each waiting on two dependent loads a row.)
//
// With `copy` (the reference pair with the cast, ReferencePairs::NormBackwardCast), each new dx
// value is also written rounded to bf16 there, as the cast would write it.
template <int K, class A>
__global__ void rmsnorm_backward_warp(float* dx, float* partial, const A* dy, const float* x,
                                      const float* w, const float* rstd, int N, int C, bf16* copy,
                                      const float* base) {
  extern __shared__ float4 products[];  // [kRowWarps][C / 4]
  const int64_t block = block_from_last(), first = block * kRowWarps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, chunks = C / kRowChunkValues;
  const int64_t row = first + warp;
  if (row < N) {
    float4 xv[K], dv[K], bv[K];
    float dot = 0;  // sum_c dy w x
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = lane + 32 * k;
      const bool in = c < chunks;
      xv[k] = in ? load4(x + row * C, c) : float4{0, 0, 0, 0};
      dv[k] = in ? load4(dy + row * C, c) : float4{0, 0, 0, 0};
      bv[k] = in ? load4(base + row * C, c) : float4{0, 0, 0, 0};
      const float4 wk = in ? load4(w, c) : float4{0, 0, 0, 0};
      dot += dv[k].x * wk.x * xv[k].x + dv[k].y * wk.y * xv[k].y + dv[k].z * wk.z * xv[k].z +
             dv[k].w * wk.w * xv[k].w;
    }
    const float r = rstd[row];
    const float scale = r * r * r * warp_sum(dot) / float(C);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = lane + 32 * k;
      if (c >= chunks) continue;
      const float4 wk = load4(w, c);
      const auto grad = [&](float d, float wc, float xc) { return r * wc * d - xc * scale; };
      const float4 out = {
          bv[k].x + grad(dv[k].x, wk.x, xv[k].x), bv[k].y + grad(dv[k].y, wk.y, xv[k].y),
          bv[k].z + grad(dv[k].z, wk.z, xv[k].z), bv[k].w + grad(dv[k].w, wk.w, xv[k].w)};
      store4(dx + row * C, c, out);
      if (copy) store4(copy + row * C, c, out);
      products[warp * chunks + c] = {dv[k].x * xv[k].x * r, dv[k].y * xv[k].y * r,
                                     dv[k].z * xv[k].z * r, dv[k].w * xv[k].w * r};
    }
  }
  __syncthreads();
  const int rows = int(N - first < kRowWarps ? N - first : kRowWarps);
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    float4 acc = {0, 0, 0, 0};
    for (int j = 0; j < rows; ++j) {
      const float4 p = products[j * chunks + c];
      acc.x += p.x, acc.y += p.y, acc.z += p.z, acc.w += p.w;
    }
    store4(partial + block * C, c, acc);
  }
}

// Returns false, launching nothing, where the warp form does not apply.
template <class A>
bool rmsnorm_backward_by_warps(const OpContext& ctx, float* out, const float* base, float* dw,
                               const A* dy, const float* x, const float* w, const float* rstd,
                               int N, int C, bf16* copy) {
  const int chunks = row_chunks(C);
  if (chunks == 0 || !packable({out, base, dy, x, w, copy})) return false;
  const unsigned blocks = blocks_for(N, kRowWarps);
  float* partial = scratch_as<float>(ctx, Scratch::A, size_t(blocks) * C);
  const size_t shared = sizeof(float) * size_t(kRowWarps) * C;  // <= 32 KiB: C <= 1024
  with_row_chunks(chunks, [&](auto K) {
    rmsnorm_backward_warp<K.value><<<blocks, kRowWarps * 32, shared, stream_of(ctx)>>>(
        out, partial, dy, x, w, rstd, N, C, copy, base);
  });
  DIVLAB_LAUNCHED(ctx, "rmsnorm_backward");
  column_sums_add(ctx, dw, partial, int(blocks), C);
  return true;
}

template <class A>
void rmsnorm_backward_rows(const OpContext& ctx, float* out, float* prod, const A* dy,
                           const float* x, const float* w, const float* rstd, int N, int C,
                           const float* base) {
  rmsnorm_backward_rows_kernel<<<N, kRowThreads, 0, stream_of(ctx)>>>(out, prod, dy, x, w, rstd, C,
                                                                      base);
  DIVLAB_LAUNCHED(ctx, "rmsnorm_backward_rows");
}

template <class A>
void rmsnorm_backward(const OpContext& ctx, float* dresid, float* dw, const A* dy, const float* x,
                      const float* w, const float* rstd, int N, int C) {
  rmsnorm_backward_onto(ctx, dresid, dresid, dw, dy, x, w, rstd, N, C);
}

// dw reduced over rows in a bf16 accumulator, one thread per channel in row order (the GPU form
// of the CPU variant: a weight-gradient reduction kept in the parameter dtype).
__global__ void bf16_column_sum_kernel(float* dw, const float* prod, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  __nv_bfloat16 acc = __float2bfloat16_rn(dw[c]);
  for (int n = 0; n < N; ++n)
    acc = __float2bfloat16_rn(__bfloat162float(acc) + prod[int64_t(n) * C + c]);
  dw[c] = __bfloat162float(acc);
}

template <class A>
void bf16_reduce(const OpContext& ctx, float* dresid, float* dw, const A* dy, const float* x,
                 const float* w, const float* rstd, int N, int C) {
  float* prod = scratch_as<float>(ctx, Scratch::A, size_t(N) * C);
  rmsnorm_backward_rows(ctx, dresid, prod, dy, x, w, rstd, N, C, dresid);
  bf16_column_sum_kernel<<<blocks_for(C, 128), 128, 0, stream_of(ctx)>>>(dw, prod, N, C);
  DIVLAB_LAUNCHED(ctx, "bf16_column_sum");
}
}  // namespace

// The reference pair of the backward and the cast of its dresid to bf16 (bf16 mode): one kernel
// where the warp form applies, else the two references.
void rmsnorm_backward_and_cast(const OpContext& ctx, float* dresid, float* dw, const bf16* dy,
                               const float* x, const float* w, const float* rstd, int N, int C,
                               bf16* copy) {
  if (rmsnorm_backward_by_warps(ctx, dresid, dresid, dw, dy, x, w, rstd, N, C, copy)) return;
  rmsnorm_backward(ctx, dresid, dw, dy, x, w, rstd, N, C);
  round_to_bf16(ctx.stream, copy, dresid, int64_t(N) * C);
}

template <class A>
void rmsnorm_backward_onto(const OpContext& ctx, float* out, const float* base, float* dw,
                           const A* dy, const float* x, const float* w, const float* rstd, int N,
                           int C) {
  if (rmsnorm_backward_by_warps(ctx, out, base, dw, dy, x, w, rstd, N, C, nullptr)) return;
  float* prod = scratch_as<float>(ctx, Scratch::A, size_t(N) * C);
  rmsnorm_backward_rows(ctx, out, prod, dy, x, w, rstd, N, C, base);
  column_sums_add(ctx, dw, prod, N, C);
}

template void rmsnorm_backward_onto(const OpContext&, float*, const float*, float*, const float*,
                                    const float*, const float*, const float*, int, int);
template void rmsnorm_backward_onto(const OpContext&, float*, const float*, float*, const bf16*,
                                    const float*, const float*, const float*, int, int);

template <class A>
void register_rmsnorm(Catalogue<float, A>& cat) {
  cat.rmsnorm_forward.what = "RMSNorm forward, y = x * rsqrt(mean(x^2) + eps) * w";
  cat.rmsnorm_forward.add("reference", rmsnorm_forward<Rstd::Reference, A>,
                          {"one warp per row (C <= 1024), fixed-tree sum of squares", "", "", ""});
  cat.rmsnorm_forward.add("eps_outside_sqrt", rmsnorm_forward<Rstd::EpsOutsideSqrt, A>,
                          {"rstd = 1 / (sqrt(mean(x^2)) + eps)", "", "", ""});
  cat.rmsnorm_forward.add("no_eps", rmsnorm_forward<Rstd::NoEps, A>,
                          {"rstd = 1 / sqrt(mean(x^2))", "", "", ""});
  cat.rmsnorm_backward.what = "RMSNorm backward (input and weight gradients)";
  cat.rmsnorm_backward.add(
      "reference", rmsnorm_backward<A>,
      {"one warp per row; dw summed per 8 rows, then by fixed-order column sums", "", "", ""});
  cat.rmsnorm_backward.add(
      "bf16_reduce", bf16_reduce<A>,
      {"dw summed over rows in a bf16 accumulator, one thread per channel", "", "", ""});
}

template void register_rmsnorm(Catalogue<float>&);
template void register_rmsnorm(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
