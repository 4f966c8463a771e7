#include <cmath>

#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/common/parallel.h"

namespace divlab {

template <class T>
void add_rmsnorm_rows(T* xout, T* y, T* rstd, const T* a, const T* b, const T* w, int64_t rows,
                      int C, T eps) {
  parallel_chunks(rows, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T ss = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T v = a[n * C + c] + b[n * C + c];
        xout[n * C + c] = v;
        ss += v * v;
      }
      // The same expression as rmsnorm_forward's reference, so the fused op equals add followed
      // by rmsnorm_forward bit for bit.
      const T r = T(1) / std::sqrt(ss / T(C) + eps);
      rstd[n] = r;
      for (int64_t c = 0; c < C; ++c) y[n * C + c] = xout[n * C + c] * r * w[c];
    }
  });
}

template <class T>
void add_rmsnorm_forward_reference(T* xout, T* y, T* rstd, const T* a, const T* b, const T* w,
                                   int B, int T_, int C, T eps) {
  add_rmsnorm_rows(xout, y, rstd, a, b, w, int64_t(B) * T_, C, eps);
}

template <class T>
void register_add_rmsnorm(Catalogue<T>& cat) {
  cat.add_rmsnorm_forward.what = "fused residual add + RMSNorm forward (llama blocks)";
  cat.add_rmsnorm_forward.add("reference", add_rmsnorm_forward_reference<T>,
                              {"one pass per row: add, sum of squares, scale", "", "", ""});
}

template void add_rmsnorm_rows(float*, float*, float*, const float*, const float*, const float*,
                               int64_t, int, float);
template void add_rmsnorm_rows(double*, double*, double*, const double*, const double*,
                               const double*, int64_t, int, double);
template void register_add_rmsnorm(Catalogue<float>&);
template void register_add_rmsnorm(Catalogue<double>&);
}  // namespace divlab
