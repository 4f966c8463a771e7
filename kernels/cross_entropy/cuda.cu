// Fused softmax + cross-entropy on the GPU: one block per row, fixed-tree reductions. The row is
// read twice, not three times: the max and the sum of exponentials in one pass (online softmax:
// the running sum is rescaled when the running max grows, once per pack of 8 values), the
// gradient in the second; both in packs of 8 values per thread where the row allows (pack.cuh).
// GPT-2 small's 50 304-wide rows took 4.5 ms per step read three times, one bf16 value per load.
#include <algorithm>
#include <type_traits>

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
// Symmetric to the bit, merge(a, b) == merge(b, a): both products are rounded before the sum,
// so no contraction into fma(a.s, ea, b.s eb) can round the two lanes of a shuffle pair apart.
// Every lane of the butterfly then holds the same value and every thread of a row the same
// log-sum-exp, whichever thread computes a value's gradient.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, __fmul_rn(a.s, expf(a.m - m)) + __fmul_rn(b.s, expf(b.m - m))};
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

// The row's log-sum-exp from each thread's share (a running max and sum, or a plain sum of
// exponentials without the max), in every thread.
template <bool subtract_max>
__device__ __forceinline__ float block_log_sum_exp(MaxSum acc, float* shared_m, float* shared_s) {
  if constexpr (subtract_max)
    acc = block_merge(acc, shared_m, shared_s);
  else
    acc.s = block_sum(acc.s, shared_s);
  return acc.m + logf(acc.s);
}

// One pack's share: into the running max and sum, or (without the max) the plain sum.
template <bool subtract_max>
__device__ __forceinline__ void take_values(MaxSum& acc, const float (&x)[kPack]) {
  if constexpr (subtract_max) {
    take_pack(acc, x);
  } else {
#pragma unroll
    for (int k = 0; k < kPack; ++k) acc.s += expf(x[k]);
  }
}

// One logit's gradient, as the CPU reference computes it.
template <class A>
__device__ __forceinline__ A logit_gradient(float z, float lse, float dloss, bool is_target) {
  return store<A>(expf(z - lse) * dloss - (is_target ? dloss : 0.0f));
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
    take_values<subtract_max>(acc, x);
  }
  for (int v = packs * kPack + threadIdx.x; v < V; v += blockDim.x) {
    if constexpr (subtract_max)
      take(acc, load(z[v]));
    else
      acc.s += expf(load(z[v]));
  }
  const float lse = block_log_sum_exp<subtract_max>(acc, shared_m, shared_s);
  const int target = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - load(z[target]);
  if (!dlogits) return;
  A* d = dlogits + row * V;
  auto grad = [&](float x, int v) { return logit_gradient<A>(x, lse, dloss, v == target); };
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

// Rows of at most kResidentThreads x kMaxResidentPacks packs (V <= 16 384): thread t holds packs
// t, t + blockDim.x, ... of its row (P of them) in registers for both passes, so the row is read
// once, and blocks stay resident and walk the rows gridDim.x apart, the next row's packs loaded
// before this row is reduced. Blocks are only as wide as the row's packs over P, rounded up to a
// warp (threads past the row's packs hold the merge's identity, {-inf, 0}, which merges exactly),
// and at most 256 threads, so eight rows are in flight on an SM: a row's reduction waits on
// barriers, and more rows hide it. `divlab train --profile`: the small model's 8 192 rows of
// 2 048 took 133.7 us a step in cross_entropy_kernel's 1024-thread blocks, 59.0 here (H100); the
// bench size's rows of 8 192, four packs a thread, 149.5 against 218.1 with one pack a thread in
// 1024-thread blocks (H200). 128-thread blocks gave the same at 8 192 and 43.6 at 2 048, not
// taken: rows of 16 384 would then need 16 packs a thread, past the registers in fp32 mode.
constexpr int kResidentThreads = 256, kMaxResidentPacks = 8;

template <bool subtract_max, int P, class A>
__global__ void __launch_bounds__(kResidentThreads)
    cross_entropy_resident(float* losses, A* dlogits, const A* logits, const TokenId* targets,
                           int N, int V, float dloss) {
  __shared__ float shared_m[32], shared_s[32];
  const int packs = V / kPack;
  auto pack_of = [&](int j) { return int(threadIdx.x) + j * int(blockDim.x); };
  Pack<A> next[P] = {};
#pragma unroll
  for (int j = 0; j < P; ++j)
    if (pack_of(j) < packs && blockIdx.x < N)
      next[j] = load_pack_last(logits + int64_t(blockIdx.x) * V, pack_of(j));
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    float x[P][kPack];
    MaxSum acc{subtract_max ? -INFINITY : 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const Pack<A> v = next[j];
      if (pack_of(j) < packs && row + gridDim.x < N)
        next[j] = load_pack_last(logits + (row + gridDim.x) * V, pack_of(j));
#pragma unroll
      for (int k = 0; k < kPack; ++k) x[j][k] = load(v.v[k]);
      if (pack_of(j) < packs) take_values<subtract_max>(acc, x[j]);
    }
    __syncthreads();  // the previous row's reduction may still be reading the shared values
    const float lse = block_log_sum_exp<subtract_max>(acc, shared_m, shared_s);
    const int target = targets[row];
    if (threadIdx.x == 0) losses[row] = lse - load(logits[row * V + target]);
    if (!dlogits) continue;
#pragma unroll
    for (int j = 0; j < P; ++j) {
      if (pack_of(j) >= packs) continue;
      Pack<A> o;
#pragma unroll
      for (int k = 0; k < kPack; ++k)
        o.v[k] = logit_gradient<A>(x[j][k], lse, dloss, pack_of(j) * kPack + k == target);
      store_pack_streaming(dlogits + row * V, pack_of(j), o);
    }
  }
}

// Blocks for the resident kernel: as many as the GPU keeps resident at once (each walks rows).
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, int N) {
  int device = 0, sms = 0, per_sm = 0;
  DIVLAB_CUDA_CHECK(cudaGetDevice(&device));
  DIVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DIVLAB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  return std::max(1, std::min(N, sms * std::max(1, per_sm)));
}

template <bool subtract_max, class A>
void cross_entropy(const OpContext& ctx, float* losses, A* dlogits, const A* logits,
                   const TokenId* targets, int N, int V, float dloss) {
  // Packs need every row to start 16-byte aligned: V a multiple of 8 and aligned bases.
  const bool packed = V % kPack == 0 && packable({logits, dlogits});
  const int packs = V / kPack;
  if (packed && packs <= kResidentThreads * kMaxResidentPacks) {
    // The fewest packs per thread that keep a block within kResidentThreads.
    const auto launch = [&](auto per_thread) {
      constexpr int P = decltype(per_thread)::value;
      const int threads = ((packs + P - 1) / P + 31) / 32 * 32;
      auto* kernel = cross_entropy_resident<subtract_max, P, A>;
      kernel<<<resident_blocks(kernel, threads, N), threads, 0, stream_of(ctx)>>>(
          losses, dlogits, logits, targets, N, V, dloss);
    };
    if (packs <= kResidentThreads)
      launch(std::integral_constant<int, 1>{});
    else if (packs <= 2 * kResidentThreads)
      launch(std::integral_constant<int, 2>{});
    else if (packs <= 4 * kResidentThreads)
      launch(std::integral_constant<int, 4>{});
    else
      launch(std::integral_constant<int, 8>{});
  } else {
    cross_entropy_kernel<subtract_max>
        <<<N, kRowThreads, 0, stream_of(ctx)>>>(losses, dlogits, logits, targets, V, dloss, packed);
  }
  DIVLAB_LAUNCHED(ctx, "cross_entropy");
}
}  // namespace

template <class A>
void register_cross_entropy(Catalogue<float, A>& cat) {
  cat.cross_entropy.what = "softmax cross-entropy per row, fused with its gradient";
  cat.cross_entropy.add("reference", cross_entropy<true, A>,
                        {"max-subtracted log-sum-exp (online), packs of 8 values per thread: "
                         "rows of up to 16 384 held in registers by blocks that walk the rows, "
                         "wider ones one block per row, read twice",
                         "", "", ""});
  cat.cross_entropy.add("no_max_subtraction", cross_entropy<false, A>,
                        {"log-sum-exp without subtracting the row max", "", "", ""});
}

template void register_cross_entropy(Catalogue<float>&);
template void register_cross_entropy(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
