#include "kernels/common/parallel.h"
#include "kernels/swiglu/swiglu.h"

namespace divlab {

template <class T>
void swiglu_forward_reference(T* y, const T* x, int N, int F) {
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t f = 0; f < F; ++f) {
        const T g = x[n * 2 * F + f], u = x[n * 2 * F + F + f];
        y[n * F + f] = g * sigmoid(g) * u;
      }
  });
}

template <class T>
void swiglu_backward_reference(T* dx, const T* dy, const T* x, int N, int F) {
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t f = 0; f < F; ++f)
        swiglu_grads(x[n * 2 * F + f], x[n * 2 * F + F + f], dy[n * F + f], &dx[n * 2 * F + f],
                     &dx[n * 2 * F + F + f]);
  });
}

template <class T>
void register_swiglu(Catalogue<T>& cat) {
  cat.swiglu_forward.what = "SwiGLU: silu(gate) * up over the two halves of each row";
  cat.swiglu_forward.add("reference", swiglu_forward_reference<T>,
                         {"overflow-free sigmoid per element", "", "", ""});
  cat.swiglu_backward.what = "SwiGLU backward into the gate and up halves";
  cat.swiglu_backward.add("reference", swiglu_backward_reference<T>,
                          {"analytic derivative per element", "", "", ""});
}

template void register_swiglu(Catalogue<float>&);
template void register_swiglu(Catalogue<double>&);
}  // namespace divlab
