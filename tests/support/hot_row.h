// One step's batch with a hot id, and the error of that id's embedding-gradient row when the
// step runs in data-parallel ranks and micro-batches: what tests of the dose (the additions one
// low-precision accumulator receives) measure on either device.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "experiments/data_parallel.h"

namespace divlab::testing {

// N tokens, a third of them `hot`, which is always followed by hot + 1 (text's "of the"): its
// contributions share a direction, so its row's sum grows with the dose, not as its square root.
struct HotBatch {
  int hot = 5;
  std::vector<TokenId> in, tgt;
};
inline HotBatch hot_batch(int vocab, int64_t N, uint64_t seed) {
  HotBatch b;
  std::mt19937_64 gen(seed);
  for (int64_t n = 0; n < N; ++n) {
    b.in.push_back(gen() % 3 == 0 ? TokenId(b.hot) : TokenId(gen() % vocab));
    b.tgt.push_back(b.in.back() == b.hot ? TokenId(b.hot + 1) : TokenId(gen() % vocab));
  }
  return b;
}

// The hot row of the token embedding's gradient after one step of `model` (its batch one of
// `micro` micro-batches of one of `ranks` shards), in double.
template <class T, class A>
std::vector<double> hot_row_gradient(Transformer<T, A>& model, int ranks, int micro,
                                     const HotBatch& b) {
  DataParallelStep<T, A>(model, ranks, micro).run(b.in.data(), b.tgt.data(), 1, 0);
  const std::vector<T> g = model.grads().to_vector(model.stream());
  const size_t C = size_t(model.config().d_model);
  size_t at = 0;
  for (const ParamInfo& p : model.layout())
    if (p.name == "wte.weight") at = size_t(p.offset) + size_t(b.hot) * C;
  return std::vector<double>(g.begin() + at, g.begin() + at + C);
}

// |a - b| / |b| in L2.
inline double relative_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  return std::sqrt(diff / norm);
}

// The hot row's error (relative L2 against the reference kernels' whole-batch gradient) when
// `variant` of embed_rmsnorm_backward runs one step of 4096 tokens whole, in 4 micro-batches and
// over 4 ranks: what the dose tests on both devices compare.
struct SplitErrors {
  double whole, micro, ranks;
};
template <class A>
SplitErrors split_errors(const Catalogue<float, A>& catalogue, const std::string& variant,
                         uint64_t seed) {
  ModelConfig m;
  m.vocab = 64, m.d_model = 32, m.n_layers = 1, m.n_heads = 2, m.seq_len = 64;
  const int B = 64;
  const HotBatch batch = hot_batch(m.vocab, int64_t(B) * m.seq_len, seed);
  auto gradient = [&](const KernelSet<float, A>& k, int ranks, int micro) {
    Transformer<float, A> model(m, k, B / (ranks * micro));
    model.init(seed);
    return hot_row_gradient(model, ranks, micro, batch);
  };
  const std::vector<double> exact = gradient(catalogue.select({}), 1, 1);
  const KernelSet<float, A> k = catalogue.select({{"embed_rmsnorm_backward", variant}});
  return {relative_l2(gradient(k, 1, 1), exact), relative_l2(gradient(k, 1, 4), exact),
          relative_l2(gradient(k, 4, 1), exact)};
}

// What a low-precision accumulator's errors must show: a visible error as one batch, the same in
// micro-batches (to `micro_tolerance`, relative: the GPU's atomics add in another order), at
// most half of it over ranks; printed either way.
inline void expect_micro_batches_keep_the_dose(const SplitErrors& e, double micro_tolerance,
                                               uint64_t seed) {
  const std::string at = " (seed " + std::to_string(seed) + ")";
  EXPECT_GT(e.whole, 0.3) << "the error on the hot row at ~1400 additions" << at;
  EXPECT_NEAR(e.micro, e.whole, micro_tolerance * e.whole)
      << "4 micro-batches: the same dose" << at;
  EXPECT_LT(e.ranks, 0.5 * e.whole) << "4 ranks: a quarter of the dose" << at;
  std::printf("hot row's gradient error: whole batch %.4f, 4 micro-batches %.4f, 4 ranks %.4f\n",
              e.whole, e.micro, e.ranks);
}

}  // namespace divlab::testing
