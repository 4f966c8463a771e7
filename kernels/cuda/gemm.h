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

// Strided batched form: `batch` independent GEMMs, operand i at X + i * strideX.
template <GemmMode mode>
inline void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         float alpha, const float* A, int lda, long long strideA, const float* B,
                         int ldb, long long strideB, float beta, float* C, int ldc,
                         long long strideC, int batch) {
  const cublasComputeType_t compute =
      mode == GemmMode::Bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  DIVLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas(), ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, strideA, B, CUDA_R_32F, ldb, strideB,
      &beta, C, CUDA_R_32F, ldc, strideC, batch, compute, CUBLAS_GEMM_DEFAULT));
  if (debug_sync()) DIVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace divlab::cuda
