// Timing a GPU call in the benchmarks: timing marks (CUDA events) around `reps` calls on the
// legacy default stream, after `warmups` calls (heuristics, plans, clocks).
#pragma once

#include <cuda_runtime.h>

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
