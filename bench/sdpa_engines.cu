// What cuDNN offers for the fused attention at a model's shape: every engine configuration its
// heuristics (modes A, B and fallback) return for the SDPA forward and backward graphs
// (kernels/attention/cudnn_sdpa.h), in the order the op picks its plan from (the first is the
// one it runs; a configuration two modes offer is listed twice), each with whether cuDNN calls it
// deterministic, whether it gives the first's bits on random inputs, and its mean time. A faster
// configuration with the same bits could replace the first without changing a run's numbers.
//   build/cuda/bench/bench_sdpa_engines [--batch B] [--seq T] [--d-model C] [--heads H] [--reps R]
#include <cstdio>

#include "bench/gpu_timing.h"
#include "bench/int_options.h"
#include "kernels/attention/cudnn_sdpa.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/runtime.h"

static int run(int argc, char** argv) {
  int B = 16, T = 1024, C = 768, NH = 12, reps = 20;  // GPT-2 small, 16 x 1024 tokens
  if (const int rc = parse_int_options(
          "bench_sdpa_engines", argc, argv,
          {{"--batch", &B}, {"--seq", &T}, {"--d-model", &C}, {"--heads", &NH}, {"--reps", &reps}}))
    return rc;
  using namespace divlab::cuda;
  divlab::OpContextSource contexts(device_memory());
  const divlab::OpContext ctx = contexts.next();
  cudaDeviceProp prop{};
  DIVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("cuDNN %ld SDPA configurations on %s: B %d, T %d, C %d, %d heads, %d reps\n",
              cudnn_version(), prop.name, B, T, C, NH, reps);
  for (bool backward : {false, true}) {
    std::printf("%s\n%-4s %-10s %-14s %-9s %10s\n", backward ? "backward" : "forward", "#",
                "engine", "deterministic", "same bits", "us");
    int i = 0;
    for (const SdpaCandidate& c : cudnn_sdpa_candidates(ctx, backward, B, T, C, NH, reps))
      std::printf("%-4d %-10s %-14s %-9s %10.1f\n", i++, c.engine.c_str(),
                  c.deterministic ? "yes" : "no", c.same_bits ? "yes" : "no", 1e3 * c.ms);
  }
  return 0;
}

int main(int argc, char** argv) {
  return main_reporting_cuda_errors("bench_sdpa_engines", run, argc, argv);
}
