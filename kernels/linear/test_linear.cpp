#include "kernels/linear/linear.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Linear, GradcheckAcrossRowBlocks) {
  std::mt19937_64 gen(test_seed());
  const int N = 70, in = 5, out = 67;  // N and out span two 64-row chunks with a ragged tail
  auto x = randn<double>(N * in, gen), W = randn<double>(out * in, gen),
       r = randn<double>(N * out, gen);
  std::vector<double> y(N * out);
  auto objective = [&] {
    linear_forward_reference<double>(y.data(), x.data(), W.data(), N, in, out);
    return dot(y, r);
  };
  std::vector<double> dx(N * in), dW(out * in, 0.0);
  linear_backward_reference<double>(dx.data(), dW.data(), r.data(), x.data(), W.data(), N, in, out);
  EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol, "dx");
  EXPECT_CLOSE(dW, numeric_grad(objective, W), kGradcheckTol, "dW");
}

TEST(Linear, ForwardMatchesNaiveFp64Product) {
  std::mt19937_64 gen(test_seed());
  const int N = 33, in = 40, out = 9;
  auto x = randn<double>(N * in, gen), W = randn<double>(out * in, gen);
  std::vector<double> y(N * out), naive(N * out, 0.0);
  linear_forward_reference<double>(y.data(), x.data(), W.data(), N, in, out);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) naive[n * out + o] += x[n * in + i] * W[o * in + i];
  EXPECT_CLOSE(y, naive, 1e-14, "y");
}
}  // namespace divlab
