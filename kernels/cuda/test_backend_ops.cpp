// Every op of the CUDA backend against the CPU reference in fp64 (ggml's test-backend-ops idea):
// one normalised error measure, guard regions around every output, shapes that are multiples
// of nothing (B 3, T 37, C 72, 4 heads of 18, V 301), fresh random inputs each run. Then every
// GPU variant against its CPU namesake, bitwise run-to-run determinism of the references, and the
// documented failures of the GPU-only candidates (atomics).
#include <random>

#include "tests/gpu/gpu_check.h"

namespace divlab {
using namespace testing;

namespace {
constexpr int B = 3, Tn = 37, C = 72, NH = 4, V = 301, N = B * Tn;

std::vector<double> normal(size_t n, std::mt19937_64& gen, double scale = 1.0) {
  return randn<double>(n, gen, scale);
}
// Token ids: Zipf-like (id k with weight 1/(k+1)) so some rows collect many contributions.
std::vector<TokenId> zipf_ids(int n, int vocab, std::mt19937_64& gen) {
  std::vector<double> w(vocab);
  for (int k = 0; k < vocab; ++k) w[k] = 1.0 / (k + 1);
  std::discrete_distribution<int> d(w.begin(), w.end());
  std::vector<TokenId> ids(n);
  for (auto& t : ids) t = d(gen);
  return ids;
}

// Runs `call` with the fp64 CPU reference and with `gpu_set`; compares every output.
template <class KS, class F>
void expect_matches_fp64(const std::string& what, const OpInputs& x, const KS& gpu_set, double tol,
                         F&& call) {
  const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), x, call);
  const auto got = run_checked<float>(gpu_set, x, call);
  for (size_t o = 0; o < ref.size(); ++o)
    EXPECT_CLOSE(got[o], ref[o], tol, what + " output " + std::to_string(o));
}

// The calls, generic over the kernel set so one lambda serves fp64 CPU and either GPU mode.
#define OP_CALL [&](const auto& k, auto& in, const TokenId* ids, auto& out)
template <class K>
using Value = typename std::decay_t<K>::Value;

struct Fixture {
  std::mt19937_64 gen{test_seed()};
  std::vector<TokenId> tokens = zipf_ids(N, V, gen);
};

}  // namespace

// Typed over the activation storage type: fp32 mode (float) and bf16 mode (bf16). In bf16 mode
// the activation inputs are rounded to bf16 first (act()), as the model stores them, so both
// sides compute from the same values and the comparison measures the kernel; its bf16 outputs
// carry 2^-9 relative rounding each, which kTolGpuBf16 covers.
template <class A>
class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_GPU(); }
  static constexpr bool kBf16 = std::is_same_v<A, bf16>;
  KernelSet<float, A> reference() const { return gpu_catalogue<A>().select({}); }
  double tol() const { return kBf16 ? kTolGpuBf16 : kTolGpuFp32; }
  // Tolerance of ops without GEMMs: fp32 arithmetic, outputs in A.
  double pointwise_tol() const { return tol(); }
  std::vector<double> act(std::vector<double> v) const {
    if (kBf16)
      for (auto& x : v) x = to_double(to_bf16(float(x)));
    return v;
  }
  Fixture f;
};
TYPED_TEST_SUITE(GpuOps, StorageTypes, StorageName);

TYPED_TEST(GpuOps, PointwiseAndRowOpsMatchFp64) {
  const auto k = this->reference();
  auto& f = this->f;
  const double kTol = this->pointwise_tol();
  auto act = [&](std::vector<double> v) { return this->act(std::move(v)); };
  expect_matches_fp64(
      "embedding_forward",
      {{normal(V * C, f.gen), normal(Tn * C, f.gen)}, f.tokens, {zeros(N * C)}}, k, kTolGpuFp32,
      OP_CALL {
        k.embedding_forward(test_context(*k.memory), out[0], ids, in[0], in[1], B, Tn, C);
      });
  expect_matches_fp64(
      "rmsnorm_forward",
      {{normal(N * C, f.gen, 3.0), normal(C, f.gen)}, {}, {zeros(N * C), zeros(N)}}, k, kTol,
      OP_CALL {
        k.rmsnorm_forward(test_context(*k.memory), out[0], out[1], in[0], in[1], N, C,
                          Value<decltype(k)>(1e-5));
      });
  expect_matches_fp64(
      "rmsnorm_backward",
      {{act(normal(N * C, f.gen)), normal(N * C, f.gen), normal(C, f.gen), normal(N, f.gen, 0.1)},
       {},
       {normal(N * C, f.gen), normal(C, f.gen)}},
      k, kTol, OP_CALL {
        k.rmsnorm_backward(test_context(*k.memory), out[0], out[1], in[0], in[1], in[2], in[3], N,
                           C);
      });
  expect_matches_fp64(
      "gelu_forward", {{act(normal(N * C, f.gen, 4.0))}, {}, {zeros(N * C)}}, k, kTol,
      OP_CALL { k.gelu_forward(test_context(*k.memory), out[0], in[0], int64_t(N) * C); });
  expect_matches_fp64(
      "gelu_backward",
      {{act(normal(N * C, f.gen)), act(normal(N * C, f.gen, 4.0))}, {}, {zeros(N * C)}}, k, kTol,
      OP_CALL { k.gelu_backward(test_context(*k.memory), out[0], in[0], in[1], int64_t(N) * C); });
  expect_matches_fp64(
      "add", {{normal(N * C, f.gen), act(normal(N * C, f.gen))}, {}, {zeros(N * C)}}, k, kTol,
      OP_CALL { k.add(test_context(*k.memory), out[0], in[0], in[1], int64_t(N) * C); });
  std::vector<TokenId> targets = zipf_ids(N, V, f.gen);
  expect_matches_fp64(
      "cross_entropy", {{act(normal(N * V, f.gen, 5.0))}, targets, {zeros(N), zeros(N * V)}}, k,
      kTol, OP_CALL {
        k.cross_entropy(test_context(*k.memory), out[0], out[1], in[0], ids, N, V,
                        Value<decltype(k)>(1.0 / N));
      });
  expect_matches_fp64(
      "embed_rmsnorm_backward",
      {{act(normal(N * C, f.gen)), normal(N * C, f.gen), normal(N * C, f.gen), normal(C, f.gen),
        normal(N, f.gen, 0.5)},
       f.tokens,
       {normal(V * C, f.gen), normal(Tn * C, f.gen), normal(C, f.gen)}},
      k, kTolGpuFp32, OP_CALL {
        k.embed_rmsnorm_backward(test_context(*k.memory), out[0], out[1], out[2], in[0], in[1],
                                 in[2], in[3], in[4], ids, B, Tn, C, V);
      });
  // The activation copy: exact in fp32 mode, round to nearest even in bf16 mode.
  const std::vector<double> xs = normal(N * C, f.gen);
  const auto cast = run_checked<float>(
      k, OpInputs{{xs}, {}, {zeros(N * C)}},
      OP_CALL { k.cast(test_context(*k.memory), out[0], in[0], int64_t(N) * C); });
  for (size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(cast[0][i], this->act({double(float(xs[i]))})[0]) << "cast, element " << i;
}

TYPED_TEST(GpuOps, GemmOpsMatchFp64) {
  const auto k = this->reference();
  auto& f = this->f;
  const double tol = this->tol();
  auto act = [&](std::vector<double> v) { return this->act(std::move(v)); };
  const int in_f = 72, out_f = 217;
  expect_matches_fp64(
      "linear_forward",
      {{act(normal(N * in_f, f.gen)), act(normal(out_f * in_f, f.gen))}, {}, {zeros(N * out_f)}}, k,
      tol,
      OP_CALL { k.linear_forward(test_context(*k.memory), out[0], in[0], in[1], N, in_f, out_f); });
  expect_matches_fp64(
      "linear_backward",
      {{act(normal(N * out_f, f.gen)), act(normal(N * in_f, f.gen)),
        act(normal(out_f * in_f, f.gen))},
       {},
       {zeros(N * in_f), normal(out_f * in_f, f.gen)}},
      k, tol, OP_CALL {
        k.linear_backward(test_context(*k.memory), out[0], out[1], in[0], in[1], in[2], N, in_f,
                          out_f);
      });
  expect_matches_fp64(
      "attention_forward",
      {{act(normal(N * 3 * C, f.gen))}, {}, {zeros(N * C), zeros(B * NH * Tn * Tn)}}, k, tol,
      OP_CALL {
        k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], B, Tn, C, NH);
      });
  // The backward's saved probabilities come from the CPU reference forward, so both backends
  // differentiate at the same point.
  OpInputs fwd{{act(normal(N * 3 * C, f.gen))}, {}, {zeros(N * C), zeros(B * NH * Tn * Tn)}};
  const auto saved = run_checked<double>(
      cpu_catalogue<double>().select({}), fwd, OP_CALL {
        k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], B, Tn, C, NH);
      });
  expect_matches_fp64(
      "attention_backward",
      {{act(normal(N * C, f.gen)), fwd.values[0], act(saved[1])}, {}, {zeros(N * 3 * C)}}, k, tol,
      OP_CALL {
        k.attention_backward(test_context(*k.memory), out[0], in[0], in[1], in[2], B, Tn, C, NH);
      });
}

TYPED_TEST(GpuOps, OptimizerOpsMatchFp64) {
  const auto k = this->reference();
  auto& f = this->f;
  const int64_t n = 100003;
  expect_matches_fp64(
      "sgd_step", {{normal(n, f.gen)}, {}, {normal(n, f.gen), normal(n, f.gen)}}, k, kTolGpuFp32,
      OP_CALL {
        using U = Value<decltype(k)>;
        k.sgd_step(test_context(*k.memory), out[0], out[1], in[0], n, U(0.1), U(0.9), true, U(0.01),
                   U(0.5));
      });
  std::vector<double> v = normal(n, f.gen);
  for (auto& x : v) x = x * x;
  expect_matches_fp64(
      "adamw_step", {{normal(n, f.gen)}, {}, {normal(n, f.gen), normal(n, f.gen), v}}, k,
      kTolGpuFp32, OP_CALL {
        using U = Value<decltype(k)>;
        k.adamw_step(test_context(*k.memory), out[0], out[1], out[2], in[0], n, U(1e-3), U(0.9),
                     U(0.95), U(1e-8), U(0.1), U(1.0), 7);
      });
  // sum_squares writes one double in the backend's memory.
  const std::vector<double> g = normal(n, f.gen);
  Buffer<float> dg(*k.memory, n);
  dg.assign(g);
  Buffer<double> out(*k.memory, 1);
  k.sum_squares(test_context(*k.memory), out.data(), dg.data(), n);
  double expect = 0;
  for (double x : g) expect += double(float(x)) * double(float(x));
  EXPECT_NEAR(out.to_vector()[0], expect, expect * 1e-12);
}

// The bf16 mode must really run bf16 GEMMs: its error is above fp32's.
TEST(GpuOpsBf16, GemmsAreReallyBf16) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  const int in_f = 256, out_f = 128;
  const OpInputs x{{normal(N * in_f, gen), normal(out_f * in_f, gen)}, {}, {zeros(N * out_f)}};
  auto call = OP_CALL {
    k.linear_forward(test_context(*k.memory), out[0], in[0], in[1], N, in_f, out_f);
  };
  const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), x, call);
  const auto got = run_checked<float>(gpu_catalogue<bf16>().select({}), x, call);
  EXPECT_GT(compare(got[0], ref[0]).error, 1e-4);
}

// Every deterministic GPU variant computes what its CPU namesake computes.
TEST(GpuVariants, MatchTheirCpuNamesakes) {
  REQUIRE_GPU();
  Fixture f;
  auto both = [&](const std::string& op, const std::string& variant, const OpInputs& x, auto call) {
    const auto cpu = run_checked<float>(cpu_catalogue<float>().select({{op, variant}}), x, call);
    const auto got = run_checked<float>(gpu().select({{op, variant}}), x, call);
    for (size_t o = 0; o < cpu.size(); ++o)
      EXPECT_CLOSE(got[o], cpu[o], 1e-4, op + "=" + variant + " output " + std::to_string(o));
  };
  std::vector<double> x =
      normal(N * C, f.gen, 1e-3);  // RMS near eps: where the eps variants differ
  for (const char* v : {"eps_outside_sqrt", "no_eps"})
    both(
        "rmsnorm_forward", v, {{x, normal(C, f.gen)}, {}, {zeros(N * C), zeros(N)}}, OP_CALL {
          k.rmsnorm_forward(test_context(*k.memory), out[0], out[1], in[0], in[1], N, C, 1e-5f);
        });
  both(
      "rmsnorm_backward", "bf16_reduce",
      {{normal(N * C, f.gen), normal(N * C, f.gen), normal(C, f.gen), normal(N, f.gen, 0.1)},
       {},
       {zeros(N * C), zeros(C)}},
      OP_CALL {
        k.rmsnorm_backward(test_context(*k.memory), out[0], out[1], in[0], in[1], in[2], in[3], N,
                           C);
      });
  for (const char* v : {"mask_off_by_one", "no_max_subtraction"})
    both(
        "attention_forward", v,
        {{normal(N * 3 * C, f.gen)}, {}, {zeros(N * C), zeros(B * NH * Tn * Tn)}}, OP_CALL {
          k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], B, Tn, C, NH);
        });
  const int in_f = 72, out_f = 217;  // 217 = 6 * 32 + 25: tail_skip leaves 25 features stale
  for (const char* v : {"tail_skip", "bf16_truncate", "bf16_rne"})
    both(
        "linear_forward", v,
        {{normal(N * in_f, f.gen), normal(out_f * in_f, f.gen)}, {}, {normal(N * out_f, f.gen)}},
        OP_CALL {
          k.linear_forward(test_context(*k.memory), out[0], in[0], in[1], N, in_f, out_f);
        });
  both(
      "cross_entropy", "no_max_subtraction",
      {{normal(N * V, f.gen)}, f.tokens, {zeros(N), zeros(N * V)}}, OP_CALL {
        k.cross_entropy(test_context(*k.memory), out[0], out[1], in[0], ids, N, V, 1.0f / N);
      });
  both(
      "embed_rmsnorm_backward", "fp64_accum",
      {{normal(N * C, f.gen), normal(N * C, f.gen), normal(N * C, f.gen), normal(C, f.gen),
        normal(N, f.gen, 0.5)},
       f.tokens,
       {zeros(V * C), zeros(Tn * C), zeros(C)}},
      OP_CALL {
        k.embed_rmsnorm_backward(test_context(*k.memory), out[0], out[1], out[2], in[0], in[1],
                                 in[2], in[3], in[4], ids, B, Tn, C, V);
      });
}

// --- the embedding-gradient candidates, at the dose that exposes them ------------------------
namespace {
// One hot token at every position of a large batch: its row of dwte collects B*T contributions.
struct Scatter {
  int B = 32, T = 128, C = 64, V = 512;
  OpInputs x;
  Scatter(std::mt19937_64& gen, bool hot) {
    const int n = B * T;
    std::vector<TokenId> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = hot ? 7 : TokenId(gen() % V);
    // Same-sign contributions per channel (|mean| >> spread), as the gradients of a frequent
    // token's row tend to be.
    std::vector<double> dy = normal(size_t(n) * C, gen, 0.1);
    for (auto& v : dy) v += 1.0;
    x = {{dy, normal(size_t(n) * C, gen, 0.1), normal(size_t(n) * C, gen),
          std::vector<double>(C, 1.0), std::vector<double>(n, 1.0)},
         ids,
         {zeros(size_t(V) * C), zeros(size_t(T) * C), zeros(C)}};
  }
  auto call() const {
    return OP_CALL {
      k.embed_rmsnorm_backward(test_context(*k.memory), out[0], out[1], out[2], in[0], in[1], in[2],
                               in[3], in[4], ids, B, T, C, V);
    };
  }
  // Normalised error of dwte against the fp64 CPU reference.
  double dwte_error(const std::string& variant) const {
    const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), x, call());
    const auto got =
        run_checked<float>(gpu().select({{"embed_rmsnorm_backward", variant}}), x, call());
    return compare(got[0], ref[0]).error;
  }
};
}  // namespace

// The verifier that passed the seed bug: |a - b| <= 1e-2 + 1e-2 |b| for 99 % of the elements.
double verifier_pass_fraction(const std::vector<double>& got, const std::vector<double>& ref) {
  size_t pass = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    pass += std::abs(got[i] - ref[i]) <= 1e-2 + 1e-2 * std::abs(ref[i]);
  return double(pass) / double(ref.size());
}

TEST(GpuEmbedScatter, Bf16AtomicsLoseTheHotRowWhileTheVerifierPasses) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  const Scatter hot(gen, true);
  const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), hot.x, hot.call());
  const auto got = run_checked<float>(gpu().select({{"embed_rmsnorm_backward", "bf16_accum"}}),
                                      hot.x, hot.call());
  // 4096 same-sign adds into one bf16 value stall near 2^8-2^9 of them.
  EXPECT_GT(compare(got[0], ref[0]).error, 0.5);
  // ... yet the hot row is 64 of 32768 elements: the benchmark's 99 % rule passes it.
  EXPECT_GE(verifier_pass_fraction(got[0], ref[0]), 0.99);
  // With uniform tokens (about 8 adds per row) it passes as well (measured: 99.93 %).
  const Scatter uniform(gen, false);
  const auto uref =
      run_checked<double>(cpu_catalogue<double>().select({}), uniform.x, uniform.call());
  const auto ugot = run_checked<float>(gpu().select({{"embed_rmsnorm_backward", "bf16_accum"}}),
                                       uniform.x, uniform.call());
  EXPECT_GE(verifier_pass_fraction(ugot[0], uref[0]), 0.99);
  EXPECT_GT(Scatter(gen, true).dwte_error("fp16_accum"), 1e-3);  // 11 bits stall near 2^11
}

// The compare-and-swap roundings on the hot row, as their CPU namesakes' tests have them (but
// not bitwise: the order of the atomic additions varies run to run on the GPU).
TEST(GpuEmbedScatter, RoundingVariantsBiasTheHotRowAsDocumented) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  const Scatter hot(gen, true);
  const auto ref = run_checked<double>(cpu_catalogue<double>().select({}), hot.x, hot.call());
  // Mean over channels of the hot row's signed relative error.
  auto bias = [&](const std::string& variant) {
    const auto got =
        run_checked<float>(gpu().select({{"embed_rmsnorm_backward", variant}}), hot.x, hot.call());
    double s = 0;
    for (int c = 0; c < hot.C; ++c) {
      const size_t i = size_t(7) * hot.C + c;
      s += (got[0][i] - ref[0][i]) / std::abs(ref[0][i]);
    }
    return s / hot.C;
  };
  const double rne = bias("bf16_accum"), trunc = bias("bf16_truncate_accum"),
               fresh = bias("bf16_stochastic_accum"), reused = bias("bf16_stochastic_reused_seed");
  EXPECT_LT(rne, -0.3);              // stalled: 4096 same-sign adds of ~1
  EXPECT_LT(trunc, rne);             // truncation drops whole ulps, so it stalls earlier
  EXPECT_LT(std::abs(fresh), 0.05);  // fresh bits: unbiased on average over the channels
  EXPECT_GT(std::abs(reused), 5 * std::abs(fresh));  // one fixed threshold per channel
}

TEST(GpuEmbedScatter, RacyScatterLosesUpdatesOnTheHotRow) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  EXPECT_GT(Scatter(gen, true).dwte_error("racy_scatter"), 0.1);
}

TEST(GpuEmbedScatter, ControlsStayWithinFp32) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  for (bool hot : {true, false}) {
    const Scatter s(gen, hot);
    EXPECT_LT(s.dwte_error("reference"), 1e-5);
    EXPECT_LT(s.dwte_error("fp32_reordered"), 1e-5);
    EXPECT_LT(s.dwte_error("fp64_accum"), 1e-6);
  }
}

// Reference kernels use no float atomics: the same inputs give the same bits, every time.
TEST(GpuDeterminism, ReferencesAreBitwiseRepeatable) {
  REQUIRE_GPU();
  std::mt19937_64 gen(test_seed());
  auto repeatable = [&](const auto& cat) {
    const auto k = cat.select({});
    const Scatter s(gen, true);
    EXPECT_EQ(run_checked<float>(k, s.x, s.call()), run_checked<float>(k, s.x, s.call()));
    OpInputs fwd{{normal(N * 3 * C, gen)}, {}, {zeros(N * C), zeros(B * NH * Tn * Tn)}};
    auto att = OP_CALL {
      k.attention_forward(test_context(*k.memory), out[0], out[1], in[0], B, Tn, C, NH);
    };
    const auto a = run_checked<float>(k, fwd, att);
    EXPECT_EQ(a, run_checked<float>(k, fwd, att));
    OpInputs bwd{{normal(N * C, gen), fwd.values[0], a[1]}, {}, {zeros(N * 3 * C)}};
    auto back = OP_CALL {
      k.attention_backward(test_context(*k.memory), out[0], in[0], in[1], in[2], B, Tn, C, NH);
    };
    EXPECT_EQ(run_checked<float>(k, bwd, back), run_checked<float>(k, bwd, back));
  };
  repeatable(gpu());
  repeatable(gpu_catalogue<bf16>());
}

}  // namespace divlab
