// Shadow mode's tap: comparing on a worker thread (as on the GPU) gives exactly the metrics of
// comparing in the training thread, in step order, and tapping never changes the run.
#include <cmath>
#include <cstring>

#include "kernels/shadow.h"
#include "model/transformer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
ModelConfig shadow_model() {
  ModelConfig m;
  m.vocab = 64, m.d_model = 16, m.n_layers = 2, m.n_heads = 2, m.seq_len = 24;
  return m;
}
constexpr int kBatch = 12;
constexpr int kSteps = 5;  // more than ShadowTap::kMaxPending: submit() has to wait

// Skewed batches (one id takes half the positions), fresh for every step.
std::vector<TokenId> batch_for(int step, int64_t n, int vocab) {
  std::mt19937_64 gen(test_seed() + uint64_t(step));
  std::vector<TokenId> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = TokenId(gen() % 2 ? 7 : gen() % uint64_t(vocab));
  return ids;
}

struct Shadowed {
  std::vector<ShadowTap<float>::Result> results;
  std::vector<float> grads;  // of the last step
};

// kSteps forward/backward passes of one model with a tap; every step shadowed.
Shadowed run_tapped(int background) {
  const ModelConfig m = shadow_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  const auto& cat = cpu_catalogue<float>();
  const std::vector<ShadowSpec> specs =
      parse_shadow_specs({"embed_rmsnorm_backward=bf16_accum", "linear_forward=bf16_rne",
                          "embed_rmsnorm_backward=fp32_reordered"},
                         cat);
  ShadowTap<float> tap(cat.select({}), specs, cat, background);
  Transformer<float> model(m, tap.kernels(), kBatch);
  model.init(test_seed());
  Shadowed out;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<TokenId> in = batch_for(step, N, m.vocab),
                               tgt = batch_for(step + 99, N, m.vocab);
    tap.arm();
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    tap.submit(in.data(), N, m.vocab, step);
    for (auto& r : tap.collect(false)) out.results.push_back(std::move(r));
    out.grads = model.grads().to_vector();
  }
  for (auto& r : tap.collect(true)) out.results.push_back(std::move(r));
  return out;
}

bool same(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}
}  // namespace

TEST(Shadow, WorkerThreadGivesTheSameMetricsInStepOrder) {
  const Shadowed here = run_tapped(0), worker = run_tapped(1);
  ASSERT_EQ(here.results.size(), size_t(kSteps));
  ASSERT_EQ(worker.results.size(), size_t(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    const auto &a = here.results[step], &b = worker.results[step];
    EXPECT_EQ(a.step, step);
    EXPECT_EQ(b.step, step);
    ASSERT_EQ(a.metrics.size(), 3u);
    ASSERT_EQ(b.metrics.size(), 3u);
    for (size_t s = 0; s < a.metrics.size(); ++s) {
      EXPECT_TRUE(same(a.metrics[s].rel_l2, b.metrics[s].rel_l2))
          << "step " << step << " spec " << s;
      EXPECT_TRUE(same(a.metrics[s].max_row_rel, b.metrics[s].max_row_rel));
      EXPECT_TRUE(same(a.metrics[s].cosine, b.metrics[s].cosine));
      ASSERT_EQ(a.metrics[s].bucket_rel_l2.size(), b.metrics[s].bucket_rel_l2.size());
      for (size_t k = 0; k < a.metrics[s].bucket_rel_l2.size(); ++k)
        EXPECT_TRUE(same(a.metrics[s].bucket_rel_l2[k], b.metrics[s].bucket_rel_l2[k]));
    }
    // The bug is visible against fp64, far beyond the control's fp32 rounding.
    EXPECT_GT(a.metrics[0].rel_l2, 1e-4) << "step " << step;
    EXPECT_LT(a.metrics[2].rel_l2, 1e-5) << "step " << step;
    EXPECT_GT(a.metrics[0].rel_l2, 30 * a.metrics[2].rel_l2) << "step " << step;
    EXPECT_GT(a.metrics[1].rel_l2, 1e-4) << "step " << step;  // bf16 GEMM operands
  }
}

TEST(Shadow, TappingDoesNotChangeTheRun) {
  const ModelConfig m = shadow_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  Transformer<float> model(m, cpu_catalogue<float>().select({}), kBatch);
  model.init(test_seed());
  std::vector<float> grads;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<TokenId> in = batch_for(step, N, m.vocab),
                               tgt = batch_for(step + 99, N, m.vocab);
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    grads = model.grads().to_vector();
  }
  const Shadowed tapped = run_tapped(1);
  ASSERT_EQ(grads.size(), tapped.grads.size());
  EXPECT_EQ(0, std::memcmp(grads.data(), tapped.grads.data(), grads.size() * sizeof(float)));
}
}  // namespace divlab
