// Whole-model checks: gradcheck in double over every parameter, loss at init, determinism.
#include <omp.h>

#include <cmath>
#include <cstring>

#include "model/transformer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
ModelConfig small_model() {
  ModelConfig m;
  m.vocab = 11, m.d_model = 8, m.n_layers = 2, m.n_heads = 2, m.seq_len = 5;
  m.init_std = 0.3;  // large enough that every path carries a visible gradient
  return m;
}
}  // namespace

TEST(Model, GradcheckEveryParameterInDouble) {
  const ModelConfig m = small_model();
  const int B = 2, N = B * m.seq_len;
  Transformer<double> model(m, cpu_catalogue<double>().select({}), B);
  model.init(test_seed());
  std::mt19937_64 gen(test_seed());
  std::vector<TokenId> in(N), tgt(N);
  for (int n = 0; n < N; ++n)
    in[n] = TokenId(n % 2 ? 3 : gen() % m.vocab), tgt[n] = TokenId(gen() % m.vocab);
  model.forward(in.data(), tgt.data(), true);
  model.backward();
  const std::vector<double> analytic = model.grads().to_vector();
  auto objective = [&] { return model.forward(in.data(), tgt.data(), false); };
  const std::vector<double> numeric =
      numeric_grad(objective, model.params().data(), model.params().size());
  for (const auto& p : model.layout()) {
    std::vector<double> a(analytic.begin() + p.offset, analytic.begin() + p.offset + p.size);
    std::vector<double> n(numeric.begin() + p.offset, numeric.begin() + p.offset + p.size);
    EXPECT_CLOSE(a, n, kGradcheckTol, p.name);
  }
}

TEST(Model, LossAtInitIsLogVocab) {
  ModelConfig m;
  m.vocab = 512, m.d_model = 64, m.n_layers = 2, m.n_heads = 4, m.seq_len = 32;
  const int B = 4, N = B * m.seq_len;
  Transformer<float> model(m, cpu_catalogue<float>().select({}), B);
  model.init(test_seed());
  std::mt19937_64 gen(test_seed());
  std::vector<TokenId> in(N), tgt(N);
  for (int n = 0; n < N; ++n) in[n] = TokenId(gen() % m.vocab), tgt[n] = TokenId(gen() % m.vocab);
  EXPECT_NEAR(model.forward(in.data(), tgt.data(), false), std::log(512.0), 0.1);
}

TEST(Model, GradientsBitwiseIdenticalForOneAndTwoThreads) {
  ModelConfig m;
  m.vocab = 300, m.d_model = 48, m.n_layers = 2, m.n_heads = 3, m.seq_len = 40;
  const int B = 5, N = B * m.seq_len;  // 200 rows: several ragged row chunks
  std::mt19937_64 gen(test_seed());
  std::vector<TokenId> in(N), tgt(N);
  for (int n = 0; n < N; ++n) in[n] = TokenId(gen() % 7), tgt[n] = TokenId(gen() % m.vocab);
  std::vector<float> grads[2];
  float loss[2];
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Transformer<float> model(m, cpu_catalogue<float>().select({}), B);
    model.init(42);
    loss[threads - 1] = model.forward(in.data(), tgt.data(), true);
    model.backward();
    grads[threads - 1] = model.grads().to_vector();
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(loss[0], loss[1]);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)));
}
}  // namespace divlab
