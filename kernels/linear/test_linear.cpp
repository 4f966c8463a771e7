#include <array>
#include <cstring>

#include "kernels/common/parallel.h"
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

// A narrow layer's weight gradient sums over N in slices (kernels/linear/cpu.cpp): still the fp64
// product, added onto what dW held, and the same bits in fp32 on one thread or three. One block
// of outputs (9: three slices of 1167 rows, the last one short) and three (150, the last block
// short: two slices, the tasks cut by slice and block).
TEST(Linear, SlicedWeightGradientIsTheProductOnAnyThreadCount) {
  std::mt19937_64 gen(test_seed());
  for (const auto& [N, in, out] : {std::array<int, 3>{3500, 7, 9}, {2100, 5, 150}}) {
    auto x = randn<double>(N * in, gen), W = randn<double>(out * in, gen),
         dy = randn<double>(N * out, gen), before = randn<double>(out * in, gen);
    std::vector<double> dx(N * in), dW = before, naive = before;
    linear_backward_reference<double>(dx.data(), dW.data(), dy.data(), x.data(), W.data(), N, in,
                                      out);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) {
        double s = 0;
        for (int n = 0; n < N; ++n) s += dy[n * out + o] * x[n * in + i];
        naive[o * in + i] += s;
      }
    EXPECT_CLOSE(dW, naive, 1e-12, "dW, out " + std::to_string(out));

    const auto to_float = [](const std::vector<double>& v) {
      return std::vector<float>(v.begin(), v.end());
    };
    const auto xf = to_float(x), Wf = to_float(W), dyf = to_float(dy);
    std::vector<float> dWf[2], dxf(N * in);
    for (int k = 0; k < 2; ++k) {
      const OmpTeam team(k == 0 ? 1 : 3);
      dWf[k] = to_float(before);
      linear_backward_reference<float>(dxf.data(), dWf[k].data(), dyf.data(), xf.data(), Wf.data(),
                                       N, in, out);
    }
    EXPECT_EQ(0, std::memcmp(dWf[0].data(), dWf[1].data(), dWf[0].size() * sizeof(float)))
        << "out " << out << ", seed " << test_seed();
  }
}
}  // namespace divlab
