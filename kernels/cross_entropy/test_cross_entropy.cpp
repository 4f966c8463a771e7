#include "kernels/cross_entropy/cross_entropy.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(CrossEntropy, GradcheckLogits) {
  std::mt19937_64 gen(test_seed());
  const int N = 6, V = 11;
  auto logits = randn<double>(N * V, gen, 2.0);
  std::vector<TokenId> targets(N);
  for (auto& t : targets) t = TokenId(gen() % V);
  std::vector<double> losses(N), dlogits(N * V);
  auto objective = [&] {
    cross_entropy_reference<double>(losses.data(), nullptr, logits.data(), targets.data(), N, V,
                                    0.0);
    double s = 0;
    for (double l : losses) s += l;
    return s / N;
  };
  cross_entropy_reference<double>(losses.data(), dlogits.data(), logits.data(), targets.data(), N,
                                  V, 1.0 / N);
  EXPECT_CLOSE(dlogits, numeric_grad(objective, logits), kGradcheckTol, "dlogits");
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const int N = 3, V = 50;
  std::vector<float> logits(N * V, 7.0f), losses(N);
  std::vector<TokenId> targets = {0, 17, 49};
  cross_entropy_reference<float>(losses.data(), nullptr, logits.data(), targets.data(), N, V, 0.f);
  for (float l : losses) EXPECT_NEAR(l, std::log(50.0), 1e-5);
}

TEST(CrossEntropy, HugeLogitsStayFinite) {
  const int V = 4;
  std::vector<float> logits = {1e4f, -1e4f, 5e3f, 0.f}, losses(1), d(V);
  std::vector<TokenId> targets = {2};
  cross_entropy_reference<float>(losses.data(), d.data(), logits.data(), targets.data(), 1, V, 1.f);
  EXPECT_NEAR(losses[0], 5e3, 1e-2);
  for (float v : d) EXPECT_TRUE(std::isfinite(v));
}
}  // namespace divlab
