#include <limits>

#include "kernels/linear/linear.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
std::vector<float> forward(const std::string& variant, const std::vector<float>& x,
                           const std::vector<float>& W, int N, int in, int out) {
  std::vector<float> y(int64_t(N) * out, std::numeric_limits<float>::quiet_NaN());
  cpu_catalogue<float>().linear_forward.find(variant)->fn(test_context(), y.data(), x.data(),
                                                          W.data(), N, in, out);
  return y;
}
}  // namespace

// Blocked GEMMs sum in another order than the reference's: computed features agree to fp32
// rounding, not bitwise. The bug is the features that are never computed.
TEST(LinearTailSkip, WrongOnlyWhenOutputsAreNotAMultipleOf32) {
  std::mt19937_64 gen(test_seed());
  const int N = 10, in = 24;
  for (int out : {32, 64, 96}) {
    auto x = randn<float>(N * in, gen), W = randn<float>(out * in, gen);
    EXPECT_CLOSE(forward("tail_skip", x, W, N, in, out), forward("reference", x, W, N, in, out),
                 1e-6, "out = " + std::to_string(out));
  }
  const int out = 40;  // the last 8 features are never written
  auto x = randn<float>(N * in, gen), W = randn<float>(out * in, gen);
  const auto y = forward("tail_skip", x, W, N, in, out),
             ref = forward("reference", x, W, N, in, out);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      if (o < 32)
        EXPECT_NEAR(y[n * out + o], ref[n * out + o], 1e-5 * (1 + std::abs(ref[n * out + o])));
      else
        EXPECT_TRUE(std::isnan(y[n * out + o])) << "feature " << o << " was computed";
    }
}

TEST(LinearBf16, TruncationIsBiasedRoundingIsNot) {
  std::mt19937_64 gen(test_seed());
  const int N = 64, in = 256, out = 64;
  auto x = randn<float>(N * in, gen), W = randn<float>(out * in, gen);
  for (auto& v : x) v = std::abs(v);  // positive products: a shrinking bias shows in the sum
  for (auto& v : W) v = std::abs(v);
  const auto ref = forward("reference", x, W, N, in, out);
  auto bias = [&](const std::vector<float>& y) {
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += (y[i] - ref[i]) / ref[i];
    return s / double(y.size());
  };
  const double trunc = bias(forward("bf16_truncate", x, W, N, in, out));
  const double rne = bias(forward("bf16_rne", x, W, N, in, out));
  EXPECT_LT(trunc, -2e-3);  // about 2 x 2^-9: both factors shrink
  EXPECT_LT(std::abs(rne), 5e-4);
}
}  // namespace divlab
