// Optimizer kernels on the GPU: elementwise updates in the CPU reference's exact arithmetic
// order (bias corrections computed on the host, as the CPU does), and a deterministic
// sum of squares: fixed grid, per-block double sums, then one block adding them in order.
#include <cmath>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
constexpr int kSumBlocks = 256, kSumThreads = 256;

__global__ void sum_squares_partial(double* partial, const float* g, int64_t n) {
  __shared__ double shared[32];
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    s += double(g[i]) * double(g[i]);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials(double* out, const double* partial, int n) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

void sum_squares(const OpContext& ctx, double* out, const float* g, int64_t n) {
  double* partial = scratch_as<double>(ctx, Scratch::Reduce, kSumBlocks);
  sum_squares_partial<<<kSumBlocks, kSumThreads, 0, stream_of(ctx)>>>(partial, g, n);
  DIVLAB_LAUNCHED(ctx, "sum_squares_partial");
  sum_partials<<<1, kSumThreads, 0, stream_of(ctx)>>>(out, partial, kSumBlocks);
  DIVLAB_LAUNCHED(ctx, "sum_partials");
}

__global__ void sgd_kernel(float* p, float* buf, const float* g, int64_t n, float lr,
                           float momentum, bool nesterov, float weight_decay, float grad_scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float d = __fadd_rn(__fmul_rn(g[i], grad_scale), __fmul_rn(weight_decay, p[i]));
  if (momentum != 0.0f) {
    buf[i] = __fadd_rn(__fmul_rn(momentum, buf[i]), d);
    d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, buf[i])) : buf[i];
  }
  p[i] = __fsub_rn(p[i], __fmul_rn(lr, d));
}

void sgd_step(const OpContext& ctx, float* p, float* buf, const float* g, int64_t n, float lr,
              float momentum, bool nesterov, float weight_decay, float grad_scale) {
  sgd_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(p, buf, g, n, lr, momentum, nesterov,
                                                             weight_decay, grad_scale);
  DIVLAB_LAUNCHED(ctx, "sgd_step");
}

__global__ void adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay,
                             float grad_scale, float c1, float c2) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * grad_scale;
  p[i] *= 1.0f - lr * weight_decay;
  m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
  v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  p[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
}

void adamw_step(const OpContext& ctx, float* p, float* m, float* v, const float* g, int64_t n,
                float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                int64_t step) {
  const float c1 = 1.0f - std::pow(beta1, float(step));
  const float c2 = 1.0f - std::pow(beta2, float(step));
  adamw_kernel<<<blocks_for(n, 256), 256, 0, stream_of(ctx)>>>(p, m, v, g, n, lr, beta1, beta2, eps,
                                                               weight_decay, grad_scale, c1, c2);
  DIVLAB_LAUNCHED(ctx, "adamw_step");
}
}  // namespace

template <class A>
void register_optimizer(Catalogue<float, A>& cat) {
  cat.sum_squares.what = "sum of squared gradients (global norm for clipping)";
  cat.sum_squares.add("reference", sum_squares,
                      {"fixed grid of double block sums, added in block order", "", "", ""});
  cat.sgd_step.what = "SGD update (momentum, optional Nesterov, coupled weight decay)";
  cat.sgd_step.add("reference", sgd_step, {"PyTorch semantics, one thread per value", "", "", ""});
  cat.adamw_step.what = "AdamW update (decoupled weight decay, bias-corrected moments)";
  cat.adamw_step.add("reference", adamw_step,
                     {"PyTorch semantics, one thread per value", "", "", ""});
}

template void register_optimizer(Catalogue<float>&);
template void register_optimizer(Catalogue<float, bf16>&);

}  // namespace divlab::cuda
