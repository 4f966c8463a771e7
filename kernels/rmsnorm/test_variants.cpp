#include "kernels/rmsnorm/rmsnorm.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
std::vector<float> forward(const std::string& variant, const std::vector<float>& x,
                           const std::vector<float>& w, int N, int C) {
  std::vector<float> y(x.size()), rstd(N);
  cpu_catalogue<float>().rmsnorm_forward.find(variant)->fn(test_context(), y.data(), rstd.data(),
                                                           x.data(), w.data(), N, C, 1e-5f);
  return y;
}
}  // namespace

TEST(RmsnormEps, OutsideSqrtVisibleOnlyOnTinyRows) {
  std::mt19937_64 gen(test_seed());
  const int C = 64;
  auto w = randn<float>(C, gen);
  auto normal = randn<float>(4 * C, gen);
  EXPECT_CLOSE(forward("eps_outside_sqrt", normal, w, 4, C), forward("reference", normal, w, 4, C),
               1e-4, "normal-scale rows");
  auto tiny = randn<float>(4 * C, gen, 1e-3);  // RMS ~ 1e-3, mean(x^2) ~ 1e-6 < eps
  EXPECT_GT(compare(forward("eps_outside_sqrt", tiny, w, 4, C), forward("reference", tiny, w, 4, C))
                .error,
            0.5);
}

TEST(RmsnormEps, MissingEpsTurnsAZeroRowIntoNan) {
  std::mt19937_64 gen(test_seed());
  const int C = 16;
  auto w = randn<float>(C, gen);
  auto x = randn<float>(2 * C, gen);
  std::fill(x.begin() + C, x.end(), 0.f);  // second row all zero
  const auto y = forward("no_eps", x, w, 2, C), ref = forward("reference", x, w, 2, C);
  for (int c = 0; c < C; ++c) {
    EXPECT_NEAR(y[c], ref[c], 1e-4 * std::abs(ref[c]) + 1e-7);  // eps / mean(x^2) ~ 1e-5
    EXPECT_TRUE(std::isnan(y[C + c]));
    EXPECT_EQ(ref[C + c], 0.f);
  }
}

TEST(RmsnormBf16Reduce, WeightGradientErrorGrowsWithRows) {
  std::mt19937_64 gen(test_seed());
  const int C = 32;
  auto w = randn<float>(C, gen);
  double err[2];
  int i = 0;
  for (int N : {16, 4096}) {
    // Same-sign per-channel terms: dy = |noise|, x > 0.
    auto x = randn<float>(int64_t(N) * C, gen), dy = randn<float>(int64_t(N) * C, gen);
    for (auto& v : x) v = std::abs(v) + 0.1f;
    for (auto& v : dy) v = std::abs(v);
    std::vector<float> y(x.size()), rstd(N);
    rmsnorm_forward_reference<float>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    std::vector<float> dx(x.size(), 0.f), dw(C, 0.f), dx_ref(x.size(), 0.f), dw_ref(C, 0.f);
    cpu_catalogue<float>()
        .rmsnorm_backward.find("bf16_reduce")
        ->fn(test_context(), dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N,
             C);
    rmsnorm_backward_reference<float>(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(),
                                      rstd.data(), N, C);
    EXPECT_EQ(dx, dx_ref) << "the input gradient is untouched";
    err[i++] = compare(dw, dw_ref).error;
  }
  EXPECT_LT(err[0], 2e-2);
  EXPECT_GT(err[1], 0.3);
}
}  // namespace divlab
