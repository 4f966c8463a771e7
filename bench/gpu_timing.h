// What the GPU benchmarks share: timing a call (timing marks, CUDA events, around `reps` calls on
// the legacy default stream, after `warmups` calls: heuristics, plans, clocks), and their main.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/cuda/runtime.h"  // device_seconds

// Mean milliseconds per call.
template <class F>
float mean_ms(F&& call, int reps, int warmups) {
  for (int i = 0; i < warmups; ++i) call();
  const double seconds = divlab::cuda::device_seconds(nullptr, [&] {
    for (int r = 0; r < reps; ++r) call();
  });
  return float(1e3 * seconds / reps);
}

// A benchmark's main: `run`, where a CUDA error ends the benchmark with one line and exit 1.
inline int main_reporting_cuda_errors(const char* name, int (*run)(int, char**), int argc,
                                      char** argv) {
  try {
    return run(argc, argv);
  } catch (const divlab::cuda::CudaError& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}
