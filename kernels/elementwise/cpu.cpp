#include "kernels/common/parallel.h"
#include "kernels/elementwise/elementwise.h"

namespace divlab {

constexpr int64_t kElemChunk = 1 << 14;

template <class T>
void gelu_forward_reference(T* y, const T* x, int64_t n) {
  parallel_chunks(n, kElemChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = gelu_tanh(x[i]);
  });
}

template <class T>
void gelu_backward_reference(T* dx, const T* dy, const T* x, int64_t n) {
  parallel_chunks(n, kElemChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dx[i] = gelu_tanh_grad(x[i]) * dy[i];
  });
}

template <class T>
void add_reference(T* y, const T* a, const T* b, int64_t n) {
  parallel_chunks(n, kElemChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  });
}

template <class T>
void register_elementwise(Catalogue<T>& cat) {
  cat.gelu_forward.what = "GELU forward (tanh approximation)";
  cat.gelu_forward.add("reference", gelu_forward_reference<T>,
                       {"std::tanh per element", "", "", ""});
  cat.gelu_backward.what = "GELU backward";
  cat.gelu_backward.add("reference", gelu_backward_reference<T>,
                        {"analytic derivative", "", "", ""});
  cat.add.what = "residual add";
  cat.add.add("reference", add_reference<T>, {"elementwise", "", "", ""});
}

template void gelu_forward_reference(float*, const float*, int64_t);
template void gelu_forward_reference(double*, const double*, int64_t);
template void register_elementwise(Catalogue<float>&);
template void register_elementwise(Catalogue<double>&);
}  // namespace divlab
