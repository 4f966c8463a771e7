// The GEMMs of the linear layers through cuBLASLt, with the algorithm chosen by timing among
// those that give the same bits.
//
// cuBLASLt offers several algorithms for one GEMM (tile shapes, thread-block clusters, split-K
// with a workspace reduction). Its heuristic's first choice is not always the fastest
// (bench/gemm_tuning.cu measures it at a model's shapes). Which algorithm runs must not
// change the numbers, though, or a run would depend on how a timing came out. Algorithms that
// cut the sum over K the same way add each output's products in the same order whatever their
// tiles, so they give the same bits: the tuner runs every candidate on a small probe problem with
// the same K (random operands) and keeps only those whose output equals the first choice's bit
// for bit, then times those on the real problem and keeps the fastest. So a GEMM's result is
// always the heuristic's first choice's, and only its speed depends on the timing.
//
// Tuning happens at a shape's first call outside a CUDA graph capture (a graph steps' first step
// runs op by op for such things), for GEMMs of at least kTunedFlops; a call while capturing, or a
// smaller GEMM, uses the first choice. Choices are kept for the process (shape -> algorithm,
// like cuDNN's plans), guarded by a mutex. DIVLAB_GEMM_TUNING=0 in the environment turns tuning
// off (the same bits, only slower GEMMs; 1 or unset: on; log: on, with one line per tuned shape
// on stderr, the candidates' times and the one kept; divlab refuses other values): check's
// racecheck pass sets 0, where every timing call of every candidate would run instrumented.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/op_context.h"

namespace divlab::cuda {

// What a GEMM's plan and choice are keyed by: C[m, n] = alpha op(A) op(B) + beta C, column-major.
struct GemmShape {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  cudaDataType_t in = CUDA_R_32F, out = CUDA_R_32F;
  bool accumulate = false;                          // beta != 0: C is read
  int align_a = 256, align_b = 256, align_c = 256;  // bytes the pointers are aligned to (<= 256)

  bool operator<(const GemmShape& o) const;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};
GemmShape gemm_shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A,
                     int lda, cudaDataType_t in, const void* B, int ldb, cudaDataType_t out,
                     void* C, int ldc, bool accumulate);

constexpr double kTunedFlops = 1e9;

// The GEMM on ctx's stream, with the tuned (or first) algorithm; fp32 accumulation and scale.
void gemm_lt(const OpContext& ctx, const GemmShape& s, float alpha, const void* A, const void* B,
             float beta, void* C);

// For tests and benchmarks: the candidates the tuner considers for `s` (the heuristic's first
// choice is candidate 0), whether the probe found candidate i's bits equal to candidate 0's, and
// one call with candidate i.
int gemm_candidate_count(const GemmShape& s);
bool gemm_candidate_agrees(const OpContext& ctx, const GemmShape& s, int i);
void gemm_with_candidate(const OpContext& ctx, const GemmShape& s, int i, float alpha,
                         const void* A, const void* B, float beta, void* C);
// How cuBLASLt describes candidate i (its algorithm configuration's attributes), for benchmarks.
struct GemmAlgoInfo {
  int id = 0, tile = 0, stages = 0, split_k = 1, reduction = 0, swizzle = 0, cluster = 0;
};
GemmAlgoInfo gemm_candidate_info(const GemmShape& s, int i);
// For benchmarks that look past the tuner's rule: appends to s's candidates the variants of
// candidate `of` with each split-K count in `splits` (partial sums in fp32) that cuBLASLt takes
// for s; returns how many. Call before anything probes s (the probe does not see later ones).
int gemm_add_split_variants(const GemmShape& s, int of, const int* splits, int count);
// For benchmarks too: appends what cuBLASLt's heuristic offers for s with split-K partial sums
// reduced by `schemes` (a cublasLtReductionScheme_t mask; the tuner's own candidates keep them in
// fp32), at most `most`, that s's candidates do not hold yet; returns how many.
int gemm_add_heuristic_candidates(const GemmShape& s, uint32_t schemes, int most);
// The candidate gemm_lt uses for `s` (tuning it first where it would be tuned).
int gemm_chosen_candidate(const OpContext& ctx, const GemmShape& s, float alpha, const void* A,
                          const void* B, float beta, void* C);

}  // namespace divlab::cuda
