// linear: y[N, out] = x[N, in] W[out, in]^T, no bias. GEMMs through Eigen.
#pragma once
#include "kernels/registry.h"

namespace divlab {
template <class T>
void linear_forward_reference(T* y, const T* x, const T* W, int N, int in, int out);
template <class T>
void linear_backward_reference(T* dx, T* dW, const T* dy, const T* x, const T* W, int N, int in,
                               int out);
template <class T>
void register_linear(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_linear_variants(Catalogue<T>& cat);
}  // namespace divlab
