// Candidate variants of attention_forward.
#include <cmath>

#include "kernels/attention/attention.h"
#include "kernels/common/parallel.h"

namespace divlab {
namespace {

// The forward with two knobs: how far each query may look (`lookahead` = 0 is causal) and
// whether the softmax subtracts the row max.
template <class T>
void attention_forward_with(T* out, T* att, const T* qkv, int B, int T_, int C, int NH,
                            int lookahead, bool subtract_max) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(T(hs));
  parallel_chunks(int64_t(B) * NH, 1, [&](int64_t bh, int64_t) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* base = qkv + b * T_ * 3 * C + h * hs;
    const auto Q = matrix(base, T_, hs, 3 * C);
    const auto K = matrix(base + C, T_, hs, 3 * C);
    const auto V = matrix(base + 2 * C, T_, hs, 3 * C);
    auto P = matrix(att + bh * T_ * T_, T_, T_, T_);
    P.noalias() = (Q * K.transpose()) * scale;
    for (int i = 0; i < T_; ++i) {
      const int last = std::min(T_ - 1, i + lookahead);
      T mx = 0;
      if (subtract_max)
        for (int j = 0; j <= last; ++j) mx = std::max(mx, P(i, j));
      T sum = 0;
      for (int j = 0; j <= last; ++j) sum += (P(i, j) = std::exp(P(i, j) - mx));
      for (int j = 0; j <= last; ++j) P(i, j) /= sum;
      for (int j = last + 1; j < T_; ++j) P(i, j) = 0;
    }
    matrix(out + b * T_ * C + h * hs, T_, hs, C).noalias() = P * V;
  });
}

template <class T>
void mask_off_by_one(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  attention_forward_with(out, att, qkv, B, T_, C, NH, 1, true);
}
template <class T>
void no_max_subtraction(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  attention_forward_with(out, att, qkv, B, T_, C, NH, 0, false);
}
}  // namespace

template <class T>
void register_attention_variants(Catalogue<T>& cat) {
  cat.attention_forward.add(
      "mask_off_by_one", mask_off_by_one<T>,
      {"causal mask off by one: position i attends to 0..i+1",
       "every position sees the token it is trained to predict: training loss falls far below "
       "what the data allows, while the model learns nothing usable",
       "validation loss computed with the reference kernels (divlab always does): garbage",
       "training loss alone, which looks better than ever"});
  cat.attention_forward.add(
      "no_max_subtraction", no_max_subtraction<T>,
      {"softmax as exp(s) / sum exp(s), without subtracting the row max",
       "exp overflows to inf for scores above ~88 (fp32): inf / inf = NaN",
       "large attention scores: large weights, long training, high learning rates",
       "small scores (initialisation, Gaussian test inputs): identical to the reference up to "
       "rounding"});
}

template void register_attention_variants(Catalogue<float>&);
template void register_attention_variants(Catalogue<double>&);
}  // namespace divlab
