// Linear layers on the GPU through cuBLAS. Row-major [N, in] activations and [out, in] weights
// are column-major [in, N] and [in, out] to cuBLAS, so y^T = W^T' x^T needs no copies.
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
template <GemmMode mode>
void linear_forward(float* y, const float* x, const float* W, int N, int in, int out) {
  // y^T[out, N] = (W as [in, out])^T * x^T[in, N]
  gemm<mode>(CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, 1.0f, W, in, x, in, 0.0f, y, out);
}

template <GemmMode mode>
void linear_backward(float* dx, float* dW, const float* dy, const float* x, const float* W, int N,
                     int in, int out) {
  // dx^T[in, N] = (W as [in, out]) * dy^T[out, N]
  gemm<mode>(CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, 1.0f, W, in, dy, out, 0.0f, dx, in);
  // dW^T[in, out] += x^T[in, N] * (dy^T[out, N])^T
  gemm<mode>(CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW, in);
}
}  // namespace

void register_linear(Catalogue<float>& cat, GemmMode mode) {
  cat.linear_forward.what = "y = x W^T (no bias)";
  cat.linear_backward.what = "dx = dy W, dW += dy^T x";
  if (mode == GemmMode::Fp32) {
    cat.linear_forward.add("reference", linear_forward<GemmMode::Fp32>,
                           {"cuBLAS SGEMM, fp32 FMA (no TF32)", "", "", ""});
    cat.linear_backward.add("reference", linear_backward<GemmMode::Fp32>,
                            {"cuBLAS SGEMM, fp32 FMA (no TF32)", "", "", ""});
  } else {
    cat.linear_forward.add("reference", linear_forward<GemmMode::Bf16>,
                           {"cuBLAS, bf16 tensor cores, fp32 accumulation", "", "", ""});
    cat.linear_backward.add("reference", linear_backward<GemmMode::Bf16>,
                            {"cuBLAS, bf16 tensor cores, fp32 accumulation", "", "", ""});
  }
}

}  // namespace divlab::cuda
