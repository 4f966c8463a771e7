// One checked GEMM entry point (column-major, cuBLASLt: gemm_lt.h) for both modes: operands In
// (float: fp32 FMA, no TF32, for parity with the CPU; bf16: bf16 tensor cores), fp32
// accumulation, output Out (the activation type, or float for parameter gradients).
// History: bf16 mode used to keep fp32 activations and let cuBLAS round the operands
// (CUBLAS_COMPUTE_32F_FAST_16BF); bench/gemm_modes.cu measured bf16 operands 1.3-2.0x faster at
// the GEMM-bound bench size, which is why activations are now stored in bf16.
#pragma once

#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

template <class In, class Out>
inline void gemm(const OpContext& ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                 int k, float alpha, const In* A, int lda, const In* B, int ldb, float beta, Out* C,
                 int ldc) {
  gemm_lt(ctx,
          gemm_shape(ta, tb, m, n, k, A, lda, cuda_type<In>(), B, ldb, cuda_type<Out>(), C, ldc,
                     beta != 0.0f),
          alpha, A, B, beta, C);
}

// Where batch entry (b, h) of a per-head operand starts: X + b * batch + h * head (elements).
// Attention reads q, k, v straight out of the [N, 3C] qkv rows and writes y into the [N, C]
// output rows this way, so no head gather or scatter copies are needed.
struct HeadStrides {
  long long batch, head;
};

// B x NH independent GEMMs on operands addressed by HeadStrides, in one cuBLAS batched call; the
// pointer arrays are built on the device, in stream order with the GEMM.
// Strides are in elements; the pointers go to the kernel as bytes (any storage type).
void head_pointers(const OpContext& ctx, const void** a, const char* A, HeadStrides sa,
                   const void** b, const char* B, HeadStrides sb, void** c, char* C, HeadStrides sc,
                   int nbatch, int nheads);

template <class In, class Out>
inline void gemm_heads(const OpContext& ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                       int n, int k, float alpha, const In* A, int lda, HeadStrides sa, const In* B,
                       int ldb, HeadStrides sb, float beta, Out* C, int ldc, HeadStrides sc,
                       int nbatch, int nheads) {
  const int count = nbatch * nheads;
  void* arrays = scratch(ctx, Scratch::Pointers, 3 * size_t(count) * sizeof(void*));
  const void** a = static_cast<const void**>(arrays);
  const void** b = a + count;
  void** c = static_cast<void**>(arrays) + 2 * count;
  const auto in_bytes = [](HeadStrides s) {
    return HeadStrides{s.batch * (long long)sizeof(In), s.head * (long long)sizeof(In)};
  };
  const HeadStrides sc_bytes{sc.batch * (long long)sizeof(Out), sc.head * (long long)sizeof(Out)};
  head_pointers(ctx, a, reinterpret_cast<const char*>(A), in_bytes(sa), b,
                reinterpret_cast<const char*>(B), in_bytes(sb), c, reinterpret_cast<char*>(C),
                sc_bytes, nbatch, nheads);
  DIVLAB_CUBLAS_CHECK(cublasGemmBatchedEx(cublas(ctx), ta, tb, m, n, k, &alpha, a, cuda_type<In>(),
                                          lda, b, cuda_type<In>(), ldb, &beta, c, cuda_type<Out>(),
                                          ldc, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (debug_sync(ctx)) DIVLAB_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
}

}  // namespace divlab::cuda
