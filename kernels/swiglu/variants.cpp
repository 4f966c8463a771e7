// Candidate variants of SwiGLU.
#include "kernels/common/parallel.h"
#include "kernels/swiglu/swiglu.h"

namespace divlab {
namespace {

// The gate's gradient written into the up half and the up's into the gate half: an indexing slip
// in a fused backward that writes both halves from one thread.
template <class T>
void swapped_halves(T* dx, const T* dy, const T* x, int N, int F) {
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t f = 0; f < F; ++f)
        swiglu_grads(x[n * 2 * F + f], x[n * 2 * F + F + f], dy[n * F + f], &dx[n * 2 * F + F + f],
                     &dx[n * 2 * F + f]);
  });
}
}  // namespace

template <class T>
void register_swiglu_variants(Catalogue<T>& cat) {
  cat.swiglu_backward.add(
      "swapped_halves", swapped_halves<T>,
      {"the gate's gradient stored in the up half and the up's in the gate half",
       "both projections of the MLP's first layer train on the other's gradient",
       "any input: the two halves' gradients are different functions of gate and up",
       "forward-only verification; a loss that still falls for a while (the swapped gradient "
       "is correlated with the right one early in training)"});
}

template void register_swiglu_variants(Catalogue<float>&);
template void register_swiglu_variants(Catalogue<double>&);
}  // namespace divlab
