// Plug-ins: the example library loads, its variants appear in the catalogue with their
// documentation, compute what they claim (the correct one matches fp64, the buggy one loses the
// hot row), in the bf16 mode too, and go away on unload; broken libraries are refused with the
// reason named.
#include <dlfcn.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <random>

#include "experiments/check.h"
#include "kernels/bf16_activations.h"
#include "kernels/float_control.h"
#include "kernels/plugin_abi.h"
#include "kernels/plugins.h"
#include "kernels/registry.h"
#include "tests/support/check.h"

namespace divlab {
using namespace testing;

namespace {
struct Unload {
  ~Unload() { unload_plugins(); }
};

std::string error_of(const std::string& path) {
  try {
    load_plugins({path});
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

// dwte of the embedding op for one hot token at every position, with `k` (activations stored
// as A: its dy is A), against fp64.
template <class A>
double hot_row_error(const KernelSet<float, A>& k) {
  const int B = 16, T = 64, C = 16, V = 32, N = B * T;
  std::mt19937_64 gen(test_seed());
  std::vector<float> dres = randn<float>(N * C, gen, 0.1), x = randn<float>(N * C, gen), w(C, 1.0f),
                     rstd(N, 1.0f);
  std::vector<A> dy;
  for (double v : randn<double>(N * C, gen, 0.1))
    dy.push_back(stored_as<A>(v + 1.0));  // same-sign contributions per channel
  std::vector<TokenId> tok(N, 3);
  std::vector<float> dwte(V * C, 0), dwpe(T * C, 0), dw(C, 0);
  k.embed_rmsnorm_backward(test_context(*k.memory), dwte.data(), dwpe.data(), dw.data(), dy.data(),
                           dres.data(), x.data(), w.data(), rstd.data(), tok.data(), B, T, C, V);
  auto to_d = [](const auto& v) {
    std::vector<double> d;
    d.reserve(v.size());
    for (auto x : v) d.push_back(to_double(x));
    return d;
  };
  std::vector<double> rwte(V * C, 0), rwpe(T * C, 0), rw(C, 0);
  const auto dyd = to_d(dy), dresd = to_d(dres), xd = to_d(x), wd = to_d(w), rd = to_d(rstd);
  cpu_catalogue<double>().select({}).embed_rmsnorm_backward(
      test_context(), rwte.data(), rwpe.data(), rw.data(), dyd.data(), dresd.data(), xd.data(),
      wd.data(), rd.data(), tok.data(), B, T, C, V);
  EXPECT_CLOSE(dwpe, rwpe, 1e-5, "dwpe");
  EXPECT_CLOSE(dw, rw, 1e-5, "dw_norm");
  return compare(dwte, rwte).error;
}
}  // namespace

TEST(Plugins, ExampleLoadsComputesAndUnloads) {
  Unload guard;
  load_plugins({DIVLAB_EXAMPLE_PLUGIN});
  load_plugins({DIVLAB_EXAMPLE_PLUGIN});  // a second load of the same path is a no-op
  ASSERT_EQ(loaded_plugins().size(), 1u);
  const auto& ops = cpu_catalogue<float>().embed_rmsnorm_backward;
  const auto* good = ops.find("example_fp32_rows");
  const auto* bad = ops.find("example_bf16_rows");
  ASSERT_TRUE(good && bad);
  EXPECT_NE(bad->doc.summary.find("[plug-in]"), std::string::npos);
  EXPECT_NE(bad->doc.exposed_by.find("Zipf"), std::string::npos);
  const auto& cat = cpu_catalogue<float>();
  EXPECT_LT(hot_row_error(cat.select({{"embed_rmsnorm_backward", "example_fp32_rows"}})), 1e-5);
  EXPECT_GT(hot_row_error(cat.select({{"embed_rmsnorm_backward", "example_bf16_rows"}})), 0.3);
  // The bf16 mode adopts them, running on widened copies of its bf16 dy.
  const auto& bf = cpu_bf16_catalogue();
  ASSERT_TRUE(bf.embed_rmsnorm_backward.find("example_bf16_rows"));
  EXPECT_LT(hot_row_error(bf.select({{"embed_rmsnorm_backward", "example_fp32_rows"}})), 1e-5);
  EXPECT_GT(hot_row_error(bf.select({{"embed_rmsnorm_backward", "example_bf16_rows"}})), 0.3);
  unload_plugins();
  EXPECT_EQ(ops.find("example_bf16_rows"), nullptr);
  EXPECT_EQ(bf.embed_rmsnorm_backward.find("example_bf16_rows"), nullptr);
  EXPECT_TRUE(loaded_plugins().empty());
  EXPECT_THROW(cat.select({{"embed_rmsnorm_backward", "example_bf16_rows"}}), UnknownKernel);
  // Loading again reuses the freed trampolines.
  load_plugins({DIVLAB_EXAMPLE_PLUGIN});
  EXPECT_GT(hot_row_error(bf.select({{"embed_rmsnorm_backward", "example_bf16_rows"}})), 0.3);
}

TEST(Plugins, BrokenLibrariesAreRefusedWithTheReason) {
  Unload guard;
  EXPECT_NE(error_of("/no/such/libx.so").find("'/no/such/libx.so': cannot load"),
            std::string::npos);
  EXPECT_NE(error_of(DIVLAB_NOT_A_PLUGIN).find("does not export divlab_plugin_register"),
            std::string::npos);
  const std::string abi = error_of(DIVLAB_BROKEN_ABI_PLUGIN);
  EXPECT_NE(abi.find("built for plug-in ABI 999; this divlab speaks ABI 1 and 2"),
            std::string::npos)
      << abi;
  const std::string abi3 = error_of(DIVLAB_ABI3_PLUGIN);
  EXPECT_NE(abi3.find("built for plug-in ABI 3"), std::string::npos) << abi3;
  EXPECT_NE(error_of(DIVLAB_UNKNOWN_DTYPE_PLUGIN)
                .find("variant 0 ('broken_add'): dtype 9: expected DIVLAB_FP32"),
            std::string::npos);
  EXPECT_NE(error_of(DIVLAB_UNKNOWN_FLAGS_PLUGIN)
                .find("variant 0 ('broken_add'): unknown flags (only DIVLAB_CONTROL is defined)"),
            std::string::npos);
  EXPECT_NE(error_of(DIVLAB_WRONG_CONTROL_PLUGIN)
                .find("declared a benign control (DIVLAB_CONTROL) but says what is wrong"),
            std::string::npos);
  EXPECT_NE(error_of(DIVLAB_CLASHING_PLUGIN)
                .find("variant 'reference' of rmsnorm_backward already exists"),
            std::string::npos);
  EXPECT_NE(error_of(DIVLAB_UNKNOWN_OP_PLUGIN).find("unknown op 'layernorm_backward'"),
            std::string::npos);
  // A library whose constructor turns flush-to-zero and denormals-are-zero on (GCC 12's
  // crtfastmath.o, linked in with -ffast-math) would have every op in the process compute
  // under them: refused, and the thread's control is as it was before the load.
  const FloatControl before = float_control();
  const std::string fast = error_of(DIVLAB_FAST_MATH_PLUGIN);
  EXPECT_NE(fast.find("loading it changed the thread's floating-point control ("),
            std::string::npos)
      << fast;
  EXPECT_NE(fast.find("crtfastmath.o"), std::string::npos) << fast;
  EXPECT_TRUE(float_control() == before) << float_control_change(before, float_control());
  // A library that crashes, in its registration or as it loads, crashes a probe, not us.
  for (const char* crashing : {DIVLAB_CRASHING_PLUGIN, DIVLAB_CRASHING_ON_LOAD_PLUGIN}) {
    const std::string crash = error_of(crashing);
    // (signal 11; under a sanitizer, which turns the fault into an exit, exit status 1)
    EXPECT_NE(crash.find("crashed while loading ("), std::string::npos) << crash;
  }
  // Nothing of a refused library stays registered or loaded.
  EXPECT_TRUE(loaded_plugins().empty());
  EXPECT_EQ(cpu_catalogue<float>().rmsnorm_backward.find("from_the_future"), nullptr);
  EXPECT_EQ(cpu_catalogue<float>().add.find("broken_add"), nullptr);
  EXPECT_EQ(cpu_catalogue<float>().add.find("fast_math_add"), nullptr);
}

// An ABI 2 library: each kernel lands in the modes its dtype runs in, receives the call's
// context (seed, stream, scratch memory), computes what it claims, and a control is a control.
TEST(Plugins, Abi2KernelsRunInTheirDtypesModesWithTheirContext) {
  Unload guard;
  load_plugins({DIVLAB_ABI2_PLUGIN});
  EXPECT_NE(loaded_plugins_identity().find(" abi:2"), std::string::npos);
  const auto& f32 = cpu_catalogue<float>();
  const auto& b16 = cpu_bf16_catalogue();
  // bf16 kernels run in the bf16 mode only; asking the fp32 mode names where it runs.
  EXPECT_TRUE(b16.swiglu_forward.find("abi2_bf16_swiglu"));
  EXPECT_FALSE(f32.swiglu_forward.find("abi2_bf16_swiglu"));
  try {
    f32.select({{"swiglu_forward", "abi2_bf16_swiglu"}});
    ADD_FAILURE() << "the fp32 mode selected a bf16 kernel";
  } catch (const UnknownKernel& e) {
    EXPECT_NE(std::string(e.what()).find("is a bf16 kernel: it runs in the bf16 mode"),
              std::string::npos)
        << e.what();
  }
  // fp16 kernels run in the fp32 mode (through fp16 copies); fp32 kernels in both.
  EXPECT_TRUE(f32.gelu_forward.find("abi2_fp16_gelu"));
  EXPECT_FALSE(b16.gelu_forward.find("abi2_fp16_gelu"));
  EXPECT_TRUE(f32.add.find("abi2_context_add") && b16.add.find("abi2_context_add"));
  EXPECT_TRUE(f32.is_benign("add", "abi2_context_add"));
  EXPECT_TRUE(b16.is_benign("swiglu_forward", "abi2_bf16_swiglu"));
  EXPECT_FALSE(b16.is_benign("swiglu_forward", "abi2_bf16_swiglu_vec8"));

  std::mt19937_64 gen(test_seed());
  // The context: the caller's seed and stream, the struct's size, working scratch memory.
  {
    const int64_t n = 1000;
    const std::vector<float> a = randn<float>(n, gen), b = randn<float>(n, gen);
    std::vector<float> y(n, NAN);
    const OpContext ctx = test_context();
    f32.select({{"add", "abi2_context_add"}}).add(ctx, y.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;
    void* lib = dlopen(DIVLAB_ABI2_PLUGIN, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_TRUE(lib);
    const auto last =
        reinterpret_cast<const divlab_op_context* (*)()>(dlsym(lib, "abi2_last_context"))();
    dlclose(lib);
    EXPECT_EQ(last->size, sizeof(divlab_op_context));
    EXPECT_EQ(last->seed, ctx.seed);
    EXPECT_EQ(last->stream, nullptr);
    // Regions 0-7 exist; others do not.
    EXPECT_EQ(last->workspace(last, 8, 16), nullptr);
  }
  // bf16: the correct kernel within a bf16 rounding of the mode's reference, the packed one
  // leaves each row's tail (F = 20: 4 values) unwritten.
  {
    const int N = 7, F = 20;
    std::vector<bf16> x;
    for (float v : randn<float>(size_t(N) * 2 * F, gen)) x.push_back(to_bf16(v));
    const auto run = [&](const std::string& variant) {
      std::vector<bf16> y(size_t(N) * F, to_bf16(4096.0f));  // exact in bf16
      b16.select({{"swiglu_forward", variant}})
          .swiglu_forward(test_context(), y.data(), x.data(), N, F);
      std::vector<float> out(y.size());
      std::transform(y.begin(), y.end(), out.begin(), [](bf16 v) { return widen(v); });
      return out;
    };
    const auto ref = run("reference"), good = run("abi2_bf16_swiglu"),
               packed = run("abi2_bf16_swiglu_vec8");
    EXPECT_CLOSE(good, ref, 1e-2, "abi2_bf16_swiglu");
    for (int n = 0; n < N; ++n)
      for (int f = 0; f < F; ++f)
        EXPECT_EQ(packed[size_t(n) * F + f] == 4096.0f, f >= 16) << n << "," << f;
  }
  // fp16: outputs are fp16 values, within fp16 rounding of the exact GELU.
  {
    const int64_t n = 4096;
    const std::vector<float> x = randn<float>(n, gen, 3.0);
    std::vector<float> y(n), exact(n);
    f32.select({{"gelu_forward", "abi2_fp16_gelu"}})
        .gelu_forward(test_context(), y.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = widen(to_fp16(x[i]));
      exact[i] = float(0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
      EXPECT_EQ(widen(to_fp16(y[i])), y[i]) << "output " << i << " is no fp16 value";
    }
    const auto c = compare(y, exact);
    EXPECT_LT(c.error, 2e-3) << c.describe("abi2_fp16_gelu");
    EXPECT_GT(c.error, 1e-5) << "fp16 outputs should carry fp16 rounding";
  }
  // The gradient reduction takes plug-ins too: a compressed all-reduce, within int8 rounding of
  // the mean and not bitwise it.
  {
    const int ranks = 4;
    const int64_t n = 3000;
    const std::vector<float> shards = randn<float>(size_t(ranks * n), gen, 1e-3);
    std::vector<float> out(n, NAN), mean(n, 0.0f);
    f32.select({{"grad_reduce", "abi2_int8_reduce"}})
        .grad_reduce(test_context(), out.data(), shards.data(), ranks, n);
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = 0; i < n; ++i) mean[i] += shards[size_t(r * n + i)] / ranks;
    const auto c = compare(out, mean);
    EXPECT_LT(c.error, 2e-2) << c.describe("abi2_int8_reduce");
    EXPECT_GT(c.error, 1e-4) << c.describe("abi2_int8_reduce");
    EXPECT_FALSE(f32.is_benign("grad_reduce", "abi2_int8_reduce"));
  }
  unload_plugins();
  EXPECT_FALSE(b16.swiglu_forward.find("abi2_bf16_swiglu"));
  EXPECT_FALSE(f32.gelu_forward.find("abi2_fp16_gelu"));
  EXPECT_FALSE(f32.grad_reduce.find("abi2_int8_reduce"));
}

// ABI 1 libraries still load, and their kernels compute without a context.
// The optimizer's updates plug in like the model's ops (fp32 arrays in both modes): the plain
// SGD gives the reference's values, momentum and Nesterov included (to fp32's last bits: two
// builds may fuse other multiply-adds); AdamW with bf16 moments moves m and v by bf16 roundings.
TEST(Plugins, OptimizerUpdatesPlugInInBothModes) {
  Unload guard;
  load_plugins({DIVLAB_ABI2_PLUGIN});
  const auto& f32 = cpu_catalogue<float>();
  const auto& b16 = cpu_bf16_catalogue();
  EXPECT_TRUE(f32.sgd_step.find("abi2_sgd") && b16.sgd_step.find("abi2_sgd"));
  EXPECT_TRUE(f32.adamw_step.find("abi2_adamw_bf16_moments") &&
              b16.adamw_step.find("abi2_adamw_bf16_moments"));
  std::mt19937_64 gen(test_seed());
  const int64_t n = 4099;
  const std::vector<float> g = randn<float>(n, gen), p0 = randn<float>(n, gen),
                           m0 = randn<float>(n, gen);
  const auto in_mode = [&](const auto& cat) {
    const auto sgd = [&](const std::string& variant) {
      std::vector<float> p = p0, buf = m0;
      const auto k = cat.select({{"sgd_step", variant}});
      for (int step = 0; step < 3; ++step)
        k.sgd_step(test_context(), p.data(), buf.data(), g.data(), n, 0.1f, 0.9f, true, 0.01f,
                   0.5f);
      return std::make_pair(p, buf);
    };
    const auto ref = sgd("reference"), plug = sgd("abi2_sgd");
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(plug.first[i], ref.first[i], 1e-6 * (1 + std::abs(ref.first[i])))
          << i << ", seed " << test_seed();
      ASSERT_NEAR(plug.second[i], ref.second[i], 1e-6 * (1 + std::abs(ref.second[i])))
          << i << ", seed " << test_seed();
    }
    const auto adamw = [&](const std::string& variant) {
      std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
      const auto k = cat.select({{"adamw_step", variant}});
      for (int64_t step = 1; step <= 3; ++step)
        k.adamw_step(test_context(), p.data(), m.data(), v.data(), g.data(), n, 1e-3f, 0.9f, 0.95f,
                     1e-8f, 0.1f, 1.0f, step);
      return m;
    };
    const auto m_ref = adamw("reference"), m_bf16 = adamw("abi2_adamw_bf16_moments");
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(m_bf16[i], widen(to_bf16(m_bf16[i]))) << i;  // held at bf16's 8 bits
      worst = std::max(worst, std::abs(double(m_bf16[i]) - m_ref[i]) / std::abs(m_ref[i]));
    }
    EXPECT_GT(worst, 1e-4) << "seed " << test_seed();  // past fp32's grade, within bf16's
    EXPECT_LT(worst, 1e-2) << "seed " << test_seed();
  };
  in_mode(f32);
  in_mode(b16);
}

// A kernel that returns with the thread rounding toward zero: the call throws, naming the
// change, and the thread rounds to nearest again, in both modes (the bf16 one through its
// adapter).
TEST(Plugins, AKernelLeavingTheRoundingChangedThrowsAndItIsRestored) {
  Unload guard;
  load_plugins({DIVLAB_ABI2_PLUGIN});
  std::vector<float> a(33, 1.0f), y(a.size());
  const std::vector<bf16> b(a.size(), to_bf16(1.0f / 3));
  const auto expect_restored = [&](const auto& call, const char* mode) {
    ASSERT_EQ(std::fegetround(), FE_TONEAREST);
    try {
      call();
      ADD_FAILURE() << mode << ": no throw";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("floating-point control changed (rounding toward zero"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(std::fegetround(), FE_TONEAREST) << mode;
  };
  const std::map<std::string, std::string> pick{{"add", "abi2_add_rounding_toward_zero"}};
  expect_restored(
      [&] {
        cpu_catalogue<float>().select(pick).add(test_context(), y.data(), a.data(), a.data(),
                                                int64_t(a.size()));
      },
      "fp32");
  expect_restored(
      [&] {
        cpu_bf16_catalogue().select(pick).add(test_context(), y.data(), a.data(), b.data(),
                                              int64_t(a.size()));
      },
      "bf16");
}

TEST(Plugins, Abi1LibrariesStillLoad) {
  Unload guard;
  load_plugins({DIVLAB_ABI1_PLUGIN});
  EXPECT_NE(loaded_plugins_identity().find(" abi:1"), std::string::npos);
  std::vector<float> a = {1, 2, 3}, b = {4, 5, 6}, y(3);
  cpu_catalogue<float>()
      .select({{"add", "segfaults_on_large"}})
      .add(test_context(), y.data(), a.data(), b.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{5, 7, 9}));
  // ABI 1's embedding_forward, called without the vocabulary ABI 2 added.
  const std::vector<TokenId> tokens = {2, 0, 2};
  const std::vector<float> wte = {1, 2, 3, 4, 5, 6}, wpe = {10, 20, 30, 40, 50, 60};  // V 3, C 2
  std::vector<float> x(6);
  cpu_catalogue<float>()
      .select({{"embedding_forward", "abi1_embedding"}})
      .embedding_forward(test_context(), x.data(), tokens.data(), wte.data(), wpe.data(), 1, 3, 2,
                         3);
  EXPECT_EQ(x, (std::vector<float>{15, 26, 31, 42, 55, 66}));
}

// The host fp16 conversion the fp16 adapters use equals the compiler's _Float16 (where it has one).
TEST(Plugins, HostFp16BitsMatchTheCompilers) {
  std::mt19937_64 gen(test_seed());
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    float x = lowp::from_bits(any(gen));
    if (std::isnan(x)) continue;
    const float r = lowp::fp16_rne(x);
    EXPECT_EQ(lowp::fp16_value(lowp::fp16_bits(x)), r) << x;
#ifdef __FLT16_MAX__
    const auto h = static_cast<_Float16>(x);
    uint16_t bits = 0;
    std::memcpy(&bits, &h, 2);
    ASSERT_EQ(lowp::fp16_bits(x), bits) << x;
#endif
  }
}

}  // namespace divlab

namespace divlab {
namespace {
// An `add` that throws on large inputs, as a kernel with an unchecked size assumption might.
void add_throwing_on_large(float* y, const float* a, const float* b, int64_t n) {
  if (n > 4096) throw std::runtime_error("n = " + std::to_string(n) + " exceeds my tile table");
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
}  // namespace

TEST(Check, AThrowingKernelGetsAVerdictNamingTheCondition) {
  auto& add = mutable_cpu_catalogue().add;
  add.add("throws_on_large", add_throwing_on_large, {"throws above 4096 values", "", "", ""});
  CheckOptions opt;
  opt.target = "add=throws_on_large", opt.seed = testing::test_seed();
  CheckReport r;
  try {
    r = run_check(opt);
  } catch (...) {
    add.remove("throws_on_large");
    throw;
  }
  add.remove("throws_on_large");
  EXPECT_FALSE(r.pass);
  int threw = 0, passed = 0;
  for (const auto& c : r.conditions) {
    if (c.why.find("the kernel threw: n = ") != std::string::npos) ++threw;
    if (c.ran && !c.failed) ++passed;
  }
  EXPECT_GT(threw, 0);   // the large shapes: a FAIL naming the condition and the exception
  EXPECT_GT(passed, 0);  // the tiny shape still runs and passes
  EXPECT_NE(format_check(r).find("exceeds my tile table"), std::string::npos);
}
}  // namespace divlab
