#include "kernels/rope/rope.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
// y = rope(x) for one variant, fp32.
std::vector<float> rope(const std::string& op, const std::string& variant,
                        const std::vector<float>& x, int B, int T, int NH, int NKV, int HD,
                        float base) {
  std::vector<float> y(x.size());
  const auto& ops =
      op == "forward" ? cpu_catalogue<float>().rope_forward : cpu_catalogue<float>().rope_backward;
  ops.find(variant)->fn(test_context(), y.data(), x.data(), B, T, NH, NKV, HD, base);
  return y;
}
}  // namespace

TEST(Rope, GradcheckInDouble) {
  std::mt19937_64 gen(test_seed());
  const int B = 2, T = 5, NH = 4, NKV = 2, HD = 6, W = (NH + 2 * NKV) * HD;
  auto x = randn<double>(size_t(B) * T * W, gen), r = randn<double>(x.size(), gen);
  std::vector<double> y(x.size()), dx(x.size());
  auto objective = [&] {
    rope_forward_reference<double>(y.data(), x.data(), B, T, NH, NKV, HD, 10000.0);
    return dot(y, r);
  };
  rope_backward_reference<double>(dx.data(), r.data(), B, T, NH, NKV, HD, 10000.0);
  EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol, "rope dx");
}

// Hugging Face's formula written out: q * cos + rotate_half(q) * sin, angle t * base^(-2i/HD);
// v untouched; and the backward undoes the forward.
TEST(Rope, MatchesRotateHalfAndInverts) {
  std::mt19937_64 gen(test_seed());
  const int B = 1, T = 7, NH = 2, NKV = 1, HD = 8, W = (NH + 2 * NKV) * HD;
  const double base = 500000;
  auto x = randn<double>(size_t(T) * W, gen);
  std::vector<double> y(x.size()), back(x.size());
  rope_forward_reference<double>(y.data(), x.data(), B, T, NH, NKV, HD, base);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < NH + 2 * NKV; ++h)
      for (int i = 0; i < HD; ++i) {
        const int j = i % (HD / 2);
        const double angle = t * std::pow(base, -2.0 * j / HD);
        const double* xh = &x[size_t(t) * W + size_t(h) * HD];
        const double rotated_half = i < HD / 2 ? -xh[i + HD / 2] : xh[i - HD / 2];
        const double want =
            h < NH + NKV ? xh[i] * std::cos(angle) + rotated_half * std::sin(angle) : xh[i];
        EXPECT_NEAR(y[size_t(t) * W + size_t(h) * HD + size_t(i)], want, 1e-12)
            << "t " << t << " h " << h;
      }
  rope_backward_reference<double>(back.data(), y.data(), B, T, NH, NKV, HD, base);
  EXPECT_CLOSE(back, x, 1e-14, "inverse rotation");
}

TEST(RopeVariants, EachDiffersFromTheReferenceWhereDocumented) {
  std::mt19937_64 gen(test_seed());
  const int B = 2, T = 9, NH = 2, NKV = 2, HD = 8, W = (NH + 2 * NKV) * HD;
  auto x = randn<float>(size_t(B) * T * W, gen);
  const auto ref = rope("forward", "reference", x, B, T, NH, NKV, HD, 500000.f);
  for (const char* v : {"base_10000", "interleaved_pairs", "position_plus_one"})
    EXPECT_GT(compare(rope("forward", v, x, B, T, NH, NKV, HD, 500000.f), ref).error, 1e-2) << v;
  // A base of 10000 hides the fixed base exactly.
  EXPECT_EQ(rope("forward", "base_10000", x, B, T, NH, NKV, HD, 10000.f),
            rope("forward", "reference", x, B, T, NH, NKV, HD, 10000.f));
  // q . k depends only on the positions' difference: shifting every position by one leaves every
  // attention score (q_t . k_s for one head) as it was.
  const auto shifted = rope("forward", "position_plus_one", x, B, T, NH, NKV, HD, 500000.f);
  for (int t = 0; t < T; ++t)
    for (int s2 = 0; s2 <= t; ++s2) {
      double a = 0, b = 0;
      for (int i = 0; i < HD; ++i) {
        a += double(ref[size_t(t) * W + size_t(i)]) *
             ref[size_t(s2) * W + size_t(NH) * HD + size_t(i)];
        b += double(shifted[size_t(t) * W + size_t(i)]) *
             shifted[size_t(s2) * W + size_t(NH) * HD + size_t(i)];
      }
      EXPECT_NEAR(a, b, 1e-4 * (1 + std::abs(a))) << "t " << t << " s " << s2;
    }
}

// A forward variant brings its own backward: choosing it alone selects the pair.
TEST(RopeVariants, ForwardVariantRunsWithItsBackward) {
  const auto set = cpu_catalogue<float>().select({{"rope_forward", "interleaved_pairs"}});
  EXPECT_TRUE(set.rope_backward ==
              cpu_catalogue<float>().rope_backward.find("interleaved_pairs")->fn);
  EXPECT_THROW(cpu_catalogue<float>().select(
                   {{"rope_forward", "interleaved_pairs"}, {"rope_backward", "reference"}}),
               UnknownKernel);
}
}  // namespace divlab
