#include <cmath>

#include "kernels/common/parallel.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace divlab {

template <class T>
void rmsnorm_forward_reference(T* y, T* rstd, const T* x, const T* w, int N, int C, T eps) {
  rmsnorm_forward_with(y, rstd, x, w, N, C, [eps](T ms) { return T(1) / std::sqrt(ms + eps); });
}

template <class T>
void rmsnorm_weight_grad(T* dw, const T* dy, const T* x, const T* rstd, int N, int C) {
  constexpr int64_t kColChunk = 16;
  parallel_chunks(C, kColChunk, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = c0; c < c1; ++c) dw[c] += dy[n * C + c] * x[n * C + c] * rstd[n];
  });
}

template <class T>
void rmsnorm_backward_reference(T* dresid, T* dw, const T* dy, const T* x, const T* w,
                                const T* rstd, int N, int C) {
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      rmsnorm_backward_row(dresid + n * C, dy + n * C, x + n * C, w, rstd[n], C);
  });
  rmsnorm_weight_grad(dw, dy, x, rstd, N, C);
}

template <class T>
void register_rmsnorm(Catalogue<T>& cat) {
  cat.rmsnorm_forward.what = "RMSNorm forward, y = x * rsqrt(mean(x^2) + eps) * w";
  cat.rmsnorm_forward.add("reference", rmsnorm_forward_reference<T>,
                          {"per-row sum of squares in working precision", "", "", ""});
  cat.rmsnorm_backward.what = "RMSNorm backward into the residual gradient and the weight gradient";
  cat.rmsnorm_backward.add(
      "reference", rmsnorm_backward_reference<T>,
      {"row-parallel input gradient, column-parallel weight gradient", "", "", ""});
}

template void rmsnorm_weight_grad(float*, const float*, const float*, const float*, int, int);
template void rmsnorm_weight_grad(double*, const double*, const double*, const double*, int, int);
template void rmsnorm_forward_reference(float*, float*, const float*, const float*, int, int,
                                        float);
template void rmsnorm_forward_reference(double*, double*, const double*, const double*, int, int,
                                        double);
template void rmsnorm_backward_reference(float*, float*, const float*, const float*, const float*,
                                         const float*, int, int);
template void rmsnorm_backward_reference(double*, double*, const double*, const double*,
                                         const double*, const double*, int, int);
template void register_rmsnorm(Catalogue<float>&);
template void register_rmsnorm(Catalogue<double>&);
}  // namespace divlab
