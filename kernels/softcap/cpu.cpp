#include <cmath>

#include "kernels/common/parallel.h"
#include "kernels/softcap/softcap.h"

namespace divlab {

constexpr int64_t kSoftcapChunk = 1 << 14;

template <class T>
void softcap_forward_reference(T* y, const T* x, int64_t n, T cap) {
  parallel_chunks(n, kSoftcapChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = cap * std::tanh(x[i] / cap);
  });
}

// 1 - tanh(u)^2 = 1 / cosh(u)^2, without the cancellation of the first form near the cap.
template <class T>
void softcap_backward_reference(T* dx, const T* dy, const T* x, int64_t n, T cap) {
  parallel_chunks(n, kSoftcapChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T c = std::cosh(x[i] / cap);
      dx[i] = dy[i] / (c * c);
    }
  });
}

template <class T>
void register_softcap(Catalogue<T>& cat) {
  cat.softcap_forward.what = "logit soft-capping, cap * tanh(x / cap)";
  cat.softcap_forward.add("reference", softcap_forward_reference<T>,
                          {"std::tanh per element", "", "", ""});
  cat.softcap_backward.what = "logit soft-capping backward";
  cat.softcap_backward.add("reference", softcap_backward_reference<T>,
                           {"dy / cosh(x / cap)^2 per element", "", "", ""});
}

template void register_softcap(Catalogue<float>&);
template void register_softcap(Catalogue<double>&);
}  // namespace divlab
