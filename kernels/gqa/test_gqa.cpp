#include "kernels/gqa/gqa.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

TEST(Gqa, GradcheckInDouble) {
  std::mt19937_64 gen(test_seed());
  for (const auto& heads : {std::pair{4, 2}, std::pair{6, 2}, std::pair{3, 1}, std::pair{2, 2}}) {
    const int NH = heads.first, NKV = heads.second, N = 3, HD = 3, W = (NH + 2 * NKV) * HD;
    auto x = randn<double>(size_t(N) * W, gen), r = randn<double>(size_t(N) * 3 * NH * HD, gen);
    std::vector<double> y(r.size()), dx(x.size());
    auto objective = [&] {
      gqa_forward_reference<double>(y.data(), x.data(), N, NH, NKV, HD);
      return dot(y, r);
    };
    gqa_backward_reference<double>(dx.data(), r.data(), N, NH, NKV, HD);
    EXPECT_CLOSE(dx, numeric_grad(objective, x), kGradcheckTol,
                 "gqa dx, NH " + std::to_string(NH) + " NKV " + std::to_string(NKV));
  }
}

// Query head h reads key/value head h / (NH / NKV) (Hugging Face's repeat_kv).
TEST(Gqa, QueryHeadsReadTheirGroupsHead) {
  const int N = 1, NH = 4, NKV = 2, HD = 1;
  const std::vector<float> x = {0, 1, 2, 3, 10, 11, 20, 21};  // q0..q3 | k0 k1 | v0 v1
  std::vector<float> qkv(12);
  gqa_forward_reference<float>(qkv.data(), x.data(), N, NH, NKV, HD);
  EXPECT_EQ(qkv, (std::vector<float>{0, 1, 2, 3, 10, 10, 11, 11, 20, 20, 21, 21}));
}

TEST(GqaVariants, InterleavedGroupsWrongOnlyForProperGroups) {
  std::mt19937_64 gen(test_seed());
  for (auto [NH, NKV, wrong] : {std::tuple{4, 2, true}, std::tuple{6, 3, true},
                                std::tuple{4, 4, false}, std::tuple{4, 1, false}}) {
    const int N = 5, HD = 4;
    auto dqkv = randn<float>(size_t(N) * 3 * NH * HD, gen);
    std::vector<float> ref(size_t(N * (NH + 2 * NKV) * HD)), got(ref.size());
    cpu_catalogue<float>()
        .gqa_backward.find("reference")
        ->fn(test_context(), ref.data(), dqkv.data(), N, NH, NKV, HD);
    cpu_catalogue<float>()
        .gqa_backward.find("interleaved_groups")
        ->fn(test_context(), got.data(), dqkv.data(), N, NH, NKV, HD);
    if (wrong)
      EXPECT_GT(compare(got, ref).error, 0.1) << NH << "/" << NKV;
    else
      EXPECT_EQ(got, ref) << NH << "/" << NKV;
  }
}
}  // namespace divlab
