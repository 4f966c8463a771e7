// Bit-exact emulation of low-precision storage on the CPU, for the candidate variants.
//
// bf16 keeps float's 8 exponent bits and the top 7 of its 23 fraction bits (8 significant bits).
// Adding x to an accumulator a rounds x away entirely when |x| < ulp(a) / 2 ~ |a| 2^-9: with
// many same-sign contributions of similar size, a bf16 sum stalls near 256 of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

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

}  // namespace divlab::lowp
