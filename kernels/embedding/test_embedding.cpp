#include "kernels/embedding/embedding.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Embedding, GathersTokenAndPositionRows) {
  std::mt19937_64 gen(test_seed());
  const int B = 3, T = 4, C = 5, V = 7;
  auto wte = randn<double>(V * C, gen), wpe = randn<double>(T * C, gen);
  std::vector<TokenId> tokens(B * T);
  for (auto& t : tokens) t = TokenId(gen() % V);
  std::vector<double> x(B * T * C);
  embedding_forward_reference<double>(x.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
  for (int n = 0; n < B * T; ++n)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(x[n * C + c], wte[tokens[n] * C + c] + wpe[(n % T) * C + c]);
}
}  // namespace divlab
