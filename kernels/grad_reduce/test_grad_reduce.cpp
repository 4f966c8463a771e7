#include <cmath>
#include <limits>

#include "kernels/common/lowp.h"
#include "kernels/grad_reduce/grad_reduce.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
// The CPU catalogue's grad_reduce variant `name` on `shards` ([ranks, n]).
std::vector<float> reduce(const std::string& name, const std::vector<float>& shards, int ranks) {
  const int64_t n = int64_t(shards.size()) / ranks;
  std::vector<float> out(size_t(n), std::numeric_limits<float>::quiet_NaN());
  const KernelSet<float> k = cpu_catalogue<float>().select({{"grad_reduce", name}});
  k.grad_reduce(test_context(), out.data(), shards.data(), ranks, n);
  return out;
}
std::vector<double> exact_mean(const std::vector<float>& shards, int ranks) {
  const size_t n = shards.size() / size_t(ranks);
  std::vector<double> mean(n, 0.0);
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < n; ++i) mean[i] += double(shards[size_t(r) * n + i]);
  for (double& m : mean) m /= ranks;
  return mean;
}
}  // namespace

TEST(GradReduce, ReferenceAndControlsAreTheMeanToFp32Rounding) {
  std::mt19937_64 gen(test_seed());
  for (int ranks : {1, 2, 3, 7, 8}) {
    const int64_t n = 1 + int64_t(gen() % 50000);
    const auto shards = randn<float>(size_t(n * ranks), gen, 1e-3);
    const auto mean = exact_mean(shards, ranks);
    for (const char* v : {"reference", "reversed_order", "fp64_accum"})
      EXPECT_CLOSE(reduce(v, shards, ranks), mean, 4e-7 * ranks,
                   std::string(v) + " at " + std::to_string(ranks) + " ranks");
  }
}

TEST(GradReduce, OneRankIsTheShardItselfBitForBit) {
  std::mt19937_64 gen(test_seed());
  const auto g = randn<float>(12345, gen);
  EXPECT_EQ(reduce("reference", g, 1), g);
}

TEST(GradReduce, EachVariantGetsItsDocumentedError) {
  std::mt19937_64 gen(test_seed());
  const int ranks = 4;
  const int64_t n = 3 * ranks * kRingSlice + 1000;  // three whole ring rounds and a partial one
  const auto shards = randn<float>(size_t(n * ranks), gen, 1e-2);
  const auto mean = exact_mean(shards, ranks);
  // The world-size division left out: exactly R times the mean (to rounding).
  std::vector<double> times_r(mean);
  for (double& m : times_r) m *= ranks;
  EXPECT_CLOSE(reduce("sum_not_mean", shards, ranks), times_r, 1e-6, "sum_not_mean");
  // bf16: errors of bf16's rounding, not fp32's, and far from an unrelated result.
  const Comparison bf16 = compare(reduce("bf16_reduce", shards, ranks), mean);
  EXPECT_GT(bf16.error, 1e-4) << bf16.describe("bf16_reduce");
  EXPECT_LT(bf16.error, 2e-2) << bf16.describe("bf16_reduce");
  const Comparison comm = compare(reduce("bf16_comm", shards, ranks), mean);
  EXPECT_GT(comm.error, 1e-5) << comm.describe("bf16_comm");
  EXPECT_LT(comm.error, bf16.error) << "one rounding per value is less than R - 1 of them";
  // The ring: every whole round the reference's bits, the tail rank 0's own share.
  const auto ring = reduce("ring_drops_tail", shards, ranks);
  const auto reference = reduce("reference", shards, ranks);
  const int64_t covered = ring_covered(ranks, n);
  ASSERT_EQ(covered, 3 * ranks * kRingSlice);
  for (int64_t i = 0; i < n; ++i) {
    const float want = i < covered ? reference[size_t(i)] : shards[size_t(i)] / float(ranks);
    ASSERT_EQ(ring[size_t(i)], want) << "value " << i << " (seed " << test_seed() << ")";
  }
  EXPECT_GT(compare(ring, mean).error, 1e-2) << "the tail is one rank's share, not the mean";
}

TEST(GradReduce, Fp16CommunicationFlushesSmallGradientsAndOverflowsLargeOnes) {
  // Gradients of a mean loss over many tokens are small: below fp16's smallest subnormal they
  // become zero, and fp16 has no room above 65504.
  const int ranks = 2;
  const std::vector<float> shards = {1e-8f, 3e-6f, 1.0f, 4e4f, 1e-8f, 3e-6f, 1.0f, 4e4f};
  const auto out = reduce("fp16_comm", shards, ranks);
  EXPECT_EQ(out[0], 0.0f) << "1e-8 is below fp16's smallest subnormal (6e-8): flushed";
  EXPECT_NE(out[1], 3e-6f) << "3e-6 is an fp16 subnormal: its quantum is 6e-8";
  EXPECT_NEAR(out[1], 3e-6f, 6e-8);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 4e4f) << "4e4 is representable in fp16 (a multiple of its quantum 32)";
  const std::vector<float> large = {7e4f, 1.0f};
  EXPECT_TRUE(std::isinf(reduce("fp16_comm", large, ranks)[0])) << "above 65504: inf";
}

TEST(GradReduce, TheControlIsBenignAndTheCandidatesAreNot) {
  const auto& ops = cpu_catalogue<float>().grad_reduce;
  ASSERT_NE(ops.find("reversed_order"), nullptr);
  EXPECT_TRUE(ops.find("reversed_order")->doc.benign);
  EXPECT_TRUE(ops.find("fp64_accum")->doc.benign);
  for (const char* v :
       {"bf16_reduce", "bf16_comm", "fp16_comm", "sum_not_mean", "ring_drops_tail"}) {
    ASSERT_NE(ops.find(v), nullptr) << v;
    EXPECT_FALSE(ops.find(v)->doc.benign) << v;
    EXPECT_FALSE(ops.find(v)->doc.wrong.empty()) << v;
  }
}

}  // namespace divlab
