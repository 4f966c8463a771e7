// call_op_tiled, the call behind check's "logits past 2^32" (a GPU condition: on the host
// its 4.3 G values are not tried), at sizes a test can afford: a reference's copies are its
// base call, a kernel whose index wraps is judged on the copy it breaks, and writes outside the
// arrays are caught as in any call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/op_cases.h"
#include "kernels/registry.h"
#include "tests/support/check.h"
#include "tests/support/registered.h"

namespace divlab {
namespace {

using testing::Registered;

constexpr OpShape kBase{1, 7, 6, 1, 13};
constexpr int kCopies = 5;

OpInputs inputs(const std::string& op, std::mt19937_64& gen) {
  OpInputs x = op_inputs(op, kBase, uniform_tokens(kBase, gen), Values::Normal, gen);
  x.scalars = random_scalars(gen);
  return x;
}

double largest_relative_difference(const OpRun& a, const OpRun& b) {
  double d = 0;
  for (size_t o = 0; o < a.outputs.size(); ++o) {
    double scale = 0;
    for (double v : b.outputs[o]) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < a.outputs[o].size(); ++i)
      d = std::max(d, std::abs(a.outputs[o][i] - b.outputs[o][i]) / std::max(scale, 1e-30));
  }
  return d;
}

// A cross-entropy whose row index wraps past 30 rows, as a 32-bit one wraps past 2^32 values:
// the last rows read the first rows' logits and targets.
void cross_entropy_wrapping(float* losses, float* dlogits, const float* logits,
                            const TokenId* targets, int N, int V, float dloss) {
  for (int n = 0; n < N; ++n) {
    const int row = n % 30;
    const float* z = logits + int64_t(row) * V;
    float mx = z[0], sum = 0;
    for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    losses[n] = mx + std::log(sum) - z[targets[row]];
    for (int v = 0; v < V; ++v) dlogits[int64_t(n) * V + v] = std::exp(z[v] - mx) / sum * dloss;
    dlogits[int64_t(n) * V + targets[row]] -= dloss;
  }
}

void softcap_past_end(float* y, const float* x, int64_t n, float cap) {
  for (int64_t i = 0; i <= n; ++i) y[i] = cap * std::tanh(x[std::min(i, n - 1)] / cap);
}

void softcap_into_input(float* y, const float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) y[i] = cap * std::tanh(x[i] / cap);
  const_cast<float*>(x)[n - 1] = 0;  // NOLINT(cppcoreguidelines-pro-type-const-cast): the bug
}

TEST(TiledCall, AReferencesCopiesAreItsBaseCall) {
  const uint64_t seed = testing::test_seed();
  std::mt19937_64 gen(seed);
  const KernelSet<float> k = cpu_catalogue<float>().select({});
  for (const std::string op :
       {"cross_entropy", "softcap_forward", "softcap_backward", "linear_forward"}) {
    const OpInputs x = inputs(op, gen);
    const OpRun base = call_op(op, k, x, kBase);
    int chosen = -1;
    const OpRun got = call_op_tiled(op, k, x, kBase, kCopies, base, &chosen);
    EXPECT_TRUE(got.stray_writes.empty()) << op;
    EXPECT_GE(chosen, 0) << op;
    // The rows' own arithmetic is the base call's (a GEMM may block its sums otherwise).
    EXPECT_LE(largest_relative_difference(got, base), 1e-6) << op << ", seed " << seed;
  }
}

// linear_backward's weight gradient sums every copy's rows; rmsnorm_backward's also adds into the
// residual gradient's rows, which grow with the copies.
TEST(TiledCall, AWeightGradientSummedOverTheCopiesIsTheBaseCallsShare) {
  const uint64_t seed = testing::test_seed();
  std::mt19937_64 gen(seed);
  const KernelSet<float> k = cpu_catalogue<float>().select({});
  for (const std::string op : {"linear_backward", "rmsnorm_backward"}) {
    const OpInputs x = inputs(op, gen);
    const OpRun base = call_op(op, k, x, kBase);
    const OpRun got = call_op_tiled(op, k, x, kBase, kCopies, base);
    EXPECT_TRUE(got.stray_writes.empty()) << op;
    EXPECT_LE(largest_relative_difference(got, base), 1e-5) << op << ", seed " << seed;
    EXPECT_EQ(got.summed, (std::vector<bool>{false, true})) << op;  // dx or dresid; dW or dw
    EXPECT_TRUE(base.summed.empty());
    // A gradient that is not zero, so only the share passes (the sum is kCopies times it).
    double largest = 0;
    for (double v : base.outputs[1]) largest = std::max(largest, std::abs(v));
    ASSERT_GT(largest, 0) << op;
  }
}

TEST(TiledCall, ATotalOverTheRowsIsNoShareAndIsRefused) {
  std::mt19937_64 gen(testing::test_seed());
  const KernelSet<float> k = cpu_catalogue<float>().select({});
  const OpInputs x = inputs("sum_squares", gen);
  const OpRun base = call_op("sum_squares", k, x, kBase);
  EXPECT_THROW(call_op_tiled("sum_squares", k, x, kBase, kCopies, base), std::logic_error);
}

TEST(TiledCall, AWrappingIndexIsJudgedOnTheCopyItBreaks) {
  Registered wraps(mutable_cpu_catalogue().cross_entropy, "wraps_past_30_rows",
                   cross_entropy_wrapping);
  const uint64_t seed = testing::test_seed();
  std::mt19937_64 gen(seed);
  const KernelSet<float> k =
      cpu_catalogue<float>().select({{"cross_entropy", "wraps_past_30_rows"}});
  const OpInputs x = inputs("cross_entropy", gen);
  const OpRun base = call_op("cross_entropy", cpu_catalogue<float>().select({}), x, kBase);
  // At the base size (7 rows) it is right.
  EXPECT_LE(largest_relative_difference(call_op("cross_entropy", k, x, kBase), base), 1e-6);
  int chosen = -1, finished = 0;
  const KernelCallMarks marks{[] {}, [&] { ++finished; }};
  const OpRun got = call_op_tiled("cross_entropy", k, x, kBase, kCopies, base, &chosen, &marks);
  EXPECT_EQ(finished, 1);          // once, after the call (check's hang clock stops there)
  EXPECT_EQ(chosen, kCopies - 1);  // rows 30 to 34: the last copy's
  EXPECT_GT(largest_relative_difference(got, base), 1e-2) << "seed " << seed;
}

TEST(TiledCall, WritesOutsideTheOutputsAreCaught) {
  Registered past(mutable_cpu_catalogue().softcap_forward, "past_end", softcap_past_end);
  Registered into(mutable_cpu_catalogue().softcap_forward, "into_input", softcap_into_input);
  std::mt19937_64 gen(testing::test_seed());
  const OpInputs x = inputs("softcap_forward", gen);
  const OpRun base = call_op("softcap_forward", cpu_catalogue<float>().select({}), x, kBase);
  const auto strays = [&](const std::string& variant) {
    return call_op_tiled("softcap_forward",
                         cpu_catalogue<float>().select({{"softcap_forward", variant}}), x, kBase,
                         kCopies, base)
        .stray_writes;
  };
  EXPECT_EQ(strays("past_end"), std::vector<std::string>{"output 0: write past its end"});
  const int64_t last = int64_t(kBase.tokens()) * kCopies * kBase.V - 1;
  EXPECT_EQ(strays("into_input"),
            std::vector<std::string>{"input 0: written at value " + std::to_string(last) +
                                     "; an op's inputs are read-only"});
}

TEST(TiledCall, ItsMemoryIsCountedBeforeAnythingIsAllocated) {
  std::mt19937_64 gen(testing::test_seed());
  const OpInputs x = inputs("cross_entropy", gen);
  const size_t values = size_t(kBase.tokens()) * kCopies * size_t(kBase.V);
  // logits and dlogits in fp32 (and an adapter's fp32 copies of each), the losses, the targets.
  const size_t rows = size_t(kBase.tokens()) * kCopies;
  EXPECT_EQ(tiled_call_bytes("cross_entropy", cpu_catalogue<float>().select({}), x, kBase, kCopies),
            2 * values * 8 + rows * 8 + rows * sizeof(TokenId));
}

}  // namespace
}  // namespace divlab
