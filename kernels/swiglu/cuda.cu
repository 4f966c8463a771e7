// SwiGLU on the GPU: one thread per (row, channel), the CPU's overflow-free sigmoid.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
__device__ inline float sigmoid(float g) {
  if (g >= 0) return 1.0f / (1.0f + expf(-g));
  const float e = expf(g);
  return e / (1.0f + e);
}

template <class A>
__global__ void swiglu_forward_kernel(A* y, const A* x, int64_t N, int F) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * F) return;
  const int64_t n = k / F, f = k % F;
  const float g = load(x[n * 2 * F + f]), u = load(x[n * 2 * F + F + f]);
  y[k] = store<A>(g * sigmoid(g) * u);
}

// `swap`: the gate's gradient stored in the up half and the up's in the gate half (the variant).
template <class A>
__global__ void swiglu_backward_kernel(A* dx, const A* dy, const A* x, int64_t N, int F,
                                       bool swap) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= N * F) return;
  const int64_t n = k / F, f = k % F;
  const float g = load(x[n * 2 * F + f]), u = load(x[n * 2 * F + F + f]), d = load(dy[k]);
  const float s = sigmoid(g);
  const float dup = d * g * s, dgate = d * u * s * (1.0f + g * (1.0f - s));
  dx[n * 2 * F + (swap ? F : 0) + f] = store<A>(dgate);
  dx[n * 2 * F + (swap ? 0 : F) + f] = store<A>(dup);
}

template <class A>
void swiglu_forward(const OpContext& ctx, A* y, const A* x, int N, int F) {
  const int64_t n = int64_t(N) * F;
  if (n > 0) swiglu_forward_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(y, x, N, F);
  DIVLAB_LAUNCHED(ctx, "swiglu_forward");
}
template <class A, bool swap>
void swiglu_backward(const OpContext& ctx, A* dx, const A* dy, const A* x, int N, int F) {
  const int64_t n = int64_t(N) * F;
  if (n > 0)
    swiglu_backward_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(dx, dy, x, N, F, swap);
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
