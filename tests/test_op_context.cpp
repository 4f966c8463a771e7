// The op context: per-call state travels with the call, never through process globals. Two
// models, two shadow taps and two profilers work side by side in one process, and a kernel's
// random bits come from its call's seed, so they repeat exactly when the caller's seed does; a
// backend's reference pair (ReferencePairs) runs in place of its two ops with their bits and
// leaves every later call's seed where it was; new host scratch is aligned and reads as NaN, and
// check's guarded scratch names a write past either end of what a kernel asked for.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/guarded_workspace.h"
#include "kernels/memory.h"
#include "kernels/op_tracker.h"
#include "kernels/profile.h"
#include "kernels/shadow.h"
#include "model/transformer.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
ModelConfig small_model() {
  ModelConfig m;
  m.vocab = 48, m.d_model = 16, m.n_layers = 2, m.n_heads = 2, m.seq_len = 16;
  return m;
}
constexpr int kBatch = 8;

// Skewed ids (one id on half the positions): hot embedding rows, where the bugs show.
std::vector<TokenId> batch(uint64_t seed, int64_t n, int vocab) {
  std::mt19937_64 gen(seed);
  std::vector<TokenId> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = TokenId(gen() % 2 ? 5 : gen() % uint64_t(vocab));
  return ids;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One model with its own tap (shadowing `spec`) under its own profiler.
struct Instrumented {
  ShadowTap<float> tap;
  OpProfiler<float> profiler;
  Transformer<float> model;
  Instrumented(const std::string& spec, uint64_t init_seed)
      : tap(cpu_catalogue<float>().select({}), parse_shadow_specs({spec}), cpu_catalogue<float>(),
            0),
        profiler(tap.kernels()),
        model(small_model(), profiler.kernels(), kBatch) {
    model.init(init_seed);
  }
  // One shadowed step on the batch drawn from `data_seed`; returns its metrics.
  ShadowMetrics step(uint64_t data_seed, int64_t step) {
    const ModelConfig m = small_model();
    const int64_t N = int64_t(kBatch) * m.seq_len;
    const auto in = batch(data_seed, N, m.vocab), tgt = batch(data_seed + 1, N, m.vocab);
    tap.arm();
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    tap.submit(in.data(), N, m.vocab, step);
    auto done = tap.collect(true);
    EXPECT_EQ(done.size(), 1u);
    return done.at(0).metrics.at(0);
  }
};
}  // namespace

TEST(OpContext, TwoTapsAndTwoProfilersWorkSideBySide) {
  const uint64_t seed = test_seed();
  // Alone: what each instrumented model measures when it is the only one in the process.
  ShadowMetrics alone_a, alone_b;
  std::map<std::string, OpTime> times_a;
  {
    Instrumented a("embed_rmsnorm_backward=bf16_accum", seed);
    alone_a = a.step(seed + 10, 0);
    times_a = a.profiler.times();
  }
  {
    Instrumented b("linear_forward=bf16_rne", seed + 1);
    alone_b = b.step(seed + 20, 0);
  }
  // Together, their calls interleaved: each tap records only its own model's calls, and each
  // profiler counts only its own model's.
  Instrumented a("embed_rmsnorm_backward=bf16_accum", seed);
  Instrumented b("linear_forward=bf16_rne", seed + 1);
  const ModelConfig m = small_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  const auto in_a = batch(seed + 10, N, m.vocab), tgt_a = batch(seed + 11, N, m.vocab);
  const auto in_b = batch(seed + 20, N, m.vocab), tgt_b = batch(seed + 21, N, m.vocab);
  a.tap.arm();
  b.tap.arm();
  a.model.forward(in_a.data(), tgt_a.data(), true);
  b.model.forward(in_b.data(), tgt_b.data(), true);
  b.model.backward();
  a.model.backward();
  a.tap.submit(in_a.data(), N, m.vocab, 0);
  b.tap.submit(in_b.data(), N, m.vocab, 0);
  const ShadowMetrics together_a = a.tap.collect(true).at(0).metrics.at(0);
  const ShadowMetrics together_b = b.tap.collect(true).at(0).metrics.at(0);
  EXPECT_EQ(together_a.rel_l2, alone_a.rel_l2) << "seed " << seed;
  EXPECT_EQ(together_a.max_row_rel, alone_a.max_row_rel);
  EXPECT_EQ(together_b.rel_l2, alone_b.rel_l2);
  EXPECT_GT(together_a.rel_l2, 1e-4);  // the bug is measured, not a zero from empty captures
  EXPECT_GT(together_b.rel_l2, 1e-4);
  ASSERT_EQ(a.profiler.times().size(), times_a.size());
  for (const auto& [op, t] : times_a) {
    EXPECT_EQ(a.profiler.times().at(op).calls, t.calls) << op;
    EXPECT_EQ(b.profiler.times().at(op).calls, t.calls) << op;  // the same model shape
  }
  // 2 blocks: qkv, proj, fc, fc2 per block, plus the LM head.
  EXPECT_EQ(a.profiler.times().at("linear_forward").calls, 9);
}

// A profiler reads its calls' timing marks in batches, holding a bounded number at once: every
// call is counted, past the bound and after it, and reset forgets the calls it has not read.
TEST(OpContext, AProfilerCountsEveryCallPastItsBoundOnMarksHeld) {
  OpProfiler<float> profiler(cpu_catalogue<float>().select({}));
  OpContextSource contexts(*profiler.kernels().memory);
  std::vector<float> a(64, 1.0f), b(64, 2.0f), y(64);
  const auto& k = profiler.kernels();
  for (int i = 0; i < 3; ++i) k.add(contexts.next(), y.data(), a.data(), b.data(), 64);
  profiler.reset();
  for (int i = 0; i < 10000; ++i) k.add(contexts.next(), y.data(), a.data(), b.data(), 64);
  const std::map<std::string, OpTime>& times = profiler.times();
  ASSERT_EQ(times.size(), 1u);
  EXPECT_EQ(times.at("add").calls, 10000);
  EXPECT_GE(times.at("add").seconds, 0.0);
  EXPECT_EQ(y[63], 3.0f);
}

TEST(OpContext, StochasticRoundingDrawsItsBitsFromTheCallSeed) {
  const uint64_t seed = test_seed();
  const ModelConfig m = small_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  const auto in = batch(seed, N, m.vocab), tgt = batch(seed + 1, N, m.vocab);
  const KernelSet<float> k =
      cpu_catalogue<float>().select({{"embed_rmsnorm_backward", "bf16_stochastic_accum"}});
  Transformer<float> model(m, k, kBatch), other(m, k, kBatch);
  model.init(seed);
  other.init(seed + 5);
  const auto grads_with = [&](uint64_t op_seed) {
    model.reseed(op_seed);
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    return model.grads().to_vector();
  };
  const auto first = grads_with(42);
  // Another model's calls in between draw nothing from this one's bits (no shared counter).
  other.reseed(42);
  other.forward(in.data(), tgt.data(), true);
  other.backward();
  EXPECT_TRUE(bitwise_equal(first, grads_with(42))) << "seed " << seed;
  EXPECT_FALSE(bitwise_equal(first, grads_with(43))) << "seed " << seed;
  // Without reseeding, the next step's calls draw fresh bits.
  const auto next = model.grads().to_vector();
  model.forward(in.data(), tgt.data(), true);
  model.backward();
  EXPECT_FALSE(bitwise_equal(next, model.grads().to_vector()));
}

TEST(OpContext, AKernelSeesItsOwnStateAndTheCallersContext) {
  using Fn = OpSignatures<float>::GeluForward;
  struct Seen {
    const void* state = nullptr;
    uint64_t seed = 0;
    Workspace* workspace = nullptr;
  };
  static Seen seen;  // a plain function has nowhere else to report to
  const Fn probe = [](const OpContext& ctx, float*, const float*, int64_t) {
    seen = {ctx.state, ctx.seed, ctx.workspace};
  };
  int mine = 0;
  const Kernel<Fn> k(probe, &mine);
  OpContextSource source(host_memory());
  source.reseed(7);
  OpContext ctx = source.next();
  ctx.state = &seen;  // a caller's stray state never reaches the kernel
  k(ctx, nullptr, nullptr, 0);
  EXPECT_EQ(seen.state, &mine);
  EXPECT_EQ(seen.seed, ctx.seed);
  EXPECT_EQ(seen.workspace, ctx.workspace);
  EXPECT_NE(seen.workspace, nullptr);
  // Per-call seeds: fresh for every call, repeated after the same reseed.
  const uint64_t second = source.next().seed;
  EXPECT_NE(second, ctx.seed);
  source.reseed(7);
  EXPECT_EQ(source.next().seed, ctx.seed);
  EXPECT_EQ(source.next().seed, second);
}

// The CPU's fused add + RMSNorm is the two ops bit for bit (kernels/add_rmsnorm/), so a catalogue
// naming it as their pair must train to the same bits as the ops one by one: the model takes the
// pair only where both ops are the references, the observers see the same outputs in the same
// order, and a stochastic kernel after the pairs draws the same bits (the pair counts both ops'
// calls). The profiler's and the op tracker's sets run the pair too; a candidate on either op
// runs them one by one.
TEST(OpContext, AReferencePairRunsInPlaceOfItsOpsWithTheirBitsAndSeeds) {
  const uint64_t seed = test_seed();
  Catalogue<float> cat = cpu_catalogue<float>();  // a copy, given a pair
  cat.pairs.add_norm = {cat.add.find("reference")->fn, cat.rmsnorm_forward.find("reference")->fn,
                        cat.add_rmsnorm_forward.find("reference")->fn};
  const KernelSet<float> paired = cat.select({{"embed_rmsnorm_backward", "bf16_stochastic_accum"}});
  ASSERT_TRUE(paired.add_norm_pair());
  KernelSet<float> one_by_one = paired;
  one_by_one.pairs = nullptr;
  EXPECT_FALSE(one_by_one.add_norm_pair());
  EXPECT_FALSE(cat.select({{"rmsnorm_forward", "no_eps"}}).add_norm_pair());
  OpProfiler<float> profiler(paired);
  EXPECT_TRUE(profiler.kernels().add_norm_pair());
  OpNote note;  // the trainer's outermost wrapper, around the profiler's
  const OpTracker<float> tracked(profiler.kernels(), note);
  EXPECT_TRUE(tracked.kernels().add_norm_pair());

  const ModelConfig m = small_model();
  const int64_t N = int64_t(kBatch) * m.seq_len;
  const auto in = batch(seed, N, m.vocab), tgt = batch(seed + 1, N, m.vocab);
  struct Run {
    std::vector<float> grads;
    std::vector<std::string> outputs;  // what the observer saw, in order
  };
  const auto run = [&](const KernelSet<float>& k) {
    Transformer<float> model(m, k, kBatch);
    model.init(seed);
    Run r;
    model.after_op = [&](const Transformer<float>::OpOutput& o) {
      r.outputs.push_back(std::string(o.pass) + " " + o.op + " " + std::to_string(o.layer) + " " +
                          o.tensor);
    };
    model.reseed(42);
    model.forward(in.data(), tgt.data(), true);
    model.backward();
    r.grads = model.grads().to_vector();
    return r;
  };
  const Run ops = run(one_by_one), pair = run(paired), timed = run(tracked.kernels());
  EXPECT_TRUE(bitwise_equal(pair.grads, ops.grads)) << "seed " << seed;
  EXPECT_TRUE(bitwise_equal(timed.grads, ops.grads)) << "seed " << seed;
  EXPECT_EQ(pair.outputs, ops.outputs);
  EXPECT_EQ(profiler.times().at("add+rmsnorm_forward").calls, 2 * m.n_layers);
  EXPECT_EQ(profiler.times().count("add"), 0u);
}

// Where a host buffer starts decides how a vectorised kernel splits its sums (kernels/memory.cpp):
// every one starts on a 64-byte boundary, whatever its size and the heap's state.
TEST(OpContext, HostBuffersStartOn64ByteBoundaries) {
  const MemoryOps& mem = host_memory();
  std::vector<void*> buffers, staging;
  for (size_t bytes = 1; bytes <= 300; bytes += 7) {
    buffers.push_back(mem.allocate(bytes));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers.back()) % 64, 0u) << bytes << " bytes";
    staging.push_back(mem.allocate_staging(bytes));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(staging.back()) % 64, 0u) << bytes << " bytes, staging";
  }
  for (void* p : buffers) mem.release(p);
  for (void* p : staging) mem.release_staging(p);
}

// Plug-in ABI 2 promises 256-byte aligned scratch. A new or grown region holds all-ones bytes
// (NaN as float), so a kernel that reads scratch before writing it sees NaN, not the zeros fresh
// memory happens to hold; a region asked for again at its size or smaller keeps its contents.
TEST(OpContext, HostScratchIsAlignedAndStartsAsNaN) {
  HostWorkspace w;
  for (const size_t floats : {size_t(1), size_t(3), size_t(1000), size_t(1) << 18}) {
    auto* p = static_cast<float*>(w.get(1, floats * sizeof(float)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << floats;
    for (size_t i = 0; i < floats; ++i) ASSERT_TRUE(std::isnan(p[i])) << floats << " at " << i;
    p[0] = 1.5f;
    EXPECT_EQ(static_cast<float*>(w.get(1, sizeof(float))), p) << floats;
    EXPECT_EQ(p[0], 1.5f) << floats;
  }
  EXPECT_EQ(w.moves(), 4u);
}

// check's scratch for plug-ins (kernels/guarded_workspace.h) behaves as training's for the
// kernel (aligned, NaN when new, the same region for a size it holds, a new one when it grows)
// and reads back its guards: a byte written past the end, or before the start, of the size a
// kernel asked for is named, in the region that grew too.
TEST(OpContext, GuardedScratchNamesWritesPastWhatWasAsked) {
  const int first = 64;
  {
    GuardedWorkspace w(host_memory(), first);
    for (const size_t bytes : {size_t(1), size_t(12), size_t(4096), size_t(1) << 20}) {
      auto* p = static_cast<unsigned char*>(w.get(first + 2, bytes));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u) << bytes;
      float f;
      std::memcpy(&f, p, sizeof f < bytes ? sizeof f : bytes);
      if (bytes >= sizeof f) {
        EXPECT_TRUE(std::isnan(f)) << bytes;
      }
      std::memset(p, 0, bytes);                                // every byte asked for, and no more
      EXPECT_EQ(w.get(first + 2, bytes / 2 + 1), p) << bytes;  // a smaller size: the same region
    }
    EXPECT_EQ(w.moves(), 4u);
    EXPECT_TRUE(w.stray_writes().empty());
  }
  GuardedWorkspace w(host_memory(), first);
  auto* small = static_cast<unsigned char*>(w.get(first, 100));
  small[103] = 0;                                                 // four bytes past the end
  auto* grown = static_cast<unsigned char*>(w.get(first, 1000));  // moves; the old one is kept
  EXPECT_NE(grown, small);
  grown[-1] = 0;
  const std::vector<std::string> lines = w.stray_writes();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "scratch region 0 (asked for 1000 bytes): written 1 byte before its start");
  EXPECT_EQ(lines[1], "scratch region 0 (asked for 100 bytes): written up to 4 bytes past its end");
}
}  // namespace divlab
