// Optimizer kernels on the GPU: elementwise updates in the CPU reference's exact arithmetic
// order (bias corrections computed on the host, as the CPU does), and a deterministic
// sum of squares: fixed grid, per-block double sums, then one block adding them in order.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
// sum_squares's grid is a function of n alone (at least 16 values per thread, at most 1024
// blocks), so its partial sums, and their order, are the same on every device and run.
constexpr int kSumThreads = 256, kMaxSumBlocks = 1024, kSumValuesPerThread = 16;

__host__ __device__ int sum_blocks(int64_t n) {
  const int64_t per_block = int64_t(kSumThreads) * kSumValuesPerThread;
  const int64_t want = (n + per_block - 1) / per_block;
  return int(want < 1 ? 1 : want > kMaxSumBlocks ? kMaxSumBlocks : want);
}

// Block `block` of `blocks` over g[0, n): each thread sums the squares of a grid-strided set of
// 4-value chunks (16-byte loads, four in flight), then the tail; in double, so the order inside
// a block barely matters for the value. Returns the block's sum to thread 0.
__device__ double sum_squares_block(const float* g, int64_t n, bool aligned, int blocks, int block,
                                    double* shared) {
  const int64_t stride = int64_t(blocks) * blockDim.x;
  const int64_t first = int64_t(block) * blockDim.x + threadIdx.x;
  const int64_t chunks = aligned ? n / 4 : 0;
  const auto* g4 = reinterpret_cast<const float4*>(g);
  double s = 0;
#pragma unroll 4
  for (int64_t i = first; i < chunks; i += stride) {
    const float4 v = g4[i];
    s += double(v.x) * double(v.x) + double(v.y) * double(v.y) + double(v.z) * double(v.z) +
         double(v.w) * double(v.w);
  }
  for (int64_t i = chunks * 4 + first; i < n; i += stride) s += double(g[i]) * double(g[i]);
  return block_sum(s, shared);
}
// The blocks' sums in block order, by one block.
__device__ double sum_in_order(const double* partial, int n, double* shared) {
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  return block_sum(s, shared);
}

__global__ void sum_squares_partial(double* partial, const float* g, int64_t n, bool aligned) {
  __shared__ double shared[32];
  const double s = sum_squares_block(g, n, aligned, int(gridDim.x), int(blockIdx.x), shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials(double* out, const double* partial, int n) {
  __shared__ double shared[32];
  const double s = sum_in_order(partial, n, shared);
  if (threadIdx.x == 0) *out = s;
}

void sum_squares(const OpContext& ctx, double* out, const float* g, int64_t n) {
  const int blocks = sum_blocks(n);
  double* partial = scratch_as<double>(ctx, Scratch::Reduce, blocks);
  sum_squares_partial<<<blocks, kSumThreads, 0, stream_of(ctx)>>>(partial, g, n, packable({g}));
  DIVLAB_LAUNCHED(ctx, "sum_squares_partial");
  sum_partials<<<1, kSumThreads, 0, stream_of(ctx)>>>(out, partial, blocks);
  DIVLAB_LAUNCHED(ctx, "sum_partials");
}

// sum_squares over many spans of one buffer in three launches (ReferencePairs::SumSquaresSpans):
// each span gets the blocks, the partial sums and the order a call of its own gives it, so the
// same bits. spans[2i], spans[2i + 1]: span i's offset and size (device memory). One thread
// first writes each span's first block (the prefix sums of their block counts); a block then
// finds its span by binary search. Each block walking the spans' sizes itself (dependent loads,
// up to 76 at GPT-2 small) was slow (the times: docs/performance.md).
__global__ void span_first_blocks(int* first, const int64_t* spans, int count) {
  int start = 0;
  for (int i = 0; i < count; ++i) first[i] = start, start += sum_blocks(spans[2 * i + 1]);
  first[count] = start;
}
__global__ void sum_squares_spans_partial(double* partial, const float* base, const int64_t* spans,
                                          const int* first, int count) {
  __shared__ double shared[32];
  const int block = int(blockIdx.x);
  int lo = 0, hi = count;  // the span lo with first[lo] <= block < first[lo + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (first[mid] <= block ? lo : hi) = mid;
  }
  const float* g = base + spans[2 * lo];
  const int64_t n = spans[2 * lo + 1];
  const bool aligned = reinterpret_cast<uintptr_t>(g) % 16 == 0;
  const double s = sum_squares_block(g, n, aligned, sum_blocks(n), block - first[lo], shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials_spans(double* out, const double* partial, const int* first) {
  __shared__ double shared[32];
  const int i = int(blockIdx.x);
  const double s = sum_in_order(partial + first[i], first[i + 1] - first[i], shared);
  if (threadIdx.x == 0) out[i] = s;
}
}  // namespace

void sum_squares_spans(const OpContext& ctx, double* out, const float* base,
                       const int64_t* device_spans, const int64_t* host_spans, int count) {
  if (count <= 0) return;
  int blocks = 0;
  for (int i = 0; i < count; ++i) blocks += sum_blocks(host_spans[2 * i + 1]);
  // The partial sums, then the spans' first blocks, in one region.
  auto* partial = static_cast<double*>(
      scratch(ctx, Scratch::Reduce, sizeof(double) * size_t(blocks) + sizeof(int) * (count + 1)));
  int* first = reinterpret_cast<int*>(partial + blocks);
  span_first_blocks<<<1, 1, 0, stream_of(ctx)>>>(first, device_spans, count);
  DIVLAB_LAUNCHED(ctx, "span_first_blocks");
  sum_squares_spans_partial<<<blocks, kSumThreads, 0, stream_of(ctx)>>>(partial, base, device_spans,
                                                                        first, count);
  DIVLAB_LAUNCHED(ctx, "sum_squares_spans_partial");
  sum_partials_spans<<<count, kSumThreads, 0, stream_of(ctx)>>>(out, partial, first);
  DIVLAB_LAUNCHED(ctx, "sum_partials_spans");
}

namespace {
// The updates, one value at a time in PyTorch's order; the kernels below apply them to packs of
// 8 values (two 16-byte accesses per tensor) where every pointer is aligned, else value by value:
// the same arithmetic either way.
struct Sgd {
  float lr, momentum, weight_decay, grad_scale;
  bool nesterov;
  __device__ void operator()(float& p, float& buf, float g) const {
    float d = __fadd_rn(__fmul_rn(g, grad_scale), __fmul_rn(weight_decay, p));
    if (momentum != 0.0f) {
      buf = __fadd_rn(__fmul_rn(momentum, buf), d);
      d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, buf)) : buf;
    }
    p = __fsub_rn(p, __fmul_rn(lr, d));
  }
};
struct AdamW {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, c1, c2;
  __device__ void operator()(float& p, float& m, float& v, float g) const {
    const float gi = g * grad_scale;
    p *= 1.0f - lr * weight_decay;
    m = beta1 * m + (1.0f - beta1) * gi;
    v = beta2 * v + (1.0f - beta2) * gi * gi;
    p -= lr * (m / c1) / (sqrtf(v / c2) + eps);
  }
};

// SGD without momentum never reads or writes its buffer. With `copy` (the reference pair with
// the weights' cast, ReferencePairs::SgdCast), each updated value is also written rounded to
// bf16 there, as the cast would write it.
__global__ void sgd_values(Sgd f, float* p, float* buf, const float* g, int64_t n, bf16* copy) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float b = f.momentum != 0.0f ? buf[i] : 0.0f;
  f(p[i], b, g[i]);
  if (f.momentum != 0.0f) buf[i] = b;
  if (copy) copy[i] = store<bf16>(p[i]);
}
__global__ void sgd_packs(Sgd f, float* p, float* buf, const float* g, int64_t packs, bf16* copy) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= packs) return;
  Pack<float> pv = load_pack(p, i), bv{};
  const Pack<float> gv = load_pack(g, i);
  if (f.momentum != 0.0f) bv = load_pack(buf, i);
#pragma unroll
  for (int k = 0; k < kPack; ++k) f(pv.v[k], bv.v[k], gv.v[k]);
  store_pack(p, i, pv);
  if (f.momentum != 0.0f) store_pack(buf, i, bv);
  if (!copy) return;
  Pack<bf16> cv;
#pragma unroll
  for (int k = 0; k < kPack; ++k) cv.v[k] = store<bf16>(pv.v[k]);
  store_pack(copy, i, cv);
}

__global__ void adamw_values(AdamW f, float* p, float* m, float* v, const float* g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(p[i], m[i], v[i], g[i]);
}
__global__ void adamw_packs(AdamW f, float* p, float* m, float* v, const float* g, int64_t packs) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= packs) return;
  Pack<float> pv = load_pack(p, i), mv = load_pack(m, i), vv = load_pack(v, i);
  const Pack<float> gv = load_pack(g, i);
#pragma unroll
  for (int k = 0; k < kPack; ++k) f(pv.v[k], mv.v[k], vv.v[k], gv.v[k]);
  store_pack(p, i, pv), store_pack(m, i, mv), store_pack(v, i, vv);
}

void sgd_step(const OpContext& ctx, float* p, float* buf, const float* g, int64_t n, float lr,
              float momentum, bool nesterov, float weight_decay, float grad_scale) {
  sgd_step_and_cast(ctx, p, buf, g, n, lr, momentum, nesterov, weight_decay, grad_scale, nullptr);
}

void adamw_step(const OpContext& ctx, float* p, float* m, float* v, const float* g, int64_t n,
                float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                int64_t step) {
  if (n <= 0) return;
  const float c1 = 1.0f - std::pow(beta1, float(step));
  const float c2 = 1.0f - std::pow(beta2, float(step));
  const AdamW f{lr, beta1, beta2, eps, weight_decay, grad_scale, c1, c2};
  const int64_t packs = packable({p, m, v, g}) ? n / kPack : 0, done = packs * kPack;
  if (packs > 0)
    adamw_packs<<<blocks_for(packs, 256), 256, 0, stream_of(ctx)>>>(f, p, m, v, g, packs);
  if (done < n)
    adamw_values<<<blocks_for(n - done, 256), 256, 0, stream_of(ctx)>>>(
        f, p + done, m + done, v + done, g + done, n - done);
  DIVLAB_LAUNCHED(ctx, "adamw_step");
}
}  // namespace

void sgd_step_and_cast(const OpContext& ctx, float* p, float* buf, const float* g, int64_t n,
                       float lr, float momentum, bool nesterov, float weight_decay,
                       float grad_scale, bf16* copy) {
  if (n <= 0) return;
  const Sgd f{lr, momentum, weight_decay, grad_scale, nesterov};
  const int64_t packs = packable({p, buf, g, copy}) ? n / kPack : 0, done = packs * kPack;
  if (packs > 0)
    sgd_packs<<<blocks_for(packs, 256), 256, 0, stream_of(ctx)>>>(f, p, buf, g, packs, copy);
  if (done < n)
    sgd_values<<<blocks_for(n - done, 256), 256, 0, stream_of(ctx)>>>(
        f, p + done, buf + done, g + done, n - done, copy ? copy + done : nullptr);
  DIVLAB_LAUNCHED(ctx, "sgd_step");
}

template <class A>
void register_optimizer(Catalogue<float, A>& cat) {
  cat.sum_squares.what = "sum of squared gradients (global norm for clipping)";
  cat.sum_squares.add("reference", sum_squares,
                      {"fixed grid of double block sums, added in block order", "", "", ""});
  cat.sgd_step.what = "SGD update (momentum, optional Nesterov, coupled weight decay)";
  cat.sgd_step.add("reference", sgd_step, {"PyTorch semantics, 8 values per thread", "", "", ""});
  cat.adamw_step.what = "AdamW update (decoupled weight decay, bias-corrected moments)";
  cat.adamw_step.add("reference", adamw_step,
                     {"PyTorch semantics, 8 values per thread", "", "", ""});
}

template void register_optimizer(Catalogue<float>&);
template void register_optimizer(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
