#include <cstring>

#include "kernels/common/parallel.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Rmsnorm, GradcheckInputAndWeight) {
  std::mt19937_64 gen(test_seed());
  const int N = 7, C = 13;
  auto x = randn<double>(N * C, gen), w = randn<double>(C, gen), r = randn<double>(N * C, gen);
  std::vector<double> y(N * C), rstd(N);
  auto objective = [&] {
    rmsnorm_forward_reference<double>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    return dot(y, r);
  };
  objective();
  std::vector<double> dx(N * C, 0.0), dw(C, 0.0);
  rmsnorm_backward_reference<double>(dx.data(), dw.data(), r.data(), x.data(), w.data(),
                                     rstd.data(), N, C);
  EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol, "dx");
  EXPECT_CLOSE(dw, numeric_grad(objective, w), kGradcheckTol, "dw");
}

TEST(Rmsnorm, BackwardAccumulatesIntoResidualGradient) {
  std::mt19937_64 gen(test_seed());
  const int N = 3, C = 8;
  auto x = randn<double>(N * C, gen), w = randn<double>(C, gen), dy = randn<double>(N * C, gen);
  std::vector<double> y(N * C), rstd(N), dw(C, 0.0);
  rmsnorm_forward_reference<double>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
  auto base = randn<double>(N * C, gen), dx = base;
  std::vector<double> fresh(N * C, 0.0);
  rmsnorm_backward_reference<double>(dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                     rstd.data(), N, C);
  rmsnorm_backward_reference<double>(fresh.data(), dw.data(), dy.data(), x.data(), w.data(),
                                     rstd.data(), N, C);
  for (int i = 0; i < N * C; ++i) fresh[i] += base[i];
  EXPECT_CLOSE(dx, fresh, 1e-15, "dx += semantics");
}

TEST(Rmsnorm, Fp32ForwardWithinRoundingOfFp64) {
  std::mt19937_64 gen(test_seed());
  const int N = 64, C = 96;
  auto xd = randn<double>(N * C, gen, 3.0), wd = randn<double>(C, gen);
  std::vector<float> xf(xd.begin(), xd.end()), wf(wd.begin(), wd.end()), yf(N * C), rf(N);
  std::vector<double> yd(N * C), rd(N);
  rmsnorm_forward_reference<float>(yf.data(), rf.data(), xf.data(), wf.data(), N, C, 1e-5f);
  rmsnorm_forward_reference<double>(yd.data(), rd.data(), xd.data(), wd.data(), N, C, 1e-5);
  EXPECT_CLOSE(yf, yd, 1e-6, "fp32 y");
}

// The weight gradient: every column sums its rows in row order, whatever the column chunks
// (chunks of 16 columns; C 44 and 150 end in a shorter one) and the thread count, so its
// fp32 bits are those of one sequential sum per column, and every row counts.
TEST(Rmsnorm, WeightGradientSumsEachColumnInRowOrderOnAnyThreadCount) {
  std::mt19937_64 gen(test_seed());
  for (const int C : {44, 150}) {
    const int N = 300;
    auto x = randn<double>(N * C, gen), dy = randn<double>(N * C, gen),
         before = randn<double>(C, gen);
    std::vector<double> rstd(N);
    for (double& r : rstd) r = 0.5 + std::uniform_real_distribution<double>(0, 1)(gen);
    const std::vector<float> xf(x.begin(), x.end()), dyf(dy.begin(), dy.end()),
        rf(rstd.begin(), rstd.end());
    std::vector<double> exact = before;
    std::vector<float> sequential(before.begin(), before.end());
    for (int c = 0; c < C; ++c)
      for (int n = 0; n < N; ++n) {
        const int i = n * C + c;
        exact[c] += dy[i] * x[i] * rstd[n];
#ifdef __FMA__  // the kernel's rounding: the product's sum rounded once where FMA exists
        sequential[c] = std::fma(dyf[i] * xf[i], rf[n], sequential[c]);
#else
        sequential[c] = dyf[i] * xf[i] * rf[n] + sequential[c];
#endif
      }
    for (const int threads : {1, 2, 3}) {
      const OmpTeam team(threads);
      std::vector<float> dw(before.begin(), before.end());
      rmsnorm_weight_grad<float>(dw.data(), dyf.data(), xf.data(), rf.data(), N, C);
      EXPECT_CLOSE(dw, exact, 1e-5, "dw");
      EXPECT_EQ(0, std::memcmp(sequential.data(), dw.data(), C * sizeof(float)))
          << "C " << C << ", " << threads << " threads, seed " << test_seed();
    }
  }
}
}  // namespace divlab
