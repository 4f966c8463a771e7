// Activation storage on the GPU: every kernel computes in fp32 and reads and writes activations
// as A (float in fp32 mode, bf16 in bf16 mode; kernels/ops.h). load() widens, store<A>() rounds
// to nearest even (the hardware conversion), so the two modes share one kernel source.
#pragma once

#include <cuda_bf16.h>
#include <library_types.h>

#include "kernels/common/lowp.h"

namespace divlab::cuda {

__device__ __forceinline__ float load(float x) {
  return x;
}
__device__ __forceinline__ float load(bf16 x) {
  return __uint_as_float(uint32_t(x.bits) << 16);
}

template <class A>
__device__ __forceinline__ A store(float x);
template <>
__device__ __forceinline__ float store<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 store<bf16>(float x) {
  return bf16{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
}

// The cuBLAS / cuDNN element type of a storage type.
template <class A>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<A, bf16> ? CUDA_R_16BF : CUDA_R_32F;
}

// For libraries that take __nv_bfloat16 (same layout as bf16).
inline __nv_bfloat16* as_nv(bf16* p) {
  return reinterpret_cast<__nv_bfloat16*>(p);
}
inline const __nv_bfloat16* as_nv(const bf16* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}

}  // namespace divlab::cuda
