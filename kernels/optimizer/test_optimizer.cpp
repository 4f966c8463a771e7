#include "kernels/optimizer/optimizer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Optimizer, SumSquaresMatchesFp64) {
  std::mt19937_64 gen(test_seed());
  auto g = randn<float>(100000, gen);
  double expect = 0;
  for (float v : g) expect += double(v) * double(v);
  double got = 0;
  sum_squares_reference<float>(&got, g.data(), g.size());
  EXPECT_NEAR(got, expect, expect * 1e-12);
}

TEST(Optimizer, SgdNesterovMatchesHandComputation) {
  // Two steps of PyTorch-semantics SGD on one element, written out by hand.
  double p = 1.0, buf = 0.0;
  const double g1 = 0.5, g2 = -0.25, lr = 0.1, mu = 0.9, wd = 0.01;
  sgd_step_reference<double>(&p, &buf, &g1, 1, lr, mu, true, wd, 1.0);
  double d = g1 + wd * 1.0, b = d, expect = 1.0 - lr * (d + mu * b);
  EXPECT_DOUBLE_EQ(p, expect);
  sgd_step_reference<double>(&p, &buf, &g2, 1, lr, mu, true, wd, 1.0);
  d = g2 + wd * expect, b = mu * b + d, expect -= lr * (d + mu * b);
  EXPECT_DOUBLE_EQ(p, expect);
}

TEST(Optimizer, AdamwIsInvariantToGradientScale) {
  // The field note behind the lab: Adam's update does not change when g is scaled by c > 0
  // (exactly when eps = 0), which is why a scaled-down gradient row hides under AdamW.
  std::mt19937_64 gen(test_seed());
  auto g = randn<double>(64, gen);
  auto p1 = randn<double>(64, gen), p2 = p1;
  std::vector<double> m1(64, 0), v1(64, 0), m2(64, 0), v2(64, 0), gs(64);
  for (int i = 0; i < 64; ++i) gs[i] = g[i] * 1e-3;
  for (int step = 1; step <= 3; ++step) {
    adamw_step_reference<double>(p1.data(), m1.data(), v1.data(), g.data(), 64, 1e-2, 0.9, 0.999,
                                 0.0, 0.0, 1.0, step);
    adamw_step_reference<double>(p2.data(), m2.data(), v2.data(), gs.data(), 64, 1e-2, 0.9, 0.999,
                                 0.0, 0.0, 1.0, step);
  }
  EXPECT_CLOSE(p2, p1, 1e-13, "AdamW with g * 1e-3");
}
}  // namespace divlab
