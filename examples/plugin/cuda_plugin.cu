// An example CUDA plug-in (ABI 2): two GPU candidates for the fused embedding-gradient op and an
// optimizer update, written only against kernels/plugin_abi.h. Every launch goes on the stream
// divlab gives (ctx->stream) and the scratch comes from its workspace, so nothing here
// synchronises the device.
//   example_cuda_fp32_atomic  correct up to fp32 rounding: float atomicAdd into dwte (the order,
//                             and so the last bits, vary from run to run).
//   example_cuda_bf16_atomic  the seed bug as written in the wild: atomicAdd into a bf16 buffer.
//   example_cuda_sgd          sgd_step, one thread per value: PyTorch's SGD with momentum.
// Build: part of the project's CMake with the cuda preset (target divlab_example_cuda_plugin).
#include <cuda_bf16.h>

#include "kernels/plugin_abi.h"

namespace {

__global__ void rows_kernel(float* dx0, float* prod, const float* dy, const float* dresid,
                            const float* x, const float* w, const float* rstd, int C) {
  __shared__ float part[256];
  const size_t row = blockIdx.x;
  float dot = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) dot += dy[row * C + c] * w[c] * x[row * C + c];
  part[threadIdx.x] = dot;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  const float r = rstd[row], k = r * r * r * part[0] / float(C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const size_t i = row * C + c;
    dx0[i] = dresid[i] + r * w[c] * dy[i] - x[i] * k;
    prod[i] = dy[i] * x[i] * r;
  }
}

// One thread per column: sums the rows of `in` (rows x cols) into out[col].
__global__ void column_sum_kernel(float* out, const float* in, int rows, int cols,
                                  int stride_rows) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (int r = 0; r < rows; ++r) s += in[size_t(r) * stride_rows * cols + c];
  out[c] += s;
}

template <bool bf16>
__global__ void scatter_kernel(float* dwte, __nv_bfloat16* acc, const float* dx0,
                               const divlab_token* tokens, int C, size_t total) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const size_t dst = size_t(tokens[i / C]) * C + i % C;
  if (bf16)
    atomicAdd(&acc[dst], __float2bfloat16_rn(dx0[i]));
  else
    atomicAdd(&dwte[dst], dx0[i]);
}

__global__ void add_bf16_kernel(float* dwte, const __nv_bfloat16* acc, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dwte[i] += __bfloat162float(acc[i]);
}

template <bool bf16>
void embed_rmsnorm_backward(const divlab_op_context* ctx, float* dwte, float* dwpe, float* dw_norm,
                            const float* dy_norm, const float* dresid, const float* x0,
                            const float* w_norm, const float* rstd, const divlab_token* tokens,
                            int B, int T, int C, int V) {
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream);
  const int N = B * T;
  const size_t total = size_t(N) * C, table = size_t(V) * C;
  auto* dx0 = static_cast<float*>(ctx->workspace(ctx, 0, sizeof(float) * total));
  auto* prod = static_cast<float*>(ctx->workspace(ctx, 1, sizeof(float) * total));
  auto* acc = static_cast<__nv_bfloat16*>(
      bf16 ? ctx->workspace(ctx, 2, sizeof(__nv_bfloat16) * table) : nullptr);
  if (!dx0 || !prod || (bf16 && !acc)) return;  // no scratch: dwte stays untouched (check says so)
  rows_kernel<<<N, 256, 0, stream>>>(dx0, prod, dy_norm, dresid, x0, w_norm, rstd, C);
  column_sum_kernel<<<(C + 127) / 128, 128, 0, stream>>>(dw_norm, prod, N, C, 1);
  // dwpe[t] = sum over b of dx0[b, t]: rows b*T + t, i.e. B rows T*C apart, for each of T*C.
  column_sum_kernel<<<(T * C + 127) / 128, 128, 0, stream>>>(dwpe, dx0, B, T * C, 1);
  if (bf16) cudaMemsetAsync(acc, 0, sizeof(__nv_bfloat16) * table, stream);
  scatter_kernel<bf16>
      <<<unsigned((total + 255) / 256), 256, 0, stream>>>(dwte, acc, dx0, tokens, C, total);
  if (bf16) add_bf16_kernel<<<unsigned((table + 255) / 256), 256, 0, stream>>>(dwte, acc, table);
}

__global__ void sgd_kernel(float* p, float* buf, const float* g, int64_t n, float lr,
                           float momentum, bool nesterov, float weight_decay, float grad_scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float d = g[i] * grad_scale + weight_decay * p[i];
    if (momentum != 0.0f) {
      buf[i] = momentum * buf[i] + d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

void sgd_step(const divlab_op_context* ctx, float* p, float* buf, const float* g, int64_t n,
              float lr, float momentum, bool nesterov, float weight_decay, float grad_scale) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  sgd_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0,
               static_cast<cudaStream_t>(ctx->stream)>>>(p, buf, g, n, lr, momentum, nesterov,
                                                         weight_decay, grad_scale);
}

const divlab_variant2 kVariants[] = {
    {"embed_rmsnorm_backward", "example_cuda_fp32_atomic", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&embed_rmsnorm_backward<false>),
     "example CUDA plug-in: float atomicAdd into dwte", "", "", ""},
    {"embed_rmsnorm_backward", "example_cuda_bf16_atomic", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&embed_rmsnorm_backward<true>),
     "example CUDA plug-in: atomicAdd into a bf16 buffer",
     "a frequent token's row stalls once its sum is 2^8 times a contribution",
     "skewed token streams (Zipf, real text), many tokens per step", "uniform tokens; AdamW"},
    {"sgd_step", "example_cuda_sgd", "cuda", DIVLAB_FP32, 0,
     reinterpret_cast<void (*)(void)>(&sgd_step), "example CUDA plug-in: SGD, a thread a value", "",
     "", ""},
};
const divlab_plugin2 kPlugin = {DIVLAB_PLUGIN_ABI2_VERSION,
                                sizeof(kVariants) / sizeof(kVariants[0]), kVariants};

}  // namespace

const divlab_plugin2* divlab_plugin_register2(void) {
  return &kPlugin;
}
