// Candidate variants of logit soft-capping.
#include <algorithm>

#include "kernels/softcap/softcap.h"

namespace divlab {
namespace {

// The reported kernel: the cap left out; the logits pass through (its backward passes the
// gradient through, the pair's other half).
template <class T>
void omitted_forward(T* y, const T* x, int64_t n, T) {
  std::copy(x, x + n, y);
}
template <class T>
void omitted_backward(T* dx, const T* dy, const T*, int64_t n, T) {
  std::copy(dy, dy + n, dx);
}
}  // namespace

template <class T>
void register_softcap_variants(Catalogue<T>& cat) {
  const VariantDoc doc{
      "THE REPORTED SOFT-CAP KERNEL: the cap left out, logits (and their gradient) passed through",
      "the identity instead of cap tanh(x / cap): logits are no longer bounded by the cap",
      "logits of realistic scale (|x| a sizeable fraction of the cap, e.g. a trained head, or "
      "a small cap); the loss of a model whose head learns large logits",
      "tests whose logits sit near zero (cap tanh(x / cap) = x - x^3 / (3 cap^2) + ...), e.g. "
      "Gaussian inputs with a cap of 30"};
  cat.softcap_forward.add("omitted", omitted_forward<T>, doc);
  cat.softcap_backward.add("omitted", omitted_backward<T>, doc);
  cat.softcap_forward.pair("omitted", "softcap_backward", "omitted");
}

template void register_softcap_variants(Catalogue<float>&);
template void register_softcap_variants(Catalogue<double>&);
}  // namespace divlab
