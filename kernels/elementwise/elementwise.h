// Elementwise ops: tanh-approximated GELU (forward, backward) and the residual add.
#pragma once
#include <cmath>

#include "kernels/registry.h"

namespace divlab {

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's approximate="tanh".
template <class T>
inline T gelu_tanh(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2 / pi)
  return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
}
template <class T>
inline T gelu_tanh_grad(T x) {
  const T k = T(0.7978845608028654);
  const T t = std::tanh(k * (x + T(0.044715) * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3 * 0.044715) * x * x);
}

template <class T>
void gelu_forward_reference(T* y, const T* x, int64_t n);
template <class T>
void gelu_backward_reference(T* dx, const T* dy, const T* x, int64_t n);
template <class T>
void add_reference(T* y, const T* a, const T* b, int64_t n);
template <class T>
void register_elementwise(Catalogue<T>& cat);
}  // namespace divlab
