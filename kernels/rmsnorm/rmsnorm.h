// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, per row of C channels.
// The row-wise pieces are shared with the fused embed_rmsnorm_backward op.
#pragma once
#include "kernels/registry.h"

namespace divlab {
template <class T>
void rmsnorm_forward_reference(T* y, T* rstd, const T* x, const T* w, int N, int C, T eps);
template <class T>
void rmsnorm_backward_reference(T* dresid, T* dw, const T* dy, const T* x, const T* w,
                                const T* rstd, int N, int C);

// dx_row += r * w * dy - r^3 / C * x * sum_c(dy * w * x), for one row.
template <class T>
inline void rmsnorm_backward_row(T* dx, const T* dy, const T* x, const T* w, T r, int C) {
  T dot = 0;
  for (int c = 0; c < C; ++c) dot += dy[c] * w[c] * x[c];
  const T k = r * r * r * dot / T(C);
  for (int c = 0; c < C; ++c) dx[c] += r * w[c] * dy[c] - k * x[c];
}

// dw[c] += sum_n dy[n, c] * x[n, c] * rstd[n]. Column-parallel: each column sums its rows in
// order on one thread, so the result does not depend on the thread count.
template <class T>
void rmsnorm_weight_grad(T* dw, const T* dy, const T* x, const T* rstd, int N, int C);

template <class T>
void register_rmsnorm(Catalogue<T>& cat);
// Candidate variants (variants.cpp), each documented where it is registered.
template <class T>
void register_rmsnorm_variants(Catalogue<T>& cat);
}  // namespace divlab
