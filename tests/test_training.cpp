// A tiny model must be able to memorise one fixed batch with either optimizer: the end-to-end
// check that forward, backward and the optimizer agree with each other.
#include <algorithm>
#include <numeric>

#include "model/optimizer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
double overfit(const OptimConfig& oc, int steps) {
  ModelConfig m;
  m.vocab = 64, m.d_model = 32, m.n_layers = 2, m.n_heads = 2, m.seq_len = 16;
  const int B = 4, N = B * m.seq_len;
  Transformer<float> model(m, cpu_catalogue<float>().select({}), B);
  model.init(test_seed());
  Optimizer<float> optim(oc, model.layout(), host_memory());
  std::mt19937_64 gen(test_seed());
  std::vector<TokenId> in(N), tgt(N);
  for (int n = 0; n < N; ++n) in[n] = TokenId(gen() % m.vocab), tgt[n] = TokenId(gen() % m.vocab);
  // A sequence's first position sees only its own token: two sequences starting with the same
  // token and different targets leave ln 2 per pair that no model can memorise (k such starts,
  // k ln k / N). Distinct first tokens make the batch learnable to zero loss.
  std::vector<TokenId> firsts(m.vocab);
  std::iota(firsts.begin(), firsts.end(), TokenId(0));
  std::shuffle(firsts.begin(), firsts.end(), gen);
  for (int b = 0; b < B; ++b) in[b * m.seq_len] = firsts[b];
  for (int s = 0; s < steps; ++s) {
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    optim.step(model, s);
  }
  return model.forward(in.data(), tgt.data(), false);
}
}  // namespace

// lr 0.5 sits at the stability edge of this model: it diverged for 1 seed in 20 at lr 0.3.
TEST(Training, SgdOverfitsOneBatch) {
  OptimConfig oc;
  oc.kind = OptimizerKind::Sgd, oc.lr = 0.2, oc.momentum = 0.9, oc.total_steps = 300;
  EXPECT_LT(overfit(oc, 300), 0.05) << "seed " << test_seed();
}

TEST(Training, AdamwOverfitsOneBatch) {
  OptimConfig oc;
  oc.kind = OptimizerKind::AdamW, oc.lr = 1e-2, oc.weight_decay = 0.0, oc.total_steps = 300;
  EXPECT_LT(overfit(oc, 300), 0.05) << "seed " << test_seed();
}

TEST(Schedule, WarmupThenCosine) {
  OptimConfig oc;
  oc.lr = 1.0, oc.warmup_steps = 10, oc.schedule = LrSchedule::Cosine, oc.min_lr_ratio = 0.1,
  oc.total_steps = 110;
  EXPECT_DOUBLE_EQ(lr_at(oc, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(oc, 9), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(oc, 10), 1.0);
  EXPECT_NEAR(lr_at(oc, 60), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(oc, 110), 0.1, 1e-12);
}
}  // namespace divlab
