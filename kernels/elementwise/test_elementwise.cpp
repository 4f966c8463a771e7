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

// The vectorised fp32 kernels against the scalar formula: both are measured against fp64, and
// the kernel may be at most twice as far off as the scalar fp32 formula (torch.compile's
// accuracy criterion for fp32). 1 - tanh^2 cancels for large |x|, so neither is ulp-exact.
TEST(Gelu, VectorisedFp32AsAccurateAsScalarFp32) {
  std::mt19937_64 gen(test_seed());
  const int n = 100000;
  auto x = randn<float>(n, gen, 3.0), dy = randn<float>(n, gen);
  std::vector<float> y(n), dx(n), y_scalar(n), dx_scalar(n);
  std::vector<double> y64(n), dx64(n);
  gelu_forward_reference<float>(y.data(), x.data(), n);
  gelu_backward_reference<float>(dx.data(), dy.data(), x.data(), n);
  for (int i = 0; i < n; ++i) {
    y64[i] = gelu_tanh(double(x[i])), dx64[i] = gelu_tanh_grad(double(x[i])) * double(dy[i]);
    y_scalar[i] = gelu_tanh(x[i]), dx_scalar[i] = gelu_tanh_grad(x[i]) * dy[i];
  }
  const double floor = 1e-7;  // below this both are at fp32 rounding of the output
  EXPECT_CLOSE(y, y64, 2 * compare(y_scalar, y64).error + floor, "fp32 gelu");
  EXPECT_CLOSE(dx, dx64, 2 * compare(dx_scalar, dx64).error + floor, "fp32 gelu backward");
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
