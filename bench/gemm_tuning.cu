// What the GEMM tuner (kernels/cuda/gemm_lt.h) buys at a model's shapes: for each of the linear
// layers' three GEMMs (forward, input gradient, weight gradient accumulated into fp32), the time
// of cuBLASLt's first choice against the tuned choice (timed in alternating rounds), how many
// candidates cuBLASLt offered and how many the probe found to give the first one's bits. bf16
// operands (divlab's bf16 mode), random operands (a constant fill draws less power and flatters
// every GEMM), one GPU.
// `--explore-splits S` also lists every candidate (tile, stages, split-K count, cluster, time,
// whether it gives the first choice's bits), with the first choice's split-K variants 2..S added:
// what a rule other than "the first choice's bits" could buy, and where.
//   build/cuda/bench/bench_gemm_tuning [--tokens N] [--d-model C] [--vocab V] [--layers L]
//                                      [--reps R] [--explore-splits S]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpu_timing.h"
#include "bench/int_options.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/runtime.h"

namespace {
using divlab::OpContext;
using namespace divlab::cuda;

// A value in [-1, 1) from a hash of the index (the same draws on every run).
__device__ float hashed_unit(size_t i, unsigned seed) {
  unsigned x = unsigned(i) * 2654435761u ^ seed;
  x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
  return float(x & 0xffffu) / 32768.0f - 1.0f;
}

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(hashed_unit(i, seed));
}
// Every candidate of `s` with its configuration, time and bits (added split variants past
// `offered`, marked +).
void list_candidates(const OpContext& ctx, const GemmShape& s, const void* a, const void* b,
                     float beta, void* c, int offered, int reps) {
  const int count = gemm_candidate_count(s);
  for (int i = 0; i < count; ++i) {
    const GemmAlgoInfo info = gemm_candidate_info(s, i);
    const float ms = mean_ms([&] { gemm_with_candidate(ctx, s, i, 1.0f, a, b, beta, c); }, reps, 2);
    std::printf(
        "    %s%-3d algo %-3d tile %-4d stages %-4d split %-2d reduction %d swizzle %d "
        "cluster %-3d %-9s %10.1f us\n",
        i < offered ? " " : "+", i, info.id, info.tile, info.stages, info.split_k, info.reduction,
        info.swizzle, info.cluster,
        i == 0 || gemm_candidate_agrees(ctx, s, i) ? "same bits" : "other", 1e3 * ms);
  }
}
// cuBLAS's own default algorithm (cublasGemmEx, as PyTorch's torch.mm calls it) on the same
// problem: its time, and whether its output at full size has the bits of cuBLASLt's first choice
// (from the same C where C is added to).
void cublas_default_row(const OpContext& ctx, const GemmShape& s, const void* a, const void* b,
                        float beta, void* c, int reps) {
  const size_t bytes =
      (size_t(s.ldc) * size_t(s.n - 1) + size_t(s.m)) * (s.out == CUDA_R_16BF ? 2 : 4);
  void* start = nullptr;
  DIVLAB_CUDA_CHECK(cudaMalloc(&start, bytes));
  DIVLAB_CUDA_CHECK(cudaMemcpy(start, c, bytes, cudaMemcpyDeviceToDevice));
  const float alpha = 1.0f;
  const auto lt = [&] { gemm_with_candidate(ctx, s, 0, alpha, a, b, beta, c); };
  const auto blas = [&] {
    DIVLAB_CUBLAS_CHECK(cublasGemmEx(cublas(ctx), s.ta, s.tb, s.m, s.n, s.k, &alpha, a, s.in, s.lda,
                                     b, s.in, s.ldb, &beta, c, s.out, s.ldc, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
  };
  std::vector<unsigned char> first(bytes), other(bytes);
  for (auto [call, into] : {std::pair{+0, &first}, std::pair{+1, &other}}) {
    DIVLAB_CUDA_CHECK(cudaMemcpy(c, start, bytes, cudaMemcpyDeviceToDevice));
    call == 0 ? lt() : blas();
    DIVLAB_CUDA_CHECK(cudaMemcpy(into->data(), c, bytes, cudaMemcpyDeviceToHost));
  }
  const float ms = mean_ms(blas, reps, 2);
  DIVLAB_CUDA_CHECK(cudaMemcpy(c, start, bytes, cudaMemcpyDeviceToDevice));
  DIVLAB_CUDA_CHECK(cudaFree(start));
  std::printf("    cuBLAS default (cublasGemmEx) %s %10.1f us\n",
              first == other ? "same bits as the first choice" : "other bits", 1e3 * ms);
}

// Mean milliseconds per call of two calls, timed in alternating rounds of `reps` calls (the
// rounds' medians): a GEMM as large as the LM head's draws the GPU to its power limit, so a burst
// timed after another runs at other clocks than one timed first. Timed one after the other, the
// LM head's tuned choice took 10-15 % longer here than the tuner measured it (session 63).
template <class F, class G>
std::pair<float, float> alternating_ms(F&& f, G&& g, int reps) {
  constexpr int kRounds = 5;
  std::vector<float> a, b;
  for (int r = 0; r < kRounds; ++r)
    a.push_back(mean_ms(f, reps, r == 0 ? 2 : 0)), b.push_back(mean_ms(g, reps, r == 0 ? 2 : 0));
  std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
  return {a[kRounds / 2], b[kRounds / 2]};
}

// A softmax-like gradient: 1/V with 1 % noise, what the LM head's gradients see early in training
// (a nearly constant operand draws less power than a uniform one; bench/torch_gemm.py says why).
__global__ void fill_softmax_like(__nv_bfloat16* p, size_t n, int V, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16((1.0f + 0.01f * hashed_unit(i, seed)) / float(V));
}
}  // namespace

static int run(int argc, char** argv) {
  int tokens = 16384, C = 768, V = 50304, L = 12, reps = 20;  // GPT-2 small, 16 x 1024 tokens
  int explore_splits = 0;
  if (const int rc = parse_int_options("bench_gemm_tuning", argc, argv,
                                       {{"--tokens", &tokens},
                                        {"--d-model", &C},
                                        {"--vocab", &V},
                                        {"--layers", &L},
                                        {"--reps", &reps},
                                        {"--explore-splits", &explore_splits}}))
    return rc;
  struct Layer {
    const char* name;
    int in, out, per_step;  // calls of each of its GEMMs per training step
  };
  const Layer layers[] = {{"qkv", C, 3 * C, L},
                          {"attn proj", C, C, L},
                          {"mlp up", C, 4 * C, L},
                          {"mlp down", 4 * C, C, L},
                          {"lm head", C, V, 1}};
  size_t most = 0;
  for (const Layer& l : layers)
    most = std::max(most, size_t(tokens) * size_t(std::max(l.in, l.out)));
  __nv_bfloat16 *x = nullptr, *w = nullptr, *dy = nullptr, *y = nullptr;
  float* dw = nullptr;
  DIVLAB_CUDA_CHECK(cudaMalloc(&x, most * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&dy, most * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&y, most * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&w, size_t(4) * C * std::max(V, 4 * C) * 2));
  DIVLAB_CUDA_CHECK(cudaMalloc(&dw, size_t(4) * C * std::max(V, 4 * C) * 4));
  fill<<<1024, 256>>>(x, most, 1), fill<<<1024, 256>>>(dy, most, 2);
  fill<<<1024, 256>>>(w, size_t(4) * C * std::max(V, 4 * C), 3);
  DIVLAB_CUDA_CHECK(cudaMemset(dw, 0, size_t(4) * C * std::max(V, 4 * C) * 4));
  divlab::OpContextSource contexts(device_memory());
  const OpContext ctx = contexts.next();
  cudaDeviceProp prop{};
  DIVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GEMM tuning on %s: tokens %d, C %d, V %d, L %d, %d reps, bf16 operands\n", prop.name,
              tokens, C, V, L, reps);
  std::printf("%-10s %-8s %8s %8s %10s %10s %8s\n", "layer", "gemm", "offered", "agreeing",
              "first us", "tuned us", "gain");
  double first_total = 0, tuned_total = 0;
  for (const Layer& l : layers) {
    struct Gemm {
      const char* name;
      GemmShape s;
      const void *a, *b;
      void* c;
      float beta;
    };
    std::vector<Gemm> gemms = {{"forward",
                                gemm_shape(CUBLAS_OP_T, CUBLAS_OP_N, l.out, tokens, l.in, w, l.in,
                                           CUDA_R_16BF, x, l.in, CUDA_R_16BF, y, l.out, false),
                                w, x, y, 0.0f},
                               {"dx",
                                gemm_shape(CUBLAS_OP_N, CUBLAS_OP_N, l.in, tokens, l.out, w, l.in,
                                           CUDA_R_16BF, dy, l.out, CUDA_R_16BF, y, l.in, false),
                                w, dy, y, 0.0f},
                               {"dW",
                                gemm_shape(CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, tokens, x, l.in,
                                           CUDA_R_16BF, dy, l.out, CUDA_R_32F, dw, l.in, true),
                                x, dy, dw, 1.0f}};
    if (explore_splits > 0)  // the weight gradient written, not added: into fp32, and into bf16
      for (const cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF})
        gemms.push_back(
            {out == CUDA_R_32F ? "dW=f32" : "dW=bf16",
             gemm_shape(CUBLAS_OP_N, CUBLAS_OP_T, l.in, l.out, tokens, x, l.in, CUDA_R_16BF, dy,
                        l.out, out, out == CUDA_R_32F ? static_cast<void*>(dw) : y, l.in, false),
             x, dy, out == CUDA_R_32F ? static_cast<void*>(dw) : y, 0.0f});
    for (const Gemm& g : gemms) {
      const int offered = gemm_candidate_count(g.s);
      if (explore_splits > 1) {
        std::vector<int> splits;
        for (int k = 2; k <= explore_splits; ++k) splits.push_back(k);
        gemm_add_split_variants(g.s, 0, splits.data(), int(splits.size()));
        gemm_add_heuristic_candidates(g.s, CUBLASLT_REDUCTION_SCHEME_MASK, 32);
      }
      int agreeing = 0;
      for (int i = 1; i < offered; ++i) agreeing += gemm_candidate_agrees(ctx, g.s, i);
      const int chosen = gemm_chosen_candidate(ctx, g.s, 1.0f, g.a, g.b, g.beta, g.c);
      const auto with = [&](int i) {
        return [&, i] { gemm_with_candidate(ctx, g.s, i, 1.0f, g.a, g.b, g.beta, g.c); };
      };
      const auto [first, tuned] = alternating_ms(with(0), with(chosen), reps);
      std::printf("%-10s %-8s %8d %8d %10.1f %10.1f %7.1f%%\n", l.name, g.name, offered, agreeing,
                  1e3 * first, 1e3 * tuned, 100.0 * (first - tuned) / first);
      if (g.name[2] != '=')  // the explored weight gradients are not the step's
        first_total += double(l.per_step) * first, tuned_total += double(l.per_step) * tuned;
      if (explore_splits > 0) {
        list_candidates(ctx, g.s, g.a, g.b, g.beta, g.c, offered, reps);
        cublas_default_row(ctx, g.s, g.a, g.b, g.beta, g.c, reps);
      }
    }
    if (explore_splits > 0 && l.out == V) {  // the head's gradients on what training feeds them
      fill_softmax_like<<<1024, 256>>>(dy, most, V, 4);
      for (const Gemm& g : gemms) {
        if (g.name[0] != 'd') continue;
        const int chosen = gemm_chosen_candidate(ctx, g.s, 1.0f, g.a, g.b, g.beta, g.c);
        const float ms = mean_ms(
            [&] { gemm_with_candidate(ctx, g.s, chosen, 1.0f, g.a, g.b, g.beta, g.c); }, reps, 2);
        std::printf("%-10s %-8s softmax-like dy: tuned %.1f us\n", l.name, g.name, 1e3 * ms);
      }
      fill<<<1024, 256>>>(dy, most, 2);
    }
  }
  std::printf("per step (%d blocks and the head): first choices %.2f ms, tuned %.2f ms\n", L,
              first_total, tuned_total);
  return 0;
}

int main(int argc, char** argv) {
  return main_reporting_cuda_errors("bench_gemm_tuning", run, argc, argv);
}
