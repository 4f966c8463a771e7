// Shadow mode's tap: comparing on a worker thread (as on the GPU) gives exactly the metrics of
// comparing in the training thread, in step order; tapping never changes the run; and every
// shadowable op is recorded, replayed and compared (its reference within fp32 rounding of fp64,
// a candidate 1 % off measured at 1 %).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>

#include "kernels/bf16_activations.h"
#include "kernels/op_spec.h"
#include "kernels/shadow.h"
#include "model/transformer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
ModelConfig shadow_model() {
  ModelConfig m;
  m.vocab = 64, m.d_model = 16, m.n_layers = 2, m.n_heads = 2, m.seq_len = 24;
  return m;
}
constexpr int kBatch = 12;
constexpr int kSteps = 5;  // more than ShadowTap::kMaxPending: submit() has to wait

// Skewed batches (one id takes half the positions), fresh for every step.
std::vector<TokenId> batch_for(int step, int64_t n, int vocab) {
  std::mt19937_64 gen(test_seed() + uint64_t(step));
  std::vector<TokenId> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = TokenId(gen() % 2 ? 7 : gen() % uint64_t(vocab));
  return ids;
}

struct Shadowed {
  std::vector<ShadowTap<float>::Result> results;
  std::vector<float> grads;  // of the last step
};

// kSteps forward/backward passes of one model with a tap; every step shadowed.
Shadowed run_tapped(int background) {
  const ModelConfig m = shadow_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  const auto& cat = cpu_catalogue<float>();
  const std::vector<ShadowSpec> specs =
      parse_shadow_specs({"embed_rmsnorm_backward=bf16_accum", "linear_forward=bf16_rne",
                          "embed_rmsnorm_backward=fp32_reordered"},
                         cat);
  ShadowTap<float> tap(cat.select({}), specs, cat, background);
  Transformer<float> model(m, tap.kernels(), kBatch);
  model.init(test_seed());
  Shadowed out;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<TokenId> in = batch_for(step, N, m.vocab),
                               tgt = batch_for(step + 99, N, m.vocab);
    tap.arm();
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    tap.submit(in.data(), N, m.vocab, step);
    for (auto& r : tap.collect(false)) out.results.push_back(std::move(r));
    out.grads = model.grads().to_vector();
  }
  for (auto& r : tap.collect(true)) out.results.push_back(std::move(r));
  return out;
}

bool same(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}
}  // namespace

TEST(Shadow, WorkerThreadGivesTheSameMetricsInStepOrder) {
  const Shadowed here = run_tapped(0), worker = run_tapped(1);
  ASSERT_EQ(here.results.size(), size_t(kSteps));
  ASSERT_EQ(worker.results.size(), size_t(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    const auto &a = here.results[step], &b = worker.results[step];
    EXPECT_EQ(a.step, step);
    EXPECT_EQ(b.step, step);
    ASSERT_EQ(a.metrics.size(), 3u);
    ASSERT_EQ(b.metrics.size(), 3u);
    for (size_t s = 0; s < a.metrics.size(); ++s) {
      EXPECT_TRUE(same(a.metrics[s].rel_l2, b.metrics[s].rel_l2))
          << "step " << step << " spec " << s;
      EXPECT_TRUE(same(a.metrics[s].max_row_rel, b.metrics[s].max_row_rel));
      EXPECT_TRUE(same(a.metrics[s].cosine, b.metrics[s].cosine));
      ASSERT_EQ(a.metrics[s].bucket_rel_l2.size(), b.metrics[s].bucket_rel_l2.size());
      for (size_t k = 0; k < a.metrics[s].bucket_rel_l2.size(); ++k)
        EXPECT_TRUE(same(a.metrics[s].bucket_rel_l2[k], b.metrics[s].bucket_rel_l2[k]));
    }
    // The bug is visible against fp64, far beyond the control's fp32 rounding.
    EXPECT_GT(a.metrics[0].rel_l2, 1e-4) << "step " << step;
    EXPECT_LT(a.metrics[2].rel_l2, 1e-5) << "step " << step;
    EXPECT_GT(a.metrics[0].rel_l2, 30 * a.metrics[2].rel_l2) << "step " << step;
    EXPECT_GT(a.metrics[1].rel_l2, 1e-4) << "step " << step;  // bf16 GEMM operands
  }
}

TEST(Shadow, TappingDoesNotChangeTheRun) {
  const ModelConfig m = shadow_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  Transformer<float> model(m, cpu_catalogue<float>().select({}), kBatch);
  model.init(test_seed());
  std::vector<float> grads;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<TokenId> in = batch_for(step, N, m.vocab),
                               tgt = batch_for(step + 99, N, m.vocab);
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    grads = model.grads().to_vector();
  }
  const Shadowed tapped = run_tapped(1);
  ASSERT_EQ(grads.size(), tapped.grads.size());
  EXPECT_EQ(0, std::memcmp(grads.data(), tapped.grads.data(), grads.size() * sizeof(float)));
}
namespace {
// A candidate for any op: the reference, then every output it writes scaled by 1.01.
template <class V>
void scale_output(const ArgSpec& spec, V v) {
  if constexpr (std::is_pointer_v<V> && !std::is_const_v<std::remove_pointer_t<V>>)
    if (v && (spec.role == ArgRole::Output || spec.role == ArgRole::Accumulate))
      for (int64_t i = 0; i < spec.size(); ++i) v[i] *= 1.01f;
}
template <Op op, class Fn>
struct OnePercentOff;
template <Op op, class... Args>
struct OnePercentOff<op, void (*)(const OpContext&, Args...)> {
  using Fn = void (*)(const OpContext&, Args...);
  static void call(const OpContext& ctx, Args... args) {
    (*static_cast<const Kernel<Fn>*>(ctx.state))(ctx, args...);
    const std::tuple<Args...> a(args...);
    const auto spec = OpSpec<op>::args(a);
    size_t i = 0;
    std::apply([&](auto... v) { ((scale_output(spec[i], v), ++i), ...); }, a);
  }
};
}  // namespace

namespace {
// One training step of `m` on `run`'s kernels with `entries` shadowed: one metrics per entry.
// With `device`, compared by shadow mode's device path (DeviceComparison).
// A: the run's activation storage (bf16: the CPU's bf16 mode).
template <class A = float>
std::vector<ShadowMetrics> shadow_one_step(const Catalogue<float, A>& cat,
                                           const KernelSet<float, A>& run, const ModelConfig& m,
                                           const std::vector<std::string>& entries,
                                           const DeviceComparison* device = nullptr) {
  ShadowTap<float, A> tap(run, parse_shadow_specs(entries, cat), cat, device ? 1 : 0, device);
  const int64_t N = int64_t(kBatch) * m.seq_len;
  Transformer<float, A> model(m, tap.kernels(), kBatch);
  model.init(test_seed());
  const std::vector<TokenId> in = batch_for(0, N, m.vocab), tgt = batch_for(99, N, m.vocab);
  tap.arm();
  model.forward(in.data(), tgt.data(), true);
  model.backward();
  tap.submit(in.data(), N, m.vocab, 0);
  auto results = tap.collect(true);
  if (results.size() != 1) throw std::logic_error("shadow_one_step: not one evaluation");
  return std::move(results[0].metrics);
}

// Every op of `ops` shadowed by the reference and by the reference scaled by 1.01: the first
// must agree, the second differ by exactly 1 %.
void check_every_op_shadowed(const Catalogue<float>& cat, const KernelSet<float>& reference,
                             const ModelConfig& m, const std::vector<std::string>& ops) {
  std::vector<std::string> entries;
  for (const auto& op : ops)
    entries.push_back(op + "=reference"), entries.push_back(op + "=one_percent_off");
  const std::vector<ShadowMetrics> metrics = shadow_one_step(cat, reference, m, entries);
  for (size_t i = 0; i < ops.size(); ++i) {
    const ShadowMetrics &ref = metrics[2 * i], &off = metrics[2 * i + 1];
    EXPECT_LT(ref.rel_l2, 1e-5) << ops[i] << " (seed " << test_seed() << ")";
    EXPECT_NEAR(off.rel_l2, 0.01, 1e-4) << ops[i];
    EXPECT_NEAR(off.cosine, 1.0, 1e-6) << ops[i];
  }
}

// Adds "one_percent_off" to every op of `cat`: `reference`'s kernel, outputs scaled by 1.01.
void add_one_percent_off(Catalogue<float>& cat, const KernelSet<float>& reference) {
  using S = OpSignatures<float>;
// Op names and signatures are pasted into declarations, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_ADD_OFF(name, Signature)                                          \
  if constexpr (OpSpec<Op::name>::known)                                         \
    cat.name.add("one_percent_off",                                              \
                 {&OnePercentOff<Op::name, S::Signature>::call,                  \
                  const_cast<void*>(static_cast<const void*>(&reference.name))}, \
                 {"the reference, outputs scaled by 1.01", "", "", ""});
  DIVLAB_OPS(DIVLAB_ADD_OFF)
#undef DIVLAB_ADD_OFF
  // NOLINTEND(bugprone-macro-parentheses)
}

// Each family's model with everything it can call (the llama model with shared kv heads and a
// soft-cap), with the shadowable ops it calls; every shadowable op is called by one of them.
std::vector<std::pair<ModelConfig, std::vector<std::string>>> models_and_their_ops() {
  ModelConfig llama = shadow_model();
  llama.arch = Arch::Llama, llama.n_heads = 4, llama.n_kv_heads = 2, llama.logit_softcap = 3;
  std::vector<std::pair<ModelConfig, std::vector<std::string>>> out;
  for (const ModelConfig& m : {shadow_model(), llama}) {
    std::vector<std::string> ops;
    for (const auto& op : shadowable_ops()) {
      Op o{};
      if (parse_op(op, &o) && model_calls(m, o)) ops.push_back(op);
    }
    out.emplace_back(m, ops);
  }
  return out;
}
}  // namespace

TEST(Shadow, EveryShadowableOpIsRecordedReplayedAndCompared) {
  Catalogue<float> cat = cpu_catalogue<float>();
  const KernelSet<float> reference = cat.select({});
  add_one_percent_off(cat, reference);
  // Every pluggable op (attention_backward's replays remake its forward's saved state).
  EXPECT_EQ(shadowable_ops().size(), size_t(kModelOpCount));
  std::set<std::string> covered;
  for (const auto& [m, ops] : models_and_their_ops()) {
    covered.insert(ops.begin(), ops.end());
    check_every_op_shadowed(cat, reference, m, ops);
  }
  EXPECT_EQ(covered.size(), shadowable_ops().size());
}

namespace {
// Shadow mode's device path on the host, so CI runs it without a GPU: "device" memory that is
// host memory the tap must treat as out of reach (host_accessible = false: captures stay in
// pool blocks, candidates read them in place, only sums come back), and a DeviceComparison whose
// reference is the CPU's fp32 catalogue and whose sums are taken as the GPU's are.
const MemoryOps& unreachable_host_memory() {
  static const MemoryOps ops = [] {
    MemoryOps m = host_memory();
    m.device = "host, treated as a device";
    m.host_accessible = false;
    return m;
  }();
  return ops;
}
void widen_on_host(void*, float* out, const bf16* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = float(to_double(in[i]));
}
void nothing_to_wait_for(void*, void*) {}
void always_fits(size_t, const std::string&) {}
void tally_on_host(const OpContext&, double* sums, const void* got, Storage type, const float* ref,
                   int64_t rows, int64_t cols, RowKey key, const int64_t* id_count,
                   const TokenId* batch) {
  using S = ShadowSums;
  for (int64_t row = 0; row < rows; ++row) {
    double diff = 0, r2 = 0, g2 = 0, dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = row * cols + c;
      const double a = stored_value(got, type, i), b = ref[i];
      diff += (a - b) * (a - b), r2 += b * b, g2 += a * a, dot += a * b;
    }
    sums[S::Diff] += diff, sums[S::Ref] += r2, sums[S::Got] += g2, sums[S::Dot] += dot;
    if (std::isnan(diff))
      sums[S::NanRows] += 1;
    else if (r2 > 0 || diff > 0)
      sums[S::MaxRow] = std::max(sums[S::MaxRow], r2 > 0 ? std::sqrt(diff / r2) : INFINITY);
    const int b = row_bucket(key, row, id_count, batch);
    if (b >= 0) sums[S::BucketDiff + b] += diff, sums[S::BucketRef + b] += r2;
  }
}
const DeviceComparison& host_comparison() {
  static const KernelSet<float> reference = cpu_catalogue<float>().select({});
  static const DeviceComparison c{&reference,  widen_on_host, nothing_to_wait_for,
                                  always_fits, tally_on_host, "fp32 on the host (a test's)"};
  return c;
}
}  // namespace

// The device path for every shadowable op, against the fp64 path on the same step: the reference
// compared with itself reads exactly 0, a candidate 1 % off reads 1 %, and each metric lies
// within the fp32 reference's own distance eps from fp64 of the fp64 one (triangle inequality:
// |device - fp64| <= eps (1 + fp64) / (1 - eps), eps measured by the fp64 path's reference).
TEST(Shadow, TheDevicePathReplaysEveryOpFromItsCopiesInPlace) {
  Catalogue<float> cat = cpu_catalogue<float>();
  const KernelSet<float> reference = cat.select({});
  add_one_percent_off(cat, reference);
  KernelSet<float> on_device = reference;
  on_device.memory = &unreachable_host_memory();
  for (const auto& [m, ops] : models_and_their_ops()) {
    std::vector<std::string> entries;
    for (const auto& op : ops)
      entries.push_back(op + "=reference"), entries.push_back(op + "=one_percent_off");
    const auto device = shadow_one_step(cat, on_device, m, entries, &host_comparison());
    const auto exact = shadow_one_step(cat, reference, m, entries);
    for (size_t i = 0; i < ops.size(); ++i) {
      const ShadowMetrics &self = device[2 * i], &off = device[2 * i + 1];
      EXPECT_EQ(self.rel_l2, 0.0) << ops[i];
      EXPECT_EQ(self.max_row_rel, 0.0) << ops[i];
      EXPECT_NEAR(off.rel_l2, 0.01, 1e-4) << ops[i];
      const double eps = exact[2 * i].rel_l2, want = exact[2 * i + 1].rel_l2;
      EXPECT_LE(std::fabs(off.rel_l2 - want), eps * (1 + want) / (1 - eps) * 1.01 + 1e-12)
          << ops[i] << ": device " << off.rel_l2 << ", fp64 " << want << ", eps " << eps
          << " (seed " << test_seed() << ")";
      for (size_t b = 0; b < off.bucket_rel_l2.size(); ++b) {
        const double e = exact[2 * i].bucket_rel_l2[b], w = exact[2 * i + 1].bucket_rel_l2[b];
        if (std::isnan(w)) {
          EXPECT_TRUE(std::isnan(off.bucket_rel_l2[b])) << ops[i] << " bucket " << b;
          continue;
        }
        EXPECT_LE(std::fabs(off.bucket_rel_l2[b] - w), e * (1 + w) / (1 - e) * 1.01 + 1e-12)
            << ops[i] << " bucket " << b;
      }
    }
  }
}
}  // namespace divlab

namespace divlab {
namespace {
// An attention forward that computes its output but leaves the saved probabilities as they were:
// the state a fused forward (cuDNN's) leaves, or a buggy candidate's.
void forward_saving_nothing(const OpContext& ctx, float* out, float* att, const float* qkv, int B,
                            int T, int C, int NH) {
  std::vector<float> scratch(size_t(B) * NH * T * T);
  cpu_catalogue<float>().select({}).attention_forward(ctx, out, scratch.data(), qkv, B, T, C, NH);
  (void)att;
}
}  // namespace

// attention_backward's replays remake the probabilities from the recorded qkv with their own
// forward, so a run whose forward saves none (the GPU's fused one) is still judged on what its
// backward computes: the reference agrees with fp64, a 1 % candidate measures 1 %.
TEST(Shadow, AttentionBackwardIsJudgedWithoutTheRunsSavedState) {
  Catalogue<float> cat = cpu_catalogue<float>();
  const KernelSet<float> reference = cat.select({});
  using S = OpSignatures<float>;
  cat.attention_backward.add(
      "one_percent_off",
      {&OnePercentOff<Op::attention_backward, S::AttentionBackward>::call,
       const_cast<void*>(static_cast<const void*>(&reference.attention_backward))},
      {"the reference, outputs scaled by 1.01", "", "", ""});
  KernelSet<float> run = reference;
  run.attention_forward = {&forward_saving_nothing, nullptr};
  const std::vector<ShadowMetrics> metrics =
      shadow_one_step(cat, run, shadow_model(),
                      {"attention_backward=reference", "attention_backward=one_percent_off"});
  EXPECT_LT(metrics[0].rel_l2, 1e-5) << "seed " << test_seed();
  EXPECT_NEAR(metrics[1].rel_l2, 0.01, 1e-4) << "seed " << test_seed();
}
}  // namespace divlab

namespace divlab {
// A bf16 run's device path: the bf16 activations it records are widened exactly for the fp32
// reference. The fp64-accumulating control sits at fp32 rounding and the seed bug stands out, as
// against the fp64 reference; the bf16 mode's own linear_forward reference shows the rounding of
// its bf16 output (2^-8 relative at most per element: 8 significant bits) and no more.
TEST(Shadow, TheDevicePathWidensABf16RunsInputsForTheFp32Reference) {
  const ModelConfig m = shadow_model();
  const auto& cat = cpu_bf16_catalogue();
  KernelSet<float, bf16> run = cat.select({});
  run.memory = &unreachable_host_memory();
  const auto metrics =
      shadow_one_step(cat, run, m,
                      {"embed_rmsnorm_backward=bf16_accum", "embed_rmsnorm_backward=fp64_accum",
                       "linear_forward=reference"},
                      &host_comparison());
  const auto &bug = metrics[0], &control = metrics[1], &linear = metrics[2];
  EXPECT_LT(control.rel_l2, 1e-6) << "seed " << test_seed();
  EXPECT_GT(bug.rel_l2, 100 * control.rel_l2) << "seed " << test_seed();
  EXPECT_GT(linear.rel_l2, 1e-4) << "seed " << test_seed();
  EXPECT_LT(linear.max_row_rel, std::ldexp(1.0, -8) * 1.01) << "seed " << test_seed();
}
}  // namespace divlab
