#include <cmath>
#include <limits>

#include "kernels/attention/attention.h"
#include "kernels/common/parallel.h"

namespace divlab {

// One (batch, head) pair per work item; every sum stays inside its item, so the result does not
// depend on the thread count. Scores are T x T and small at this lab's sequence lengths.

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
      // Position i sees 0..i + lookahead. Subtracting the row max before exp keeps large scores
      // from overflowing.
      const int last = std::min(T_ - 1, i + lookahead);
      T mx = subtract_max ? -std::numeric_limits<T>::infinity() : T(0);
      if (subtract_max)
        for (int j = 0; j <= last; ++j) mx = std::max(mx, P(i, j));
      T sum = 0;
      for (int j = 0; j <= last; ++j) sum += (P(i, j) = std::exp(P(i, j) - mx));
      for (int j = 0; j <= last; ++j) P(i, j) /= sum;
      for (int j = last + 1; j < T_; ++j) P(i, j) = 0;
    }
    auto O = matrix(out + b * T_ * C + h * hs, T_, hs, C);
    // Causal: read only the lower triangle. With a full product the zeroed future entries still
    // take part in the vectorised sums, and an earlier output moved in its last bits when a later
    // position's values changed (tests/Attention.IsCausal caught it with -march=native).
    if (lookahead == 0)
      O.noalias() = P.template triangularView<Eigen::Lower>() * V;
    else
      O.noalias() = P * V;
  });
}

template <class T>
void attention_forward_reference(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  attention_forward_with(out, att, qkv, B, T_, C, NH, 0, true);
}

template <class T>
void attention_backward_reference(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int T_,
                                  int C, int NH) {
  const int hs = C / NH;
  const T scale = T(1) / std::sqrt(T(hs));
  parallel_chunks(int64_t(B) * NH, 1, [&](int64_t bh, int64_t) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* base = qkv + b * T_ * 3 * C + h * hs;
    T* dbase = dqkv + b * T_ * 3 * C + h * hs;
    const auto Q = matrix(base, T_, hs, 3 * C);
    const auto K = matrix(base + C, T_, hs, 3 * C);
    const auto V = matrix(base + 2 * C, T_, hs, 3 * C);
    const auto P = matrix(att + bh * T_ * T_, T_, T_, T_);
    const auto dO = matrix(dout + b * T_ * C + h * hs, T_, hs, C);
    RowMatrix<T> dP = dO * V.transpose();
    matrix(dbase + 2 * C, T_, hs, 3 * C).noalias() = P.transpose() * dO;
    // Softmax backward: dS = P * (dP - rowsum(P * dP)). Masked entries have P = 0; the sum
    // runs over the whole row so that a forward variant with another mask is differentiated
    // consistently.
    for (int i = 0; i < T_; ++i) {
      T dot = 0;
      for (int j = 0; j < T_; ++j) dot += P(i, j) * dP(i, j);
      for (int j = 0; j < T_; ++j) dP(i, j) = P(i, j) * (dP(i, j) - dot) * scale;
    }
    matrix(dbase, T_, hs, 3 * C).noalias() = dP * K;
    matrix(dbase + C, T_, hs, 3 * C).noalias() = dP.transpose() * Q;
  });
}

template <class T>
void register_attention(Catalogue<T>& cat) {
  cat.attention_forward.what = "causal multi-head attention forward (softmax probabilities saved)";
  cat.attention_forward.add("reference", attention_forward_reference<T>,
                            {"materialised T x T scores, max-subtracted softmax", "", "", ""});
  cat.attention_backward.what = "causal multi-head attention backward";
  cat.attention_backward.add("reference", attention_backward_reference<T>,
                             {"from the saved probabilities", "", "", ""});
}

template void attention_forward_with(float*, float*, const float*, int, int, int, int, int, bool);
template void attention_forward_with(double*, double*, const double*, int, int, int, int, int,
                                     bool);
template void attention_forward_reference(float*, float*, const float*, int, int, int, int);
template void attention_forward_reference(double*, double*, const double*, int, int, int, int);
template void register_attention(Catalogue<float>&);
template void register_attention(Catalogue<double>&);
}  // namespace divlab
