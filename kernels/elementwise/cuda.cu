// GELU and the residual add on the GPU, in the same cancellation-free form as the CPU
// reference (see cpu.cpp): s = sigmoid(2u) computed from e = exp(-2|u|). Activations are read and
// written as A (storage.cuh), the residual stream as float.
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

namespace {
__device__ inline void gelu_gates(float x, float& s, float& one_minus_s) {
  const float k = 0.7978845608028654f, a = 0.044715f;
  const float u = k * (x + a * x * x * x);
  const float e = expf(-2.0f * fabsf(u));
  const float big = 1.0f / (1.0f + e), small = e * big;
  s = u >= 0 ? big : small;
  one_minus_s = u >= 0 ? small : big;
}

template <class A>
__global__ void gelu_forward_kernel(A* y, const A* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float xi = load(x[i]);
  float s, one_minus_s;
  gelu_gates(xi, s, one_minus_s);
  y[i] = store<A>(xi * s);
}

template <class A>
__global__ void gelu_backward_kernel(A* dx, const A* dy, const A* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float k = 0.7978845608028654f, a = 0.044715f, xi = load(x[i]);
  float s, one_minus_s;
  gelu_gates(xi, s, one_minus_s);
  dx[i] =
      store<A>(load(dy[i]) * (s + 2.0f * xi * s * one_minus_s * k * (1.0f + 3.0f * a * xi * xi)));
}

template <class A>
__global__ void add_kernel(float* y, const float* a, const A* b, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + load(b[i]);
}

template <class A>
__global__ void cast_kernel(A* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = store<A>(x[i]);
}

template <class A>
void gelu_forward(const OpContext& ctx, A* y, const A* x, int64_t n) {
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(y, x, n);
  DIVLAB_LAUNCHED("gelu_forward");
}
template <class A>
void gelu_backward(const OpContext& ctx, A* dx, const A* dy, const A* x, int64_t n) {
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(dx, dy, x, n);
  DIVLAB_LAUNCHED("gelu_backward");
}
template <class A>
void add(const OpContext& ctx, float* y, const float* a, const A* b, int64_t n) {
  add_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(y, a, b, n);
  DIVLAB_LAUNCHED("add");
}
template <class A>
void cast(const OpContext& ctx, A* y, const float* x, int64_t n) {
  cast_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(y, x, n);
  DIVLAB_LAUNCHED("cast");
}
__global__ void widen_kernel(float* y, const bf16* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = load(x[i]);
}
}  // namespace

void widen_bf16(void* stream, float* out, const bf16* in, int64_t n) {
  if (n <= 0) return;
  const OpContext ctx{stream};
  widen_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(out, in, n);
  DIVLAB_LAUNCHED("widen_bf16");
}
void round_to_bf16(void* stream, bf16* out, const float* in, int64_t n) {
  if (n > 0) cast(OpContext{stream}, out, in, n);
}

template <class A>
void register_elementwise(Catalogue<float, A>& cat) {
  cat.gelu_forward.what = "GELU forward (tanh approximation)";
  cat.gelu_forward.add("reference", gelu_forward<A>, {"one thread per element", "", "", ""});
  cat.gelu_backward.what = "GELU backward";
  cat.gelu_backward.add("reference", gelu_backward<A>, {"analytic derivative", "", "", ""});
  cat.add.what = "residual add";
  cat.add.add("reference", add<A>, {"elementwise", "", "", ""});
  cat.cast.what = "copy into activation storage (the weights before a forward; dresid)";
  cat.cast.add("reference", cast<A>,
               {std::is_same_v<A, bf16> ? "round to nearest even bf16, one thread per value"
                                        : "a copy, one thread per value",
                "", "", ""});
}

template void register_elementwise(Catalogue<float>&);
template void register_elementwise(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
