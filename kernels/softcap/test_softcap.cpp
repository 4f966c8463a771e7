#include "kernels/softcap/softcap.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Softcap, GradcheckInDouble) {
  std::mt19937_64 gen(test_seed());
  const int n = 40;
  auto x = randn<double>(n, gen, 20.0), r = randn<double>(n, gen);
  std::vector<double> y(n), dx(n);
  auto objective = [&] {
    softcap_forward_reference<double>(y.data(), x.data(), n, 15.0);
    return dot(y, r);
  };
  softcap_backward_reference<double>(dx.data(), r.data(), x.data(), n, 15.0);
  EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol, "softcap dx");
}

// The omitted cap is invisible near zero and plain wrong at the cap's scale: the report's case.
TEST(SoftcapVariants, OmittedPassesNearZeroAndFailsAtScale) {
  std::mt19937_64 gen(test_seed());
  auto run = [&](const std::string& variant, const std::vector<float>& x) {
    std::vector<float> y(x.size());
    cpu_catalogue<float>().softcap_forward.find(variant)->fn(test_context(), y.data(), x.data(),
                                                             int64_t(x.size()), 30.f);
    return y;
  };
  const auto small = randn<float>(1000, gen, 0.1), large = randn<float>(1000, gen, 30.0);
  // Near zero: within the verifier's atol = rtol = 1e-2 everywhere.
  const auto ys = run("omitted", small), rs = run("reference", small);
  for (size_t i = 0; i < ys.size(); ++i)
    EXPECT_LE(std::abs(ys[i] - rs[i]), 1e-2 + 1e-2 * std::abs(rs[i]));
  EXPECT_GT(compare(run("omitted", large), run("reference", large)).error, 0.3);
}
}  // namespace divlab
