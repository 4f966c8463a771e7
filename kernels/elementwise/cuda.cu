// GELU and the residual add on the GPU, in the same cancellation-free form as the CPU
// reference (see cpu.cpp): s = sigmoid(2u) computed from e = exp(-2|u|).
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

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

__global__ void gelu_forward_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s, one_minus_s;
  gelu_gates(x[i], s, one_minus_s);
  y[i] = x[i] * s;
}

__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float k = 0.7978845608028654f, a = 0.044715f, xi = x[i];
  float s, one_minus_s;
  gelu_gates(xi, s, one_minus_s);
  dx[i] = dy[i] * (s + 2.0f * xi * s * one_minus_s * k * (1.0f + 3.0f * a * xi * xi));
}

__global__ void add_kernel(float* y, const float* a, const float* b, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

void gelu_forward(float* y, const float* x, int64_t n) {
  gelu_forward_kernel<<<blocks_for(n, 256), 256>>>(y, x, n);
  DIVLAB_LAUNCHED("gelu_forward");
}
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  gelu_backward_kernel<<<blocks_for(n, 256), 256>>>(dx, dy, x, n);
  DIVLAB_LAUNCHED("gelu_backward");
}
void add(float* y, const float* a, const float* b, int64_t n) {
  add_kernel<<<blocks_for(n, 256), 256>>>(y, a, b, n);
  DIVLAB_LAUNCHED("add");
}
}  // namespace

void register_elementwise(Catalogue<float>& cat) {
  cat.gelu_forward.what = "GELU forward (tanh approximation)";
  cat.gelu_forward.add("reference", gelu_forward, {"one thread per element", "", "", ""});
  cat.gelu_backward.what = "GELU backward";
  cat.gelu_backward.add("reference", gelu_backward, {"analytic derivative", "", "", ""});
  cat.add.what = "residual add";
  cat.add.add("reference", add, {"elementwise", "", "", ""});
}

}  // namespace divlab::cuda
