// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, per row of C channels.
// The row-wise pieces are shared with the fused embed_rmsnorm_backward op.
#pragma once
#include "kernels/common/parallel.h"
#include "kernels/registry.h"

namespace divlab {
// The forward with the reciprocal RMS computed by rstd_of(mean(x^2)); the reference passes
// 1 / sqrt(ms + eps), the eps variants something else.
template <class T, class Rstd>
void rmsnorm_forward_with(T* y, T* rstd, const T* x, const T* w, int N, int C, Rstd rstd_of) {
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* xr = x + n * C;
      T ss = 0;
      for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
      const T r = rstd_of(ss / T(C));
      rstd[n] = r;
      for (int c = 0; c < C; ++c) y[n * C + c] = xr[c] * r * w[c];
    }
  });
}

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
