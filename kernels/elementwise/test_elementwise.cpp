#include "kernels/elementwise/elementwise.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Gelu, Gradcheck) {
  std::mt19937_64 gen(test_seed());
  const int n = 50;
  auto x = randn<double>(n, gen, 3.0), r = randn<double>(n, gen);
  std::vector<double> y(n), dx(n);
  auto objective = [&] {
    gelu_forward_reference<double>(y.data(), x.data(), n);
    return dot(y, r);
  };
  gelu_backward_reference<double>(dx.data(), r.data(), x.data(), n);
  EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol, "dx");
}

TEST(Gelu, KnownValues) {
  // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715)); large |x| tends to relu.
  EXPECT_NEAR(gelu_tanh(1.0), 0.8411919906082768, 1e-14);
  EXPECT_NEAR(gelu_tanh(-10.0), 0.0, 1e-12);
  EXPECT_NEAR(gelu_tanh(10.0), 10.0, 1e-12);
}

TEST(Add, Elementwise) {
  std::mt19937_64 gen(test_seed());
  auto a = randn<float>(1000, gen), b = randn<float>(1000, gen);
  std::vector<float> y(1000);
  add_reference<float>(y.data(), a.data(), b.data(), 1000);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(y[i], a[i] + b[i]);
}
}  // namespace divlab
