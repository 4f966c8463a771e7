#include <cmath>
#include <vector>

#include "kernels/common/parallel.h"
#include "kernels/optimizer/optimizer.h"

namespace divlab {

constexpr int64_t kOptChunk = 1 << 14;

template <class T>
void sum_squares_reference(double* out, const T* g, int64_t n) {
  // Per-chunk partial sums, then summed in chunk order: fixed order for any thread count.
  const int64_t chunks = (n + kOptChunk - 1) / kOptChunk;
  std::vector<double> partial(chunks, 0.0);
  parallel_chunks(n, kOptChunk, [&](int64_t i0, int64_t i1) {
    double s = 0;
    for (int64_t i = i0; i < i1; ++i) s += double(g[i]) * double(g[i]);
    partial[i0 / kOptChunk] = s;
  });
  double total = 0;
  for (double s : partial) total += s;
  *out = total;
}

template <class T>
void sgd_step_reference(T* p, T* buf, const T* g, int64_t n, T lr, T momentum, bool nesterov,
                        T weight_decay, T grad_scale) {
  parallel_chunks(n, kOptChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T d = g[i] * grad_scale + weight_decay * p[i];
      if (momentum != T(0)) {
        buf[i] = momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  });
}

template <class T>
void adamw_step_reference(T* p, T* m, T* v, const T* g, int64_t n, T lr, T beta1, T beta2, T eps,
                          T weight_decay, T grad_scale, int64_t step) {
  const T c1 = T(1) - std::pow(beta1, T(step));
  const T c2 = T(1) - std::pow(beta2, T(step));
  parallel_chunks(n, kOptChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T gi = g[i] * grad_scale;
      p[i] *= T(1) - lr * weight_decay;
      m[i] = beta1 * m[i] + (T(1) - beta1) * gi;
      v[i] = beta2 * v[i] + (T(1) - beta2) * gi * gi;
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  });
}

template <class T>
void register_optimizer(Catalogue<T>& cat) {
  cat.sum_squares.what = "sum of squared gradients (global norm for clipping)";
  cat.sum_squares.add("reference", sum_squares_reference<T>,
                      {"fp64 partial sums over fixed chunks", "", "", ""});
  cat.sgd_step.what = "SGD update (momentum, optional Nesterov, coupled weight decay)";
  cat.sgd_step.add("reference", sgd_step_reference<T>, {"PyTorch semantics", "", "", ""});
  cat.adamw_step.what = "AdamW update (decoupled weight decay, bias-corrected moments)";
  cat.adamw_step.add("reference", adamw_step_reference<T>, {"PyTorch semantics", "", "", ""});
}

template void sum_squares_reference(double*, const float*, int64_t);
template void sum_squares_reference(double*, const double*, int64_t);
template void register_optimizer(Catalogue<float>&);
template void register_optimizer(Catalogue<double>&);
}  // namespace divlab
