#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

// The fused op is add then rmsnorm_forward, bit for bit, so the llama model's gradients (through
// rmsnorm_backward) are those of its forward.
TEST(AddRmsnorm, EqualsAddThenRmsnormBitwise) {
  std::mt19937_64 gen(test_seed());
  const int B = 3, T = 7, C = 24, N = B * T;
  auto a = randn<float>(size_t(N) * C, gen), b = randn<float>(size_t(N) * C, gen);
  auto w = randn<float>(size_t(C), gen);
  std::vector<float> xout(a.size()), y(a.size()), rstd(N), sum(a.size()), y2(a.size()), rstd2(N);
  add_rmsnorm_forward_reference<float>(xout.data(), y.data(), rstd.data(), a.data(), b.data(),
                                       w.data(), B, T, C, 1e-5f);
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  rmsnorm_forward_reference<float>(y2.data(), rstd2.data(), sum.data(), w.data(), N, C, 1e-5f);
  EXPECT_EQ(xout, sum);
  EXPECT_EQ(y, y2);
  EXPECT_EQ(rstd, rstd2);
}

TEST(AddRmsnormVariants, TestedLengthsOnlyExactAtTestedLengthsStaleElsewhere) {
  std::mt19937_64 gen(test_seed());
  const int B = 2, C = 8;
  auto run = [&](const std::string& variant, int T, std::vector<float>* y) {
    const int N = B * T;
    auto a = randn<float>(size_t(N) * C, gen), b = randn<float>(size_t(N) * C, gen);
    auto w = randn<float>(size_t(C), gen);
    std::vector<float> xout(a.size(), -7.f), rstd(N, -7.f);
    y->assign(a.size(), -7.f);  // what the buffers held before
    std::vector<float> ref_x(a.size()), ref_y(a.size()), ref_r(N);
    add_rmsnorm_forward_reference<float>(ref_x.data(), ref_y.data(), ref_r.data(), a.data(),
                                         b.data(), w.data(), B, T, C, 1e-5f);
    cpu_catalogue<float>().add_rmsnorm_forward.find(variant)->fn(
        test_context(), xout.data(), y->data(), rstd.data(), a.data(), b.data(), w.data(), B, T, C,
        1e-5f);
    return ref_y;
  };
  std::vector<float> y;
  EXPECT_EQ(run("tested_lengths_only", 64, &y), y);
  const auto ref = run("tested_lengths_only", 48, &y);  // runs the 32 kernel: 2 x 32 rows
  for (size_t i = 0; i < y.size(); ++i)
    if (i < size_t(B) * 32 * C)
      EXPECT_EQ(y[i], ref[i]) << i;
    else
      EXPECT_EQ(y[i], -7.f) << i;
  EXPECT_THROW(run("tested_lengths_only", 15, &y), std::invalid_argument);
}
}  // namespace divlab
