// The CPU's bf16 mode (kernels/bf16_activations.h): activations stored in bf16 between ops.
// Every op stays within bf16 rounding of the fp64 reference and its activation outputs are
// rounded once, to nearest even; a model trained in it tracks the fp32 model without being it;
// shadow mode captures its bf16 inputs and judges a candidate on them.
#include <random>

#include "kernels/bf16_activations.h"
#include "kernels/harness.h"
#include "kernels/shadow.h"
#include "model/transformer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
constexpr int B = 2, Tn = 13, C = 24, NH = 3, V = 37, N = B * Tn;
constexpr double kTolBf16 = 1e-2;  // outputs stored in bf16: 2^-9 relative each

// Values a bf16 tensor can hold: what both sides compute from.
std::vector<double> act(std::vector<double> v) {
  for (auto& x : v) x = widen(to_bf16(float(x)));
  return v;
}
std::vector<double> zeros(size_t n) {
  return std::vector<double>(n, 0.0);
}
#define OP_CALL [&](const auto& k, auto& in, const TokenId* ids, auto& out)

template <class KS, class F>
std::vector<std::vector<double>> run(const KS& k, const OpInputs& x, F&& call) {
  OpRun r = run_op(k, x, call);
  for (const auto& w : r.stray_writes) ADD_FAILURE() << w;
  return r.outputs;
}
}  // namespace

TEST(Bf16Activations, OpsStayWithinBf16RoundingOfFp64) {
  std::mt19937_64 gen(test_seed());
  const auto k = cpu_bf16_catalogue().select({});
  const auto ref = cpu_catalogue<double>().select({});
  auto check = [&](const char* what, const OpInputs& x, auto call) {
    const auto want = run(ref, x, call), got = run(k, x, call);
    for (size_t o = 0; o < want.size(); ++o)
      EXPECT_CLOSE(got[o], want[o], kTolBf16, std::string(what) + " output " + std::to_string(o));
  };
  check(
      "rmsnorm_forward",
      {{randn<double>(N * C, gen, 3.0), randn<double>(C, gen)}, {}, {zeros(N * C), zeros(N)}},
      OP_CALL {
        k.rmsnorm_forward(test_context(*k.memory), out[0], out[1], in[0], in[1], N, C, 1e-5);
      });
  check(
      "linear_backward",
      {{act(randn<double>(N * V, gen)), act(randn<double>(N * C, gen)),
        act(randn<double>(V * C, gen))},
       {},
       {zeros(N * C), randn<double>(V * C, gen)}},
      OP_CALL {
        k.linear_backward(test_context(*k.memory), out[0], out[1], in[0], in[1], in[2], N, C, V);
      });
  check(
      "attention_forward",
      {{act(randn<double>(N * 3 * C, gen))}, {}, {zeros(N * C), zeros(B * NH * Tn * Tn)}}, OP_CALL {
        k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], B, Tn, C, NH);
      });
  check(
      "add", {{randn<double>(N * C, gen), act(randn<double>(N * C, gen))}, {}, {zeros(N * C)}},
      OP_CALL { k.add(test_context(*k.memory), out[0], in[0], in[1], int64_t(N) * C); });
  std::vector<TokenId> targets(N);
  for (auto& t : targets) t = TokenId(gen() % V);
  check(
      "cross_entropy", {{act(randn<double>(N * V, gen, 3.0))}, targets, {zeros(N), zeros(N * V)}},
      OP_CALL {
        k.cross_entropy(test_context(*k.memory), out[0], out[1], in[0], ids, N, V, 1.0 / N);
      });
}

// An activation output is the fp32 kernel's result rounded once, to nearest even: exactly, and
// visibly coarser than fp32.
TEST(Bf16Activations, OutputsAreTheFp32ResultRoundedOnce) {
  std::mt19937_64 gen(test_seed());
  const OpInputs x{
      {act(randn<double>(N * C, gen)), act(randn<double>(V * C, gen))}, {}, {zeros(N * V)}};
  auto call = OP_CALL {
    k.linear_forward(test_context(*k.memory), out[0], in[0], in[1], N, C, V);
  };
  const auto fp32 = run(cpu_catalogue<float>().select({}), x, call);
  const auto bf = run(cpu_bf16_catalogue().select({}), x, call);
  bool coarser = false;
  for (size_t i = 0; i < fp32[0].size(); ++i) {
    ASSERT_EQ(bf[0][i], widen(to_bf16(float(fp32[0][i])))) << "element " << i;
    coarser |= bf[0][i] != fp32[0][i];
  }
  EXPECT_TRUE(coarser);
}

TEST(Bf16Activations, CatalogueHasEveryFp32Variant) {
  const auto& f = cpu_catalogue<float>();
  const auto& b = cpu_bf16_catalogue();
  std::vector<std::string> fn, bn;
  f.for_each_op([&](const auto& ops, auto) {
    for (const auto& n : ops.names()) fn.push_back(ops.op + "=" + n);
  });
  b.for_each_op([&](const auto& ops, auto) {
    for (const auto& n : ops.names()) bn.push_back(ops.op + "=" + n);
  });
  EXPECT_EQ(fn, bn);
  EXPECT_THROW(b.select({{"linear_forward", "no_such_variant"}}), UnknownKernel);
}

namespace {
ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab = 64, m.d_model = 32, m.n_layers = 2, m.n_heads = 2, m.seq_len = 16;
  return m;
}
constexpr int kBatch = 8;

// Skewed batches: one id takes half the positions.
std::vector<TokenId> skewed(uint64_t seed, int64_t n, int vocab) {
  std::mt19937_64 gen(seed);
  std::vector<TokenId> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = TokenId(gen() % 2 ? 5 : gen() % uint64_t(vocab));
  return ids;
}

template <class A>
std::vector<double> losses(int steps) {
  const ModelConfig m = tiny_model();
  const auto& cat = [] {
    if constexpr (std::is_same_v<A, bf16>)
      return &cpu_bf16_catalogue();
    else
      return &cpu_catalogue<float>();
  }();
  Transformer<float, A> model(m, cat->select({}), kBatch);
  model.init(test_seed());
  const int64_t n = int64_t(kBatch) * m.seq_len;
  std::vector<double> out;
  for (int s = 0; s < steps; ++s) {
    const auto in = skewed(test_seed() + s, n, m.vocab),
               tgt = skewed(test_seed() + 7 * s, n, m.vocab);
    out.push_back(model.forward(in.data(), tgt.data(), false));
  }
  return out;
}
}  // namespace

// The same weights and batches: every loss within bf16 rounding of the fp32 model's, and not
// all of them equal (the activations really are rounded).
TEST(Bf16Activations, ModelTracksTheFp32Model) {
  const auto bf = losses<bf16>(4), fp = losses<float>(4);
  bool differs = false;
  for (size_t s = 0; s < fp.size(); ++s) {
    EXPECT_NEAR(bf[s], fp[s], 1e-2 * fp[s]) << "batch " << s << " (seed " << test_seed() << ")";
    differs |= bf[s] != fp[s];
  }
  EXPECT_TRUE(differs);
}

// Shadow mode in bf16 mode: the embedding op's bf16 dy is captured as bf16 and widened exactly
// for the fp64 reference, so the fp64-accumulating control sits at fp32 rounding while the
// seed bug stands out on the hot row.
TEST(Bf16Activations, ShadowJudgesCandidatesOnTheBf16Inputs) {
  const ModelConfig m = tiny_model();
  const auto& cat = cpu_bf16_catalogue();
  const auto specs = parse_shadow_specs(
      {"embed_rmsnorm_backward=bf16_accum", "embed_rmsnorm_backward=fp64_accum"}, cat);
  ShadowTap<float, bf16> tap(cat.select({}), specs, cat, 0);
  Transformer<float, bf16> model(m, tap.kernels(), kBatch);
  model.init(test_seed());
  const int64_t n = int64_t(kBatch) * m.seq_len;
  const auto in = skewed(test_seed(), n, m.vocab), tgt = skewed(test_seed() + 1, n, m.vocab);
  tap.arm();
  model.forward(in.data(), tgt.data(), true);
  model.backward();
  tap.submit(in.data(), n, m.vocab, 0);
  const auto results = tap.collect(true);
  ASSERT_EQ(results.size(), 1u);
  const auto& bug = results[0].metrics[0];
  const auto& control = results[0].metrics[1];
  EXPECT_LT(control.rel_l2, 1e-6);
  EXPECT_GT(bug.rel_l2, 100 * control.rel_l2);
}

}  // namespace divlab
