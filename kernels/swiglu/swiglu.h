// SwiGLU (Shazeer 2020), the llama MLP's gate: y = silu(gate) * up with silu(g) = g sigmoid(g),
// gate and up the two halves of one projection's row (gate | up, F channels each).
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/registry.h"

namespace divlab {

// sigmoid without overflow for either sign.
template <class T>
inline T sigmoid(T g) {
  if (g >= T(0)) return T(1) / (T(1) + std::exp(-g));
  const T e = std::exp(g);
  return e / (T(1) + e);
}

template <class T>
void swiglu_forward_reference(T* y, const T* x, int N, int F);
template <class T>
void swiglu_backward_reference(T* dx, const T* dy, const T* x, int N, int F);
// One row's gradients: d gate and d up of y = silu(g) u.
template <class T>
inline void swiglu_grads(T g, T u, T dy, T* dgate, T* dup) {
  const T s = sigmoid(g);
  *dup = dy * g * s;
  *dgate = dy * u * s * (T(1) + g * (T(1) - s));
}

template <class T>
void register_swiglu(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_swiglu_variants(Catalogue<T>& cat);
}  // namespace divlab
