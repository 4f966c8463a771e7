// What the GPU trainer's GEMMs cost in each operand format, at the shapes of a model config.
// divlab's bf16 mode keeps activations and weights in fp32 and lets cuBLAS round the operands
// (CUBLAS_COMPUTE_32F_FAST_16BF); this measures that against operands already stored in bf16
// (what bf16 activation storage would give), against bf16 output too, and against TF32 and
// plain fp32, one shape at a time, in one run. Baseline: the mode divlab uses.
//   build/cuda/bench/bench_gemm_modes [--tokens N] [--d-model C] [--vocab V] [--reps R]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/gpu_timing.h"
#include "bench/int_options.h"
#include "kernels/cuda/runtime.h"  // DIVLAB_CUDA_CHECK, DIVLAB_CUBLAS_CHECK

namespace {
struct Mode {
  const char* name;
  cudaDataType_t in, out;
  cublasComputeType_t compute;
};

// Activations [tokens, k] times a weight [k, n]: in cuBLAS's column-major terms C[n, tokens] =
// W^T[n, k] X^T[k, tokens], the layout divlab's linear_forward uses.
double tflops(cublasHandle_t h, const Mode& m, int tokens, int k, int n, int reps, void* A, void* B,
              void* C) {
  const float alpha = 1, beta = 0;
  auto run = [&] {
    DIVLAB_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, tokens, k, &alpha, A, m.in, k,
                                     B, m.in, k, &beta, C, m.out, n, m.compute,
                                     CUBLAS_GEMM_DEFAULT));
  };
  const float ms = mean_ms(run, reps, 3);
  return 2.0 * tokens * double(k) * n / (ms * 1e-3) / 1e12;
}
}  // namespace

static int run(int argc, char** argv) {
  int tokens = 8192, C = 512, V = 8192, reps = 50;
  if (const int rc = parse_int_options(
          "bench_gemm_modes", argc, argv,
          {{"--tokens", &tokens}, {"--d-model", &C}, {"--vocab", &V}, {"--reps", &reps}}))
    return rc;
  const Mode modes[] = {
      {"fp32 ops, FAST_16BF (divlab bf16)", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF},
      {"bf16 ops, fp32 out", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
      {"bf16 ops, bf16 out", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
      {"fp32 ops, TF32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
      {"fp32 (divlab fp32)", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
  };
  struct Shape {
    const char* name;
    int k, n;
  };
  const Shape shapes[] = {{"qkv", C, 3 * C},
                          {"attn proj", C, C},
                          {"mlp up", C, 4 * C},
                          {"mlp down", 4 * C, C},
                          {"lm head", C, V}};
  size_t most = 0;
  for (const auto& s : shapes)
    most = std::max(most, std::max(size_t(s.k) * s.n, size_t(tokens) * std::max(s.k, s.n)));
  void *A, *B, *Cbuf;
  DIVLAB_CUDA_CHECK(cudaMalloc(&A, most * 4));
  DIVLAB_CUDA_CHECK(cudaMalloc(&B, most * 4));
  DIVLAB_CUDA_CHECK(cudaMalloc(&Cbuf, most * 4));
  // Words 0x3cXX3cYY: as fp32 and as two bf16s alike, numbers of modest magnitude (~0.01).
  std::vector<uint32_t> host(most);
  uint32_t x = 12345;
  for (auto& h : host) {
    x = x * 1664525u + 1013904223u;
    h = 0x3c003c00u | ((x >> 9) & 0x007f0000u) | ((x >> 20) & 0x7fu);
  }
  DIVLAB_CUDA_CHECK(cudaMemcpy(A, host.data(), most * 4, cudaMemcpyHostToDevice));
  DIVLAB_CUDA_CHECK(cudaMemcpy(B, host.data(), most * 4, cudaMemcpyHostToDevice));
  cublasHandle_t h;
  DIVLAB_CUBLAS_CHECK(cublasCreate(&h));
  cudaDeviceProp prop{};
  DIVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GEMM modes on %s: tokens %d, C %d, V %d, %d reps (TFLOP/s; x = vs divlab bf16)\n",
              prop.name, tokens, C, V, reps);
  std::printf("%-10s %-12s", "gemm", "k x n");
  for (const auto& m : modes) std::printf("  %-34s", m.name);
  std::printf("\n");
  for (const auto& s : shapes) {
    char kn[32];
    std::snprintf(kn, sizeof kn, "%dx%d", s.k, s.n);
    std::printf("%-10s %-12s", s.name, kn);
    double base = 0;
    for (const auto& m : modes) {
      const double t = tflops(h, m, tokens, s.k, s.n, reps, A, B, Cbuf);
      if (base == 0) base = t;
      char cell[48];
      std::snprintf(cell, sizeof cell, "%7.1f (%.2fx)", t, t / base);
      std::printf("  %-34s", cell);
    }
    std::printf("\n");
  }
  DIVLAB_CUBLAS_CHECK(cublasDestroy(h));
  return 0;
}

int main(int argc, char** argv) {
  return main_reporting_cuda_errors("bench_gemm_modes", run, argc, argv);
}
