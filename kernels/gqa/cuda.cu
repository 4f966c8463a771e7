// Grouped-query key/value sharing on the GPU: one thread per output value, or per 8 consecutive
// values (16-byte loads and stores) where the head size allows; the backward sums each
// key/value value over its group's query heads in head order (deterministic, no atomics, the
// same sums either way).
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
__device__ inline int kv_head(int h, int NH, int NKV, bool interleaved) {
  return interleaved ? h % NKV : h / (NH / NKV);
}

// V values per thread: 1, or kPack (HD a multiple of it, 16-byte aligned arrays).
template <class A, int V>
__global__ void expand(A* qkv, const A* x, int64_t N, int NH, int NKV, int HD) {
  const int64_t C = int64_t(NH) * HD, W = (int64_t(NH) + 2 * NKV) * HD;
  const int64_t k = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (k >= N * 3 * C) return;
  const int64_t n = k / (3 * C), j = k % (3 * C);
  const int part = int(j / C), h = int(j % C / HD), i = int(j % HD);
  const int64_t src =
      part == 0 ? j
                : C + (part - 1) * int64_t(NKV) * HD + int64_t(kv_head(h, NH, NKV, false)) * HD + i;
  if constexpr (V == kPack)
    store_pack(qkv + k, 0, load_pack(x + n * W + src, 0));
  else
    qkv[k] = x[n * W + src];
}

template <class A, int V>
__global__ void reduce_groups(A* dx, const A* dqkv, int64_t N, int NH, int NKV, int HD,
                              bool interleaved) {
  const int64_t C = int64_t(NH) * HD, W = (int64_t(NH) + 2 * NKV) * HD;
  const int64_t k = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (k >= N * W) return;
  const int64_t n = k / W, j = k % W;
  const A* g = dqkv + n * 3 * C;
  if (j < C) {
    if constexpr (V == kPack)
      store_pack(dx + k, 0, load_pack(g + j, 0));
    else
      dx[k] = g[j];
    return;
  }
  const int64_t kv = j - C, part = 1 + kv / (int64_t(NKV) * HD);
  const int head = int(kv % (int64_t(NKV) * HD) / HD), i = int(kv % HD);
  float sum[V] = {};
  for (int h = 0; h < NH; ++h) {
    if (kv_head(h, NH, NKV, interleaved) != head) continue;
    const A* from = g + part * C + int64_t(h) * HD + i;
    if constexpr (V == kPack) {
      const Pack<A> p = load_pack(from, 0);
#pragma unroll
      for (int v = 0; v < V; ++v) sum[v] += load(p.v[v]);
    } else {
      sum[0] += load(*from);
    }
  }
  if constexpr (V == kPack) {
    Pack<A> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.v[v] = store<A>(sum[v]);
    store_pack(dx + k, 0, out);
  } else {
    dx[k] = store<A>(sum[0]);
  }
}

template <class A>
void gqa_forward(const OpContext& ctx, A* qkv, const A* x, int N, int NH, int NKV, int HD) {
  const int64_t n = int64_t(N) * 3 * NH * HD;
  if (n > 0 && HD % kPack == 0 && packable({qkv, x}))
    expand<A, kPack>
        <<<blocks_for(n / kPack, 256), 256, 0, stream_of(ctx)>>>(qkv, x, N, NH, NKV, HD);
  else if (n > 0)
    expand<A, 1><<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(qkv, x, N, NH, NKV, HD);
  DIVLAB_LAUNCHED(ctx, "gqa_forward");
}
template <class A, bool interleaved>
void gqa_backward(const OpContext& ctx, A* dx, const A* dqkv, int N, int NH, int NKV, int HD) {
  const int64_t n = int64_t(N) * (int64_t(NH) + 2 * NKV) * HD;
  if (n > 0 && HD % kPack == 0 && packable({dx, dqkv}))
    reduce_groups<A, kPack><<<blocks_for(n / kPack, 256), 256, 0, stream_of(ctx)>>>(
        dx, dqkv, N, NH, NKV, HD, interleaved);
  else if (n > 0)
    reduce_groups<A, 1>
        <<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(dx, dqkv, N, NH, NKV, HD, interleaved);
  DIVLAB_LAUNCHED(ctx, "gqa_backward");
}
}  // namespace

template <class A>
void register_gqa(Catalogue<float, A>& cat) {
  cat.gqa_forward.what = "grouped-query attention: key/value heads repeated for their query group";
  cat.gqa_forward.add("reference", gqa_forward<A>, {"one thread per value", "", "", ""});
  cat.gqa_backward.what = "grouped-query attention backward: kv gradients summed over each group";
  cat.gqa_backward.add("reference", gqa_backward<A, false>,
                       {"one thread per value, the group summed in head order", "", "", ""});
  cat.gqa_backward.add("interleaved_groups", gqa_backward<A, true>,
                       {"one thread per value, the interleaved group", "", "", ""});
}

template void register_gqa(Catalogue<float>&);
template void register_gqa(Catalogue<float, bf16>&);
}  // namespace divlab::cuda
