#include <algorithm>
#include <cmath>

#include "kernels/swiglu/swiglu.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Swiglu, GradcheckInDouble) {
  std::mt19937_64 gen(test_seed());
  const int N = 4, F = 7;
  auto x = randn<double>(size_t(N) * 2 * F, gen, 3.0), r = randn<double>(size_t(N) * F, gen);
  std::vector<double> y(r.size()), dx(x.size());
  auto objective = [&] {
    swiglu_forward_reference<double>(y.data(), x.data(), N, F);
    return dot(y, r);
  };
  swiglu_backward_reference<double>(dx.data(), r.data(), x.data(), N, F);
  EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol, "swiglu dx");
}

TEST(Swiglu, KnownValuesAndNoOverflow) {
  // silu(1) * 2 = 2 / (1 + e^-1); silu(-1000) = -0 (no inf / inf), silu(1000) = 1000.
  const std::vector<float> x = {1.f, -1000.f, 1000.f, 2.f, 1.f, 1.f};
  std::vector<float> y(3), dx(6);
  swiglu_forward_reference<float>(y.data(), x.data(), 1, 3);
  EXPECT_NEAR(y[0], 2.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(y[1], 0.f);
  EXPECT_EQ(y[2], 1000.f);
  const std::vector<float> dy = {1.f, 1.f, 1.f};
  swiglu_backward_reference<float>(dx.data(), dy.data(), x.data(), 1, 3);
  for (float v : dx) EXPECT_TRUE(std::isfinite(v));
}

TEST(SwigluVariants, SwappedHalvesTradeTheGradients) {
  std::mt19937_64 gen(test_seed());
  const int N = 3, F = 5;
  auto x = randn<float>(size_t(N) * 2 * F, gen), dy = randn<float>(size_t(N) * F, gen);
  std::vector<float> ref(x.size()), got(x.size());
  cpu_catalogue<float>()
      .swiglu_backward.find("reference")
      ->fn(test_context(), ref.data(), dy.data(), x.data(), N, F);
  cpu_catalogue<float>()
      .swiglu_backward.find("swapped_halves")
      ->fn(test_context(), got.data(), dy.data(), x.data(), N, F);
  // The same values in each other's places, to fp32 rounding, not bit for bit: the variants are
  // compiled without FMA contraction (kernels/*/variants.cpp), the reference with it, and the
  // gate's gradient, dy u s (1 + g (1 - s)), can differ by several ulps between the two. Its
  // terms cancel where 1 + g (1 - s) nears zero, so the bound is relative to the largest value
  // of the output, not to the element (elementwise, 1 seed in 90 failed on a 3e-5 value).
  float scale = 0;
  for (float v : ref) scale = std::max(scale, std::abs(v));
  const auto same = [scale](float a, float b) { return std::abs(a - b) <= 1e-5f * scale; };
  int unswapped = 0;
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      const size_t gate = size_t(n) * 2 * F + size_t(f), up = gate + size_t(F);
      EXPECT_TRUE(same(got[gate], ref[up]))
          << got[gate] << " vs " << ref[up] << " (seed " << test_seed() << ")";
      EXPECT_TRUE(same(got[up], ref[gate]))
          << got[up] << " vs " << ref[gate] << " (seed " << test_seed() << ")";
      unswapped += same(got[gate], ref[gate]);
    }
  EXPECT_LT(unswapped, N * F / 2) << "the halves were not swapped (seed " << test_seed() << ")";
}
}  // namespace divlab
