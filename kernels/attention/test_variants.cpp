#include "kernels/attention/attention.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
std::vector<float> forward(const std::string& variant, const std::vector<float>& qkv, int T, int C,
                           int NH) {
  std::vector<float> out(T * C), att(NH * T * T);
  cpu_catalogue<float>().attention_forward.find(variant)->fn(test_context(), out.data(), att.data(),
                                                             qkv.data(), 1, T, C, NH);
  return out;
}
}  // namespace

TEST(AttentionMaskOffByOne, EveryPositionSeesTheNextOne) {
  std::mt19937_64 gen(test_seed());
  const int T = 6, C = 8, NH = 2;
  auto qkv = randn<float>(T * 3 * C, gen);
  const auto before = forward("mask_off_by_one", qkv, T, C, NH);
  for (int c = 2 * C; c < 3 * C; ++c) qkv[3 * 3 * C + c] += 1.f;  // change v at position 3
  const auto after = forward("mask_off_by_one", qkv, T, C, NH);
  for (int c = 0; c < C; ++c) {
    EXPECT_EQ(before[1 * C + c], after[1 * C + c]);  // position 1 sees 0..2: unchanged
    EXPECT_NE(before[2 * C + c], after[2 * C + c]);  // position 2 sees 0..3: leaked
  }
}

TEST(AttentionNoMaxSubtraction, FineOnSmallScoresNanOnLarge) {
  std::mt19937_64 gen(test_seed());
  const int T = 8, C = 8, NH = 1;
  auto small = randn<float>(T * 3 * C, gen);
  EXPECT_CLOSE(forward("no_max_subtraction", small, T, C, NH),
               forward("reference", small, T, C, NH), 1e-5, "small scores");
  auto large = small;
  for (auto& v : large) v *= 30.f;  // scores ~ 30^2 x sqrt(8) >> 88
  bool nan = false;
  for (float v : forward("no_max_subtraction", large, T, C, NH)) nan = nan || !std::isfinite(v);
  EXPECT_TRUE(nan);
  for (float v : forward("reference", large, T, C, NH)) EXPECT_TRUE(std::isfinite(v));
}
}  // namespace divlab
