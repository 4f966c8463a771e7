// Fused softmax + cross-entropy on the GPU: one block per row, fixed-tree reductions. The row is
// read twice, not three times: the max and the sum of exponentials in one pass (online softmax:
// the running sum is rescaled when the running max grows, once per pack of 8 values), the
// gradient in the second; both in packs of 8 values per thread where the row allows (pack.cuh).
// GPT-2 small's 50 304-wide rows took 4.5 ms per step read three times, one bf16 value per load.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
// A running max m and the sum s of exp(z - m) over the values seen.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ void take(MaxSum& a, float z) {
  if (z > a.m) {
    a.s = a.s * expf(a.m - z) + 1.0f;
    a.m = z;
  } else {
    a.s += expf(z - a.m);
  }
}
// A pack at once: the max rescaled once, then the pack's exponentials summed in order.
__device__ __forceinline__ void take_pack(MaxSum& a, const float (&z)[kPack]) {
  float m = a.m;
#pragma unroll
  for (int k = 0; k < kPack; ++k) m = fmaxf(m, z[k]);
  if (m > a.m) a.s *= expf(a.m - m), a.m = m;
#pragma unroll
  for (int k = 0; k < kPack; ++k) a.s += expf(z[k] - m);
}
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MaxSum warp_merge(MaxSum a) {
  for (int off = 16; off > 0; off /= 2)
    a = merge(a, {__shfl_xor_sync(0xffffffffu, a.m, off), __shfl_xor_sync(0xffffffffu, a.s, off)});
  return a;
}
// Over the block (blockDim.x a multiple of 32); every thread gets the result.
__device__ MaxSum block_merge(MaxSum a, float* shared_m, float* shared_s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  a = warp_merge(a);
  if (lane == 0) shared_m[warp] = a.m, shared_s[warp] = a.s;
  __syncthreads();
  a = lane < warps ? MaxSum{shared_m[lane], shared_s[lane]} : MaxSum{-INFINITY, 0.0f};
  return warp_merge(a);
}

// 1024 threads, two blocks per SM: fewer rows in flight than with smaller blocks, so a row's
// second read finds more of it still in L2, with the gradient pass walking the row backwards from
// where the first pass ended and its reads and writes marked streaming (pack.cuh). GPT-2 small's
// 16 384 rows of 50 304 on an H100 (`divlab train --config configs/bench-gpt2-small.toml
// --profile`): 1670 us a step before, 1529 with the blocks and the order, 1412 with the hints
// too. CUDA's __expf in place of expf was a little faster still; not taken: the fp32 and bf16
// kernels would no longer give the same bits for the same values.
constexpr int kRowThreads = 1024;

template <bool subtract_max, class A>
__global__ void __launch_bounds__(kRowThreads, 2)
    cross_entropy_kernel(float* losses, A* dlogits, const A* logits, const TokenId* targets, int V,
                         float dloss, bool packed) {
  __shared__ float shared_m[32], shared_s[32];
  const int64_t row = blockIdx.x;
  const A* z = logits + row * V;
  const int packs = packed ? V / kPack : 0;
  MaxSum acc{subtract_max ? -INFINITY : 0.0f, 0.0f};
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<A> v = load_pack(z, p);
    float x[kPack];
#pragma unroll
    for (int k = 0; k < kPack; ++k) x[k] = load(v.v[k]);
    if constexpr (subtract_max) {
      take_pack(acc, x);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) acc.s += expf(x[k]);
    }
  }
  for (int v = packs * kPack + threadIdx.x; v < V; v += blockDim.x) {
    if constexpr (subtract_max)
      take(acc, load(z[v]));
    else
      acc.s += expf(load(z[v]));
  }
  if constexpr (subtract_max)
    acc = block_merge(acc, shared_m, shared_s);
  else
    acc.s = block_sum(acc.s, shared_s);
  const float lse = acc.m + logf(acc.s);
  const int target = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - load(z[target]);
  if (!dlogits) return;
  A* d = dlogits + row * V;
  auto grad = [&](float x, int v) {  // as the CPU reference
    return store<A>(expf(x - lse) * dloss - (v == target ? dloss : 0.0f));
  };
  for (int q = threadIdx.x; q < packs; q += blockDim.x) {
    const int p = packs - 1 - q;  // backwards: each value's gradient is its own, in any order
    const Pack<A> v = load_pack_last(z, p);
    Pack<A> o;
#pragma unroll
    for (int k = 0; k < kPack; ++k) o.v[k] = grad(load(v.v[k]), p * kPack + k);
    store_pack_streaming(d, p, o);
  }
  for (int v = packs * kPack + threadIdx.x; v < V; v += blockDim.x) d[v] = grad(load(z[v]), v);
}

template <bool subtract_max, class A>
void cross_entropy(const OpContext& ctx, float* losses, A* dlogits, const A* logits,
                   const TokenId* targets, int N, int V, float dloss) {
  // Packs need every row to start 16-byte aligned: V a multiple of 8 and aligned bases.
  const bool packed = V % kPack == 0 && packable({logits, dlogits});
  cross_entropy_kernel<subtract_max>
      <<<N, kRowThreads, 0, stream_of(ctx)>>>(losses, dlogits, logits, targets, V, dloss, packed);
  DIVLAB_LAUNCHED(ctx, "cross_entropy");
}
}  // namespace

template <class A>
void register_cross_entropy(Catalogue<float, A>& cat) {
  cat.cross_entropy.what = "softmax cross-entropy per row, fused with its gradient";
  cat.cross_entropy.add("reference", cross_entropy<true, A>,
                        {"one block per row, max-subtracted log-sum-exp (online: the row read "
                         "twice), packs of 8 values per thread",
                         "", "", ""});
  cat.cross_entropy.add("no_max_subtraction", cross_entropy<false, A>,
                        {"log-sum-exp without subtracting the row max", "", "", ""});
}

template void register_cross_entropy(Catalogue<float>&);
template void register_cross_entropy(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
