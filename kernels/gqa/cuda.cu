// Grouped-query key/value sharing on the GPU: one thread per output value; the backward sums
// each key/value value over its group's query heads in head order (deterministic, no atomics).
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
__device__ inline int kv_head(int h, int NH, int NKV, bool interleaved) {
  return interleaved ? h % NKV : h / (NH / NKV);
}

template <class A>
__global__ void expand(A* qkv, const A* x, int64_t N, int NH, int NKV, int HD) {
  const int64_t C = int64_t(NH) * HD, W = (int64_t(NH) + 2 * NKV) * HD;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * 3 * C) return;
  const int64_t n = k / (3 * C), j = k % (3 * C);
  const int part = int(j / C), h = int(j % C / HD), i = int(j % HD);
  const int64_t src =
      part == 0 ? j
                : C + (part - 1) * int64_t(NKV) * HD + int64_t(kv_head(h, NH, NKV, false)) * HD + i;
  qkv[k] = x[n * W + src];
}

template <class A>
__global__ void reduce_groups(A* dx, const A* dqkv, int64_t N, int NH, int NKV, int HD,
                              bool interleaved) {
  const int64_t C = int64_t(NH) * HD, W = (int64_t(NH) + 2 * NKV) * HD;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * W) return;
  const int64_t n = k / W, j = k % W;
  const A* g = dqkv + n * 3 * C;
  if (j < C) {
    dx[k] = g[j];
    return;
  }
  const int64_t kv = j - C, part = 1 + kv / (int64_t(NKV) * HD);
  const int head = int(kv % (int64_t(NKV) * HD) / HD), i = int(kv % HD);
  float sum = 0;
  for (int h = 0; h < NH; ++h)
    if (kv_head(h, NH, NKV, interleaved) == head) sum += load(g[part * C + int64_t(h) * HD + i]);
  dx[k] = store<A>(sum);
}

template <class A>
void gqa_forward(const OpContext& ctx, A* qkv, const A* x, int N, int NH, int NKV, int HD) {
  const int64_t n = int64_t(N) * 3 * NH * HD;
  if (n > 0) expand<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(qkv, x, N, NH, NKV, HD);
  DIVLAB_LAUNCHED(ctx, "gqa_forward");
}
template <class A, bool interleaved>
void gqa_backward(const OpContext& ctx, A* dx, const A* dqkv, int N, int NH, int NKV, int HD) {
  const int64_t n = int64_t(N) * (int64_t(NH) + 2 * NKV) * HD;
  if (n > 0)
    reduce_groups<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(dx, dqkv, N, NH, NKV, HD,
                                                                  interleaved);
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
