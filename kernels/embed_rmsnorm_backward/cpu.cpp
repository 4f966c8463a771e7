#include "kernels/common/parallel.h"
#include "kernels/embed_rmsnorm_backward/embed_rmsnorm_backward.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace divlab {

template <class T>
std::vector<T> embed_rmsnorm_dx0(T* dw_norm, const T* dy_norm, const T* dresid, const T* x0,
                                 const T* w_norm, const T* rstd, int N, int C) {
  std::vector<T> dx0(dresid, dresid + int64_t(N) * C);
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      rmsnorm_backward_row(dx0.data() + n * C, dy_norm + n * C, x0 + n * C, w_norm, rstd[n], C);
  });
  rmsnorm_weight_grad(dw_norm, dy_norm, x0, rstd, N, C);
  return dx0;
}

template <class T>
void position_grad(T* dwpe, const T* dx0, int B, int T_, int C) {
  parallel_chunks(int64_t(T_) * C, 256, [&](int64_t i0, int64_t i1) {
    for (int b = 0; b < B; ++b)
      for (int64_t i = i0; i < i1; ++i) dwpe[i] += dx0[int64_t(b) * T_ * C + i];
  });
}

// The reference scatter: every token row is summed in the working precision (fp32 in training,
// fp64 in gradchecks), in position order. Parallel over channel blocks, so no two threads ever
// touch the same element and the order is the same for any thread count.
template <class T>
void embed_rmsnorm_backward_reference(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm,
                                      const T* dresid, const T* x0, const T* w_norm, const T* rstd,
                                      const TokenId* tokens, int B, int T_, int C, int /*V*/) {
  const int64_t N = int64_t(B) * T_;
  const std::vector<T> dx0 = embed_rmsnorm_dx0(dw_norm, dy_norm, dresid, x0, w_norm, rstd, N, C);
  parallel_chunks(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      T* row = dwte + int64_t(tokens[n]) * C;
      for (int64_t c = c0; c < c1; ++c) row[c] += dx0[n * C + c];
    }
  });
  position_grad(dwpe, dx0.data(), B, T_, C);
}

template <class T>
void register_embed_rmsnorm_backward(Catalogue<T>& cat) {
  cat.embed_rmsnorm_backward.what =
      "fused first-RMSNorm backward + residual gradient + embedding-gradient scatter";
  cat.embed_rmsnorm_backward.add(
      "reference", embed_rmsnorm_backward_reference<T>,
      {"each token row accumulated in working precision (fp32), in position order", "", "", ""});
}

template std::vector<float> embed_rmsnorm_dx0(float*, const float*, const float*, const float*,
                                              const float*, const float*, int, int);
template std::vector<double> embed_rmsnorm_dx0(double*, const double*, const double*, const double*,
                                               const double*, const double*, int, int);
template void position_grad(float*, const float*, int, int, int);
template void position_grad(double*, const double*, int, int, int);
template void register_embed_rmsnorm_backward(Catalogue<float>&);
template void register_embed_rmsnorm_backward(Catalogue<double>&);
}  // namespace divlab
