// One checked cuBLAS GEMM entry point (column-major, fp32 in and out) for both GEMM modes.
// Bf16 mode lets cuBLAS round the fp32 operands to bf16 itself (CUBLAS_COMPUTE_32F_FAST_16BF).
// Measured on an H200 at configs/bench-gpu.toml: 15.3 ms per step; rounding both operands in a
// conversion pass of our own and multiplying bf16 x bf16 -> fp32 was slower (18.0 ms).
#pragma once

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

template <GemmMode mode>
inline void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const cublasComputeType_t compute =
      mode == GemmMode::Bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  DIVLAB_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B,
                                   CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                                   CUBLAS_GEMM_DEFAULT));
  if (debug_sync()) DIVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

// Where batch entry (b, h) of a per-head operand starts: X + b * batch + h * head (elements).
// Attention reads q, k, v straight out of the [N, 3C] qkv rows and writes y into the [N, C]
// output rows this way, so no head gather or scatter copies are needed.
struct HeadStrides {
  long long batch, head;
};

// B x NH independent GEMMs on operands addressed by HeadStrides, in one cuBLAS batched call; the
// pointer arrays are built on the device, in stream order with the GEMM.
void head_pointers(const float** a, const float* A, HeadStrides sa, const float** b, const float* B,
                   HeadStrides sb, float** c, float* C, HeadStrides sc, int nbatch, int nheads);

template <GemmMode mode>
inline void gemm_heads(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                       const float* A, int lda, HeadStrides sa, const float* B, int ldb,
                       HeadStrides sb, float beta, float* C, int ldc, HeadStrides sc, int nbatch,
                       int nheads) {
  const int count = nbatch * nheads;
  void* arrays = scratch(Scratch::Pointers, 3 * size_t(count) * sizeof(void*));
  const float** a = static_cast<const float**>(arrays);
  const float** b = a + count;
  float** c = static_cast<float**>(arrays) + 2 * count;
  head_pointers(a, A, sa, b, B, sb, c, C, sc, nbatch, nheads);
  const cublasComputeType_t compute =
      mode == GemmMode::Bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  DIVLAB_CUBLAS_CHECK(cublasGemmBatchedEx(
      cublas(), ta, tb, m, n, k, &alpha, reinterpret_cast<const void* const*>(a), CUDA_R_32F, lda,
      reinterpret_cast<const void* const*>(b), CUDA_R_32F, ldb, &beta,
      reinterpret_cast<void* const*>(c), CUDA_R_32F, ldc, count, compute, CUBLAS_GEMM_DEFAULT));
  if (debug_sync()) DIVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace divlab::cuda
