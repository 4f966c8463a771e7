// SwiGLU on the GPU: one thread per (row, channel), or per 8 channels (16-byte loads and stores)
// where the width allows; the CPU's overflow-free sigmoid, the same arithmetic per value.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
__device__ inline float sigmoid(float g) {
  if (g >= 0) return 1.0f / (1.0f + expf(-g));
  const float e = expf(g);
  return e / (1.0f + e);
}

// V consecutive values of p (V = kPack: one 16-byte access; p then 16-byte aligned).
template <int V, class A>
struct Run {
  float v[V];
  __device__ void read(const A* p) {
    if constexpr (V == kPack) {
      const Pack<A> pack = load_pack(p, 0);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = load(pack.v[i]);
    } else {
      v[0] = load(*p);
    }
  }
  __device__ void write(A* p) const {
    if constexpr (V == kPack) {
      Pack<A> pack;
#pragma unroll
      for (int i = 0; i < V; ++i) pack.v[i] = store<A>(v[i]);
      store_pack(p, 0, pack);
    } else {
      *p = store<A>(v[0]);
    }
  }
};

// V values per thread: 1, or kPack (F a multiple of it, 16-byte aligned arrays).
template <class A, int V>
__global__ void swiglu_forward_kernel(A* y, const A* x, int64_t N, int F) {
  const int64_t k = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (k >= N * F) return;
  const int64_t n = k / F, f = k % F;
  Run<V, A> g, u, out;
  g.read(x + n * 2 * F + f), u.read(x + n * 2 * F + F + f);
#pragma unroll
  for (int i = 0; i < V; ++i) out.v[i] = g.v[i] * sigmoid(g.v[i]) * u.v[i];
  out.write(y + k);
}

// `swap`: the gate's gradient stored in the up half and the up's in the gate half (the variant).
template <class A, int V>
__global__ void swiglu_backward_kernel(A* dx, const A* dy, const A* x, int64_t N, int F,
                                       bool swap) {
  const int64_t k = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (k >= N * F) return;
  const int64_t n = k / F, f = k % F;
  Run<V, A> g, u, d, dgate, dup;
  g.read(x + n * 2 * F + f), u.read(x + n * 2 * F + F + f), d.read(dy + k);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float s = sigmoid(g.v[i]);
    dup.v[i] = d.v[i] * g.v[i] * s;
    dgate.v[i] = d.v[i] * u.v[i] * s * (1.0f + g.v[i] * (1.0f - s));
  }
  dgate.write(dx + n * 2 * F + (swap ? F : 0) + f);
  dup.write(dx + n * 2 * F + (swap ? 0 : F) + f);
}

template <class A>
void swiglu_forward(const OpContext& ctx, A* y, const A* x, int N, int F) {
  const int64_t n = int64_t(N) * F;
  if (n > 0 && F % kPack == 0 && packable({y, x}))
    swiglu_forward_kernel<A, kPack>
        <<<blocks_for(n / kPack, 256), 256, 0, stream_of(ctx)>>>(y, x, N, F);
  else if (n > 0)
    swiglu_forward_kernel<A, 1><<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(y, x, N, F);
  DIVLAB_LAUNCHED(ctx, "swiglu_forward");
}
template <class A, bool swap>
void swiglu_backward(const OpContext& ctx, A* dx, const A* dy, const A* x, int N, int F) {
  const int64_t n = int64_t(N) * F;
  if (n > 0 && F % kPack == 0 && packable({dx, dy, x}))
    swiglu_backward_kernel<A, kPack>
        <<<blocks_for(n / kPack, 256), 256, 0, stream_of(ctx)>>>(dx, dy, x, N, F, swap);
  else if (n > 0)
    swiglu_backward_kernel<A, 1>
        <<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(dx, dy, x, N, F, swap);
  DIVLAB_LAUNCHED(ctx, "swiglu_backward");
}
}  // namespace

template <class A>
void register_swiglu(Catalogue<float, A>& cat) {
  cat.swiglu_forward.what = "SwiGLU: silu(gate) * up over the two halves of each row";
  cat.swiglu_forward.add("reference", swiglu_forward<A>, {"one thread per value", "", "", ""});
  cat.swiglu_backward.what = "SwiGLU backward into the gate and up halves";
  cat.swiglu_backward.add("reference", swiglu_backward<A, false>,
                          {"one thread per value pair", "", "", ""});
  cat.swiglu_backward.add("swapped_halves", swiglu_backward<A, true>,
                          {"one thread per value pair, halves swapped", "", "", ""});
}

template void register_swiglu(Catalogue<float>&);
template void register_swiglu(Catalogue<float, bf16>&);
}  // namespace divlab::cuda
