// Candidate variants of the RMSNorm ops.
#include <cmath>
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/common/parallel.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace divlab {
namespace {

template <class T>
void eps_outside_sqrt(T* y, T* rstd, const T* x, const T* w, int N, int C, T eps) {
  rmsnorm_forward_with(y, rstd, x, w, N, C, [eps](T ms) { return T(1) / (std::sqrt(ms) + eps); });
}

template <class T>
void no_eps(T* y, T* rstd, const T* x, const T* w, int N, int C, T) {
  rmsnorm_forward_with(y, rstd, x, w, N, C, [](T ms) { return T(1) / std::sqrt(ms); });
}

// The weight gradient summed over all rows in a bf16 accumulator (as in reported RMSNorm and
// LayerNorm backward kernels that reduce dW in the parameter dtype).
template <class T>
void bf16_reduce(T* dresid, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int N,
                 int C) {
  // The input gradient is the reference's own (its weight gradient goes to a scratch buffer).
  std::vector<T> discard(C, T(0));
  rmsnorm_backward_reference(dresid, discard.data(), dy, x, w, rstd, N, C);
  parallel_chunks(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float acc = lowp::bf16_rne(float(dw[c]));
      for (int64_t n = 0; n < N; ++n)
        acc = lowp::bf16_rne(acc + float(dy[n * C + c] * x[n * C + c] * rstd[n]));
      dw[c] = T(acc);
    }
  });
}
}  // namespace

template <class T>
void register_rmsnorm_variants(Catalogue<T>& cat) {
  cat.rmsnorm_forward.add(
      "eps_outside_sqrt", eps_outside_sqrt<T>,
      {"rstd = 1 / (sqrt(mean(x^2)) + eps) instead of 1 / sqrt(mean(x^2) + eps)",
       "a different function: rows with RMS near eps are scaled very differently",
       "rows of tiny activations (RMS ~ eps), e.g. dead or heavily decayed features",
       "normal-scale activations: the relative difference is ~ eps / RMS ~ 1e-5"});
  cat.rmsnorm_forward.add(
      "no_eps", no_eps<T>,
      {"rstd = 1 / sqrt(mean(x^2)): eps left out", "an all-zero row divides by zero: inf * 0 = NaN",
       "an all-zero input row (zero-initialised or padded positions)",
       "any row with nonzero activations: identical to the reference up to "
       "~eps / mean(x^2)"});
  cat.rmsnorm_backward.add(
      "bf16_reduce", bf16_reduce<T>,
      {"the weight gradient dw summed over the batch's rows in a bf16 accumulator",
       "like the seed bug on another op: once |acc| > 2^8 |term|, later rows' terms round away",
       "many rows per step (large batch x seq_len) with same-sign per-channel terms",
       "small batches; AdamW (the norm gains' step size does not depend on the gradient scale)"});
}

template void register_rmsnorm_variants(Catalogue<float>&);
template void register_rmsnorm_variants(Catalogue<double>&);
}  // namespace divlab
