// Plug-ins: the example library loads, its variants appear in the catalogue with their
// documentation, compute what they claim (the correct one matches fp64, the buggy one loses the
// hot row), in the bf16 mode too, and go away on unload; broken libraries are refused with the
// reason named.
#include <random>

#include "experiments/check.h"
#include "kernels/bf16_activations.h"
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
  EXPECT_NE(abi.find("built for plug-in ABI 999; this divlab speaks ABI 1"), std::string::npos)
      << abi;
  EXPECT_NE(error_of(DIVLAB_CLASHING_PLUGIN)
                .find("variant 'reference' of rmsnorm_backward already exists"),
            std::string::npos);
  EXPECT_NE(error_of(DIVLAB_UNKNOWN_OP_PLUGIN).find("unknown op 'layernorm_backward'"),
            std::string::npos);
  // A library that crashes, in its registration or as it loads, crashes a probe, not us.
  for (const char* crashing : {DIVLAB_CRASHING_PLUGIN, DIVLAB_CRASHING_ON_LOAD_PLUGIN}) {
    const std::string crash = error_of(crashing);
    // (signal 11; under a sanitizer, which turns the fault into an exit, exit status 1)
    EXPECT_NE(crash.find("crashed while loading ("), std::string::npos) << crash;
  }
  // Nothing of a refused library stays registered or loaded.
  EXPECT_TRUE(loaded_plugins().empty());
  EXPECT_EQ(cpu_catalogue<float>().rmsnorm_backward.find("from_the_future"), nullptr);
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
