#include "kernels/embed_rmsnorm_backward/embed_rmsnorm_backward.h"
#include "kernels/embedding/embedding.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

// The fused op against finite differences of what it is the gradient of:
//   L = <rmsnorm(x0, w), dy_norm> + <x0, dresid>,   x0 = wte[tokens] + wpe.
// Token ids repeat (a few ids many times) so the scatter's accumulation is exercised.
TEST(EmbedRmsnormBackward, GradcheckWithRepeatedTokens) {
  std::mt19937_64 gen(test_seed());
  const int B = 3, T = 5, C = 6, V = 9, N = B * T;
  auto wte = randn<double>(V * C, gen), wpe = randn<double>(T * C, gen), w = randn<double>(C, gen),
       dy = randn<double>(N * C, gen), dres = randn<double>(N * C, gen);
  std::vector<TokenId> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = TokenId(n % 3 == 0 ? 2 : gen() % V);
  std::vector<double> x0(N * C), y(N * C), rstd(N);
  auto objective = [&] {
    embedding_forward_reference<double>(x0.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                                        V);
    rmsnorm_forward_reference<double>(y.data(), rstd.data(), x0.data(), w.data(), N, C, 1e-5);
    return dot(y, dy) + dot(x0, dres);
  };
  objective();
  std::vector<double> dwte(V * C, 0.0), dwpe(T * C, 0.0), dw(C, 0.0);
  embed_rmsnorm_backward_reference<double>(dwte.data(), dwpe.data(), dw.data(), dy.data(),
                                           dres.data(), x0.data(), w.data(), rstd.data(),
                                           tokens.data(), B, T, C, V);
  EXPECT_CLOSE(dwte, numeric_grad(objective, wte), kGradcheckTol, "dwte");
  EXPECT_CLOSE(dwpe, numeric_grad(objective, wpe), kGradcheckTol, "dwpe");
  EXPECT_CLOSE(dw, numeric_grad(objective, w), kGradcheckTol, "dw_norm");
}

TEST(EmbedRmsnormBackward, Fp32ReferenceWithinRoundingOfFp64OnHotRows) {
  // 4096 positions, half of them one token: the fp32 reference must still match fp64 closely.
  std::mt19937_64 gen(test_seed());
  const int B = 64, T = 64, C = 32, V = 50, N = B * T;
  auto wd = randn<double>(C, gen), dyd = randn<double>(N * C, gen),
       dresd = randn<double>(N * C, gen), x0d = randn<double>(N * C, gen);
  std::vector<TokenId> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = TokenId(n % 2 ? 7 : gen() % V);
  std::vector<double> rstdd(N), yd(N * C);
  rmsnorm_forward_reference<double>(yd.data(), rstdd.data(), x0d.data(), wd.data(), N, C, 1e-5);
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  auto wf = f(wd), dyf = f(dyd), dresf = f(dresd), x0f = f(x0d), rstdf = f(rstdd);
  std::vector<double> dwte_d(V * C, 0), dwpe_d(T * C, 0), dw_d(C, 0);
  std::vector<float> dwte_f(V * C, 0), dwpe_f(T * C, 0), dw_f(C, 0);
  embed_rmsnorm_backward_reference<double>(dwte_d.data(), dwpe_d.data(), dw_d.data(), dyd.data(),
                                           dresd.data(), x0d.data(), wd.data(), rstdd.data(),
                                           tokens.data(), B, T, C, V);
  embed_rmsnorm_backward_reference<float>(dwte_f.data(), dwpe_f.data(), dw_f.data(), dyf.data(),
                                          dresf.data(), x0f.data(), wf.data(), rstdf.data(),
                                          tokens.data(), B, T, C, V);
  EXPECT_CLOSE(dwte_f, dwte_d, 1e-5, "fp32 dwte");
  EXPECT_CLOSE(dwpe_f, dwpe_d, 1e-5, "fp32 dwpe");
  EXPECT_CLOSE(dw_f, dw_d, 1e-5, "fp32 dw_norm");
}
}  // namespace divlab
