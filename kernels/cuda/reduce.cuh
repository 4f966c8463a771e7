// Deterministic reductions for the CUDA kernels: fixed trees, no atomics, so a reference kernel
// gives bitwise the same result on every run.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/op_context.h"

namespace divlab::cuda {

template <class T>
__device__ inline T warp_sum(T v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
template <class T>
__device__ inline T warp_max(T v) {
  for (int off = 16; off > 0; off /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 values. Safe to call repeatedly in one kernel.
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

// out[c] += sum over rows r of in[r, c] for a [rows, cols] row-major matrix, in a fixed order
// (row chunks summed in chunk order). Used for weight gradients of norms and position embeddings.
void column_sums_add(const OpContext& ctx, float* out, const float* in, int rows, int cols);

}  // namespace divlab::cuda
