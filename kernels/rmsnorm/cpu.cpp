#include <cmath>

#include "kernels/common/parallel.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace divlab {

template <class T>
void rmsnorm_forward_reference(T* y, T* rstd, const T* x, const T* w, int N, int C, T eps) {
  rmsnorm_forward_with(y, rstd, x, w, N, C, [eps](T ms) { return T(1) / std::sqrt(ms + eps); });
}

// a * b + c rounded once where the machine has FMA (what the compiler's contraction made of
// `dw += dy * x * rstd` before), spelled out so the bits do not depend on how a loop of a given
// width is vectorised.
template <class T>
inline T multiply_add(T a, T b, T c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// dw[c0 + j] += sum_n dy[n, c0 + j] * x[n, c0 + j] * rstd[n] for j < w, rows in order, in a
// local accumulator stored into dw once (adding into dw row by row made every addition wait on
// the store before it). W: the width the loop is compiled for (0: any w up to kMaxWidth, a
// layer's last columns).
constexpr int kMaxWidth = 16;
template <int W, class T>
void column_sums(T* dw, const T* dy, const T* x, const T* rstd, int N, int C, int64_t c0,
                 int64_t w) {
  static_assert(W <= kMaxWidth);
  T sum[kMaxWidth];
  const int64_t width = W > 0 ? W : w;
  for (int64_t j = 0; j < width; ++j) sum[j] = dw[c0 + j];
  for (int64_t n = 0; n < N; ++n) {
    const T* dy_row = dy + n * C + c0;
    const T* x_row = x + n * C + c0;
    for (int64_t j = 0; j < width; ++j)
      sum[j] = multiply_add(dy_row[j] * x_row[j], rstd[n], sum[j]);
  }
  for (int64_t j = 0; j < width; ++j) dw[c0 + j] = sum[j];
}

// Column-parallel in chunks of 16 columns, a 64-byte line of an fp32 row, so threads do not share
// the lines they read (with chunks of 8 on a narrow layer, the next ops writing those rows took
// twice as long on 16 cores, more than the narrower chunks saved).
template <class T>
void rmsnorm_weight_grad(T* dw, const T* dy, const T* x, const T* rstd, int N, int C) {
  parallel_chunks(C, kMaxWidth, [&](int64_t c0, int64_t c1) {
    if (c1 - c0 == kMaxWidth) return column_sums<kMaxWidth>(dw, dy, x, rstd, N, C, c0, kMaxWidth);
    column_sums<0>(dw, dy, x, rstd, N, C, c0, c1 - c0);
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
