// Row kernels with one warp per row, the row held in registers: lane l holds the 4-value chunks
// l, l + 32, l + 64, ... of its row (K chunks at most, so C <= 128 K). Each value is read once
// with 8- or 16-byte loads, the row is reduced with warp shuffles (no block barriers) and written
// once. One block per row with a strided loop waits on each load in turn: RMSNorm's backward at
// GPT-2 small took 147 us per call where its bytes need about 60.
//
// A launcher picks K from C (row_chunks) and falls back to its general kernel where the fast
// form does not apply (C not a multiple of 4, wider than kMaxRowChunks * 128, or a pointer not
// 16-byte aligned). Every sum is in a fixed order (chunks in order within a lane, then the
// shuffle tree), so results repeat bitwise.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/storage.cuh"

namespace divlab::cuda {

constexpr int kRowWarps = 8;        // rows (warps) per block
constexpr int kMaxRowChunks = 8;    // C <= 1024 in registers
constexpr int kRowChunkValues = 4;  // values per chunk

// The chunk count to instantiate for C (1, 2, 3, 4, 6 or 8), or 0 where the warp form does
// not apply to C; the launcher also checks alignment with packable().
inline int row_chunks(int C) {
  if (C <= 0 || C % kRowChunkValues != 0 || C > kMaxRowChunks * 32 * kRowChunkValues) return 0;
  const int need = (C / kRowChunkValues + 31) / 32;
  for (int k : {1, 2, 3, 4, 6, 8})
    if (k >= need) return k;
  return 0;
}

// Calls f(std::integral_constant<int, K>) for row_chunks(C) = K (which must be non-zero).
template <class F>
void with_row_chunks(int chunks, F&& f) {
  switch (chunks) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// Four consecutive values from chunk `chunk` of p (float: one 16-byte load; bf16: one 8-byte).
__device__ __forceinline__ float4 load4(const float* p, int chunk) {
  return reinterpret_cast<const float4*>(p)[chunk];
}
__device__ __forceinline__ float4 load4(const bf16* p, int chunk) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[chunk];
  return {__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
          __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u)};
}
__device__ __forceinline__ void store4(float* p, int chunk, float4 v) {
  reinterpret_cast<float4*>(p)[chunk] = v;
}
__device__ __forceinline__ void store4(bf16* p, int chunk, float4 v) {
  const auto bits = [](float x) { return uint32_t(store<bf16>(x).bits); };
  reinterpret_cast<uint2*>(p)[chunk] = {bits(v.x) | bits(v.y) << 16, bits(v.z) | bits(v.w) << 16};
}

__device__ __forceinline__ float sum_of_squares(float4 v) {
  return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
}

// The end of a normalising row kernel: y = (v r) w over the lane's chunks of the row, and the
// row's r kept (for the backward) by lane 0.
template <int K, class A>
__device__ __forceinline__ void store_scaled_row(A* y_row, float* r_out, const float4 (&v)[K],
                                                 float r, const float* w, int chunks) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = lane + 32 * k;
    if (c >= chunks) continue;
    const float4 wk = load4(w, c);
    store4(y_row, c, {v[k].x * r * wk.x, v[k].y * r * wk.y, v[k].z * r * wk.z, v[k].w * r * wk.w});
  }
  if (lane == 0) *r_out = r;
}

}  // namespace divlab::cuda
