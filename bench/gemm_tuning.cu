// What the GEMM tuner (kernels/cuda/gemm_lt.h) buys at a model's shapes: for each of the linear
// layers' three GEMMs (forward, input gradient, weight gradient accumulated into fp32), the time
// of cuBLASLt's first choice against the tuned choice, how many candidates cuBLASLt offered and
// how many the probe found to give the first one's bits. bf16 operands (divlab's bf16 mode),
// random operands (a constant fill draws less power and flatters every GEMM), one GPU.
//   build/cuda/bench/bench_gemm_tuning [--tokens N] [--d-model C] [--vocab V] [--layers L]
//                                      [--reps R]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "bench/int_options.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/runtime.h"

namespace {
using divlab::OpContext;
using namespace divlab::cuda;

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = __float2bfloat16((float(x & 0xffffu) / 32768.0f - 1.0f));
  }
}
}  // namespace

static int run(int argc, char** argv) {
  int tokens = 16384, C = 768, V = 50304, L = 12, reps = 20;  // GPT-2 small, 16 x 1024 tokens
  if (const int rc = parse_int_options("bench_gemm_tuning", argc, argv,
                                       {{"--tokens", &tokens},
                                        {"--d-model", &C},
                                        {"--vocab", &V},
                                        {"--layers", &L},
                                        {"--reps", &reps}}))
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
    const Gemm gemms[] = {{"forward",
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
    for (const Gemm& g : gemms) {
      const int offered = gemm_candidate_count(g.s);
      int agreeing = 0;
      for (int i = 1; i < offered; ++i) agreeing += gemm_candidate_agrees(ctx, g.s, i);
      const int chosen = gemm_chosen_candidate(ctx, g.s, 1.0f, g.a, g.b, g.beta, g.c);
      const auto with = [&](int i) {
        return [&, i] { gemm_with_candidate(ctx, g.s, i, 1.0f, g.a, g.b, g.beta, g.c); };
      };
      const float first = mean_ms(with(0), reps, 2), tuned = mean_ms(with(chosen), reps, 2);
      std::printf("%-10s %-8s %8d %8d %10.1f %10.1f %7.1f%%\n", l.name, g.name, offered, agreeing,
                  1e3 * first, 1e3 * tuned, 100.0 * (first - tuned) / first);
      first_total += double(l.per_step) * first, tuned_total += double(l.per_step) * tuned;
    }
  }
  std::printf("per step (%d blocks and the head): first choices %.2f ms, tuned %.2f ms\n", L,
              first_total, tuned_total);
  return 0;
}

int main(int argc, char** argv) {
  return main_reporting_cuda_errors("bench_gemm_tuning", run, argc, argv);
}
