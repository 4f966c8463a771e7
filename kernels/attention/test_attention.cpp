#include "kernels/attention/attention.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Attention, GradcheckQkv) {
  std::mt19937_64 gen(test_seed());
  const int B = 2, T = 5, C = 6, NH = 2, N = B * T;
  auto qkv = randn<double>(N * 3 * C, gen), r = randn<double>(N * C, gen);
  std::vector<double> out(N * C), att(B * NH * T * T);
  auto objective = [&] {
    attention_forward_reference<double>(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, r);
  };
  objective();
  std::vector<double> dqkv(N * 3 * C);
  attention_backward_reference<double>(dqkv.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  EXPECT_CLOSE(dqkv, numeric_grad(objective, qkv), kGradcheckTol, "dqkv");
}

TEST(Attention, IsCausal) {
  // Changing a later position's k or v must not change any earlier output.
  std::mt19937_64 gen(test_seed());
  const int B = 1, T = 6, C = 4, NH = 1;
  auto qkv = randn<double>(T * 3 * C, gen);
  std::vector<double> out1(T * C), out2(T * C), att(T * T);
  attention_forward_reference<double>(out1.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int c = C; c < 3 * C; ++c) qkv[(T - 1) * 3 * C + c] += 1.0;
  attention_forward_reference<double>(out2.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < (T - 1) * C; ++i) EXPECT_EQ(out1[i], out2[i]) << "element " << i;
  EXPECT_NE(out1[(T - 1) * C], out2[(T - 1) * C]);
}

TEST(Attention, LargeScoresStayFinite) {
  std::mt19937_64 gen(test_seed());
  const int B = 1, T = 8, C = 4, NH = 1;
  auto qkv = randn<float>(T * 3 * C, gen, 300.0);  // scores ~1e5: exp would overflow unshifted
  std::vector<float> out(T * C), att(T * T);
  attention_forward_reference<float>(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}
}  // namespace divlab
