// Timing a GPU call in the benchmarks: CUDA events around `reps` calls on the legacy default
// stream, after `warmups` calls (heuristics, plans, clocks).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/runtime.h"  // DIVLAB_CUDA_CHECK

// Mean milliseconds per call.
template <class F>
float mean_ms(F&& call, int reps, int warmups) {
  for (int i = 0; i < warmups; ++i) call();
  cudaEvent_t start = nullptr, stop = nullptr;
  DIVLAB_CUDA_CHECK(cudaEventCreate(&start));
  DIVLAB_CUDA_CHECK(cudaEventCreate(&stop));
  DIVLAB_CUDA_CHECK(cudaEventRecord(start));
  for (int r = 0; r < reps; ++r) call();
  DIVLAB_CUDA_CHECK(cudaEventRecord(stop));
  DIVLAB_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  DIVLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / float(reps);
}
