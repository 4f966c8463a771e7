#include <cmath>

#include "kernels/common/parallel.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace divlab {

template <class T>
void cross_entropy_reference(T* losses, T* dlogits, const T* logits, const TokenId* targets, int N,
                             int V, T dloss) {
  parallel_chunks(N, kRowChunk / 4, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T* z = logits + n * V;
      const T target_logit = z[targets[n]];
      T mx = z[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
      // Each exponential once (they are most of this op's time): kept in the gradient's row,
      // then scaled by dloss / sum.
      T sum = 0;
      if (dlogits) {
        T* d = dlogits + n * V;
        for (int v = 0; v < V; ++v) sum += (d[v] = std::exp(z[v] - mx));
        const T scale = dloss / sum;
        for (int v = 0; v < V; ++v) d[v] *= scale;
        d[targets[n]] -= dloss;
      } else {
        for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
      }
      losses[n] = mx + std::log(sum) - target_logit;
    }
  });
}

template <class T>
void register_cross_entropy(Catalogue<T>& cat) {
  cat.cross_entropy.what = "softmax cross-entropy per row, fused with its gradient";
  cat.cross_entropy.add("reference", cross_entropy_reference<T>,
                        {"max-subtracted log-sum-exp in working precision", "", "", ""});
}

template void cross_entropy_reference(float*, float*, const float*, const TokenId*, int, int,
                                      float);
template void cross_entropy_reference(double*, double*, const double*, const TokenId*, int, int,
                                      double);
template void register_cross_entropy(Catalogue<float>&);
template void register_cross_entropy(Catalogue<double>&);
}  // namespace divlab
