// One checked cuBLAS GEMM entry point (column-major, fp32 tensors in and out) for both modes.
//   Fp32: cublasGemmEx on fp32 operands with fp32 compute (no TF32).
//   Bf16: both operands rounded to bf16 (round-to-nearest-even, one conversion pass each into
//         scratch), multiplied on the tensor cores with fp32 accumulation into the fp32 output.
//         (Letting cuBLAS down-convert fp32 operands itself, CUBLAS_COMPUTE_32F_FAST_16BF, ran
//         at ~140 TFLOP/s on an H200 at the bench model's shapes.)
#pragma once

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

// dst[i] = bf16(src[i]) for n values (device pointers); dst is __nv_bfloat16 storage.
void to_bf16(void* dst, const float* src, int64_t n);

// The operand of a GEMM as cuBLAS sees it: pointer and element type.
struct Operand {
  const void* p;
  cudaDataType_t type;
};

// Rounds an fp32 operand holding `n` values to bf16 in scratch `slot` (Bf16 mode), or passes it
// through (Fp32 mode).
template <GemmMode mode>
inline Operand operand(const float* x, int64_t n, Scratch slot) {
  if (mode == GemmMode::Fp32) return {x, CUDA_R_32F};
  void* b = scratch(slot, size_t(n) * 2);
  to_bf16(b, x, n);
  return {b, CUDA_R_16BF};
}

// Values an operand spans: op(X) is rows x cols, stored with leading dimension ld.
inline int64_t span(cublasOperation_t t, int rows, int cols, int ld) {
  return int64_t(ld) * (t == CUBLAS_OP_N ? cols : rows);
}

template <GemmMode mode>
inline void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const Operand a = operand<mode>(A, span(ta, m, k, lda), Scratch::GemmA);
  const Operand b = operand<mode>(B, span(tb, k, n, ldb), Scratch::GemmB);
  DIVLAB_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, m, n, k, &alpha, a.p, a.type, lda, b.p,
                                   b.type, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  if (debug_sync()) DIVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

// Strided batched form: `batch` independent GEMMs, operand i at X + i * strideX.
template <GemmMode mode>
inline void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                         float alpha, const float* A, int lda, long long strideA, const float* B,
                         int ldb, long long strideB, float beta, float* C, int ldc,
                         long long strideC, int batch) {
  const Operand a = operand<mode>(A, strideA * batch, Scratch::GemmA);
  const Operand b = operand<mode>(B, strideB * batch, Scratch::GemmB);
  DIVLAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas(), ta, tb, m, n, k, &alpha, a.p, a.type, lda, strideA, b.p, b.type, ldb, strideB,
      &beta, C, CUDA_R_32F, ldc, strideC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (debug_sync()) DIVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace divlab::cuda
