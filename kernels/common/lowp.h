// Bit-exact emulation of low-precision storage on the CPU, for the candidate variants.
//
// bf16 keeps float's 8 exponent bits and the top 7 of its 23 fraction bits (8 significant bits).
// Adding x to an accumulator a rounds x away entirely when |x| < ulp(a) / 2 ~ |a| 2^-9: with
// many same-sign contributions of similar size, a bf16 sum stalls near 256 of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// The bit-level helpers below also compile as CUDA device code: the GPU candidates round the
// same way, bit for bit.
#ifdef __CUDACC__
#define DIVLAB_HOST_DEVICE __host__ __device__
#else
#define DIVLAB_HOST_DEVICE
#endif

namespace divlab::lowp {

DIVLAB_HOST_DEVICE inline uint32_t bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
DIVLAB_HOST_DEVICE inline float from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// float -> bf16 -> float, round to nearest, ties to even (what hardware conversions do).
DIVLAB_HOST_DEVICE inline float bf16_rne(float x) {
  uint32_t u = bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf and NaN pass through
  u += 0x7fffu + ((u >> 16) & 1u);
  return from_bits(u & 0xffff0000u);
}

// float -> bf16 -> float by dropping the low 16 bits: round toward zero. The cheap conversion
// (a shift) that is biased: every rounding shrinks the magnitude.
DIVLAB_HOST_DEVICE inline float bf16_truncate(float x) {
  return from_bits(bits(x) & 0xffff0000u);
}

// Stochastic rounding: round up in magnitude with probability equal to the dropped fraction,
// given 16 random bits. Unbiased in expectation when the bits are fresh for every rounding.
DIVLAB_HOST_DEVICE inline float bf16_stochastic(float x, uint32_t random16) {
  uint32_t u = bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u += random16 & 0xffffu;
  return from_bits(u & 0xffff0000u);
}

// float -> IEEE half -> float in software, round to nearest even: 11 significant bits for
// normals, a fixed quantum of 2^-24 below 2^-14, inf above 65504. For compilers without
// _Float16 on the target (clang 14 on x86-64: the fuzz preset); tested against _Float16.
inline float fp16_rne_soft(float x) {
  if (!std::isfinite(x)) return x;
  const float a = std::fabs(x);
  if (a >= 65520.0f) return std::copysign(INFINITY, x);  // halfway above 65504 rounds up
  int e = 0;
  std::frexp(a, &e);
  const float quantum = std::ldexp(1.0f, std::max(e - 11, -24));
  return std::copysign(std::nearbyint(a / quantum) * quantum, x);
}

// float -> IEEE half -> float, round to nearest even; overflows to inf above 65504.
inline float fp16_rne(float x) {
#ifdef __FLT16_MAX__
  return float(static_cast<_Float16>(x));
#else
  return fp16_rne_soft(x);
#endif
}

// IEEE half bits of x rounded to nearest even (inf above 65504; NaN stays a NaN), and the value
// of such bits: the storage of fp16 activations (plug-in kernels written for fp16).
inline uint16_t fp16_bits(float x) {
  const float r = fp16_rne(x);
  const uint32_t u = bits(r);
  const auto sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(r);
  if (std::isnan(r)) return sign | 0x7e00u;
  if (std::isinf(r)) return sign | 0x7c00u;
  if (a < 0x1p-14f) return sign | uint16_t(a * 0x1p24f);  // a subnormal: k 2^-24, k < 1024
  const int exponent = int((u >> 23) & 0xffu) - 127;      // -14 .. 15
  return sign | uint16_t((exponent + 15) << 10) | uint16_t((u >> 13) & 0x3ffu);
}
inline float fp16_value(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, m = h & 0x3ffu;
  const int exponent = (h >> 10) & 0x1f;
  if (exponent == 0) return from_bits(sign | bits(float(m) * 0x1p-24f));
  if (exponent == 31) return from_bits(sign | 0x7f800000u | (m << 13));
  return from_bits(sign | (uint32_t(exponent - 15 + 127) << 23) | (m << 13));
}

}  // namespace divlab::lowp

namespace divlab {

// bf16 as a storage type: the activations of the GPU's bf16 mode (kernels/ops.h). Plain data,
// usable in host code without CUDA; device code reinterprets it as __nv_bfloat16 (same layout).
struct bf16 {
  uint16_t bits;
};
DIVLAB_HOST_DEVICE inline float widen(bf16 x) {
  return lowp::from_bits(uint32_t(x.bits) << 16);
}
DIVLAB_HOST_DEVICE inline bf16 to_bf16(float x) {  // round to nearest even
  return bf16{uint16_t(lowp::bits(lowp::bf16_rne(x)) >> 16)};
}

// IEEE half as a storage type: the activations of an fp16 plug-in kernel (kernels/plugin_abi.h),
// which the fp32 mode runs on fp16 copies (kernels/fp16_activations.h). Host code only.
struct fp16 {
  uint16_t bits;
};
inline float widen(fp16 x) {
  return lowp::fp16_value(x.bits);
}
inline fp16 to_fp16(float x) {  // round to nearest even
  return fp16{lowp::fp16_bits(x)};
}

// Any storage value as a double, and a double stored as V (bf16: rounded to nearest even).
inline double to_double(float x) {
  return x;
}
inline double to_double(double x) {
  return x;
}
inline double to_double(bf16 x) {
  return widen(x);
}
template <class V>
V stored_as(double x) {
  if constexpr (std::is_same_v<V, bf16>)
    return to_bf16(float(x));
  else
    return V(x);
}

// The storage type of an array passed without its C++ type (op outputs seen by observers).
enum class Storage { F32, F64, Bf16 };
template <class V>
constexpr Storage storage_of() {
  static_assert(std::is_same_v<V, float> || std::is_same_v<V, double> || std::is_same_v<V, bf16>);
  return std::is_same_v<V, float>    ? Storage::F32
         : std::is_same_v<V, double> ? Storage::F64
                                     : Storage::Bf16;
}
inline size_t storage_bytes(Storage s) {
  return s == Storage::F64 ? 8 : s == Storage::F32 ? 4 : 2;
}
// Element i of an array of storage s, as a double.
inline double stored_value(const void* p, Storage s, int64_t i) {
  if (s == Storage::F32) return static_cast<const float*>(p)[i];
  if (s == Storage::F64) return static_cast<const double*>(p)[i];
  return widen(static_cast<const bf16*>(p)[i]);
}

}  // namespace divlab
