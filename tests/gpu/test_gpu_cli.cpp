// The GPU backend through the trainer's front door: a trace written by a cuda run (with shadow
// mode on the GPU), and a model too large for the device refused before anything is allocated or
// written.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/process.h"
#include "datasets/text.h"
#include "experiments/check.h"
#include "experiments/config.h"
#include "experiments/train.h"
#include "io/trace.h"
#include "kernels/cuda/runtime.h"
#include "kernels/shadow.h"
#include "tests/gpu/gpu_check.h"
#include "tests/support/fixtures.h"

namespace divlab {
using namespace testing;

TEST(GpuTrain, WritesACompleteTraceWithGpuShadowMetrics) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_train"), out = dir + "/run.h5";
  const RunConfig cfg = load_config(
      "", {"backend=cuda", "train.precision=bf16", "data=zipf:1.1", "model.vocab=512",
           "model.seq_len=64", "train.batch=128", "train.steps=30", "shadow.every=10",
           "shadow.variants=[embed_rmsnorm_backward=bf16_accum, embed_rmsnorm_backward=fp64_accum]",
           "train.seed=" + std::to_string(test_seed() % 1000)});
  TrainOptions opt;
  opt.out = out, opt.progress = false;
  EXPECT_EQ(train(cfg, opt).status, RunStatus::Completed);
  const TraceReader r(out);
  EXPECT_EQ(r.string_attr("/", "backend"), "cuda");
  EXPECT_NE(r.string_attr("/", "device").find("sm_"), std::string::npos);
  EXPECT_EQ(r.floats("/metrics/loss").size(), 30u);
  const auto bug = r.floats("/shadow/embed_rmsnorm_backward/bf16_accum/rel_l2");
  const auto control = r.floats("/shadow/embed_rmsnorm_backward/fp64_accum/rel_l2");
  ASSERT_EQ(bug.size(), 3u);
  // 8192 Zipf tokens per step: the hottest rows collect hundreds of adds, which bf16 loses (at
  // 4096 tokens one seed measured 0.0096 at step 10, under the bound: not yet the dose).
  for (size_t i = 0; i < bug.size(); ++i) {
    EXPECT_GT(bug[i], 1e-2) << "step " << i * 10;
    EXPECT_LT(control[i], 1e-5) << "step " << i * 10;
  }
  unlink(out.c_str());
  rmdir(dir.c_str());
}

// Every shadowable op's GPU reference shadowed at every step in fp32 mode against the fp64 CPU
// reference (shadow.reference = "fp64"): each replay path (inputs, token ids, outputs; all
// copies queued, read by the worker after a fence) must agree with it as closely as the op
// tests require. A copy read before it arrived
// would show as a large error (or garbage) here.
TEST(GpuTrain, ShadowedReferencesMatchTheFp64ReferenceAtEveryStep) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_shadow_all"), out = dir + "/run.h5";
  const std::vector<std::string> ops = {"rmsnorm_forward",   "rmsnorm_backward",   "linear_forward",
                                        "attention_forward", "attention_backward", "cross_entropy"};
  std::string variants = "shadow.variants=[embed_rmsnorm_backward=fp64_accum";
  for (const auto& op : ops) variants += ", " + op + "=reference";
  const RunConfig cfg =
      load_config("", {"backend=cuda", "train.precision=fp32", "data=zipf:1.1", "model.vocab=301",
                       "model.d_model=72", "model.n_heads=4", "model.seq_len=37", "train.batch=3",
                       "train.steps=12", "shadow.every=1", variants + "]", "shadow.reference=fp64",
                       "train.seed=" + std::to_string(test_seed() % 1000)});
  TrainOptions opt;
  opt.out = out, opt.progress = false;
  EXPECT_EQ(train(cfg, opt).status, RunStatus::Completed);
  const TraceReader r(out);
  for (const auto& name :
       {"embed_rmsnorm_backward/fp64_accum", "rmsnorm_forward/reference",
        "rmsnorm_backward/reference", "linear_forward/reference", "attention_forward/reference",
        "attention_backward/reference", "cross_entropy/reference"}) {
    const auto rel = r.floats(std::string("/shadow/") + name + "/rel_l2");
    ASSERT_EQ(rel.size(), 12u) << name;
    for (size_t i = 0; i < rel.size(); ++i) EXPECT_LT(rel[i], 1e-5) << name << " step " << i;
  }
  unlink(out.c_str());
  rmdir(dir.c_str());
}

// shadow.reference = "fp32_device" against "fp64": one run (shadow mode never touches it, so
// both give the same losses bit for bit) shadowed both ways. By the triangle inequality a device
// metric lies within the fp32 reference's own distance eps from fp64 of the fp64 metric,
// |device - fp64| <= eps (1 + fp64) / (1 - eps), and the fp64 run measures eps by shadowing the
// reference itself (per metric and bucket; for max_row_rel the largest row's). On the device,
// the reference shadowed against itself is exactly 0: the same deterministic kernel. The
// candidates must be deterministic too: the two runs replay them separately (bf16_accum's
// atomics order its additions differently each time, moving its rel_l2 by ~10 % between runs).
TEST(GpuTrain, DeviceShadowMetricsAreTheFp64OnesWithinTheFp32ReferencesDistance) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_shadow_device");
  const std::vector<std::pair<std::string, std::string>> candidates = {
      {"embed_rmsnorm_backward", "fp64_accum"},
      {"linear_forward", "bf16_truncate"},
      {"attention_backward", "batched_gemm"},
      {"rmsnorm_forward", "eps_outside_sqrt"}};
  std::string variants = "shadow.variants=[";
  for (const auto& [op, variant] : candidates)
    variants += op + "=" + variant + ", " + op + "=reference, ";
  variants.resize(variants.size() - 2);
  const std::string seed = "train.seed=" + std::to_string(test_seed() % 1000);
  const auto run = [&](const std::string& reference) {
    const std::string out = dir + "/" + reference + ".h5";
    const RunConfig cfg =
        load_config("", {"backend=cuda", "train.precision=fp32", "data=zipf:1.1", "model.vocab=512",
                         "model.d_model=128", "model.n_heads=4", "model.seq_len=64",
                         "train.batch=32", "train.steps=6", "shadow.every=1", variants + "]",
                         "shadow.reference=" + reference, seed});
    TrainOptions opt;
    opt.out = out, opt.progress = false;
    EXPECT_EQ(train(cfg, opt).status, RunStatus::Completed);
    return out;
  };
  const TraceReader device(run("fp32_device")), exact(run("fp64"));
  EXPECT_EQ(device.floats("/metrics/loss"), exact.floats("/metrics/loss"));
  EXPECT_NE(device.string_attr("/shadow", "reference").find("fp32_device"), std::string::npos);
  std::vector<std::string> metrics = {"rel_l2", "max_row_rel", "cosine"};
  for (const auto& label : frequency_bucket_labels()) metrics.push_back("bucket_rel_l2/" + label);
  int compared = 0;
  for (const auto& [op, variant] : candidates) {
    const std::string self = "/shadow/" + op + "/reference/";
    for (double v : device.floats(self + "rel_l2")) EXPECT_EQ(v, 0.0) << op;
    for (double v : device.floats(self + "max_row_rel")) EXPECT_EQ(v, 0.0) << op;
    for (const auto& metric : metrics) {
      const std::string path = "/shadow/" + op + "/" + variant + "/" + metric;
      const auto got = device.floats(path), want = exact.floats(path);
      // cosine moves by at most the angle between the two references, below eps = their rel_l2
      const auto eps = exact.floats(self + (metric == "cosine" ? "rel_l2" : metric));
      ASSERT_EQ(got.size(), 6u) << path;
      ASSERT_EQ(want.size(), got.size()) << path;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {  // an empty bucket is empty both ways
          EXPECT_TRUE(std::isnan(got[i])) << path << " step " << i;
          continue;
        }
        const double bound =
            metric == "cosine" ? eps[i] * 1.01 : eps[i] * (1 + want[i]) / (1 - eps[i]) * 1.01;
        EXPECT_LE(std::fabs(got[i] - want[i]), bound + 1e-12)
            << path << " step " << i << ": device " << got[i] << ", fp64 " << want[i]
            << ", the fp32 reference's distance " << eps[i] << " (seed " << test_seed() << ")";
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 100);
  std::filesystem::remove_all(dir);
}

TEST(GpuTrain, RefusesAModelThatCannotFitBeforeWritingAnything) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_oom"), out = dir + "/run.h5";
  const RunConfig cfg =
      load_config("", {"backend=cuda", "model.vocab=65536", "model.d_model=4096",
                       "model.n_layers=48", "model.n_heads=32", "model.seq_len=1024",
                       "train.batch=16", "train.optimizer=adamw", "train.steps=1"});
  TrainOptions opt;
  opt.out = out, opt.progress = false;
  try {
    train(cfg, opt);
    ADD_FAILURE() << "a ~10-billion-parameter model at batch 16 trained on one GPU";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("out of device memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.batch = 16"), std::string::npos) << e.what();
  }
  EXPECT_NE(access(out.c_str(), F_OK), 0) << "nothing may be written";
  rmdir(dir.c_str());
}

// The GEMM tuner picks among algorithms by timing, but only among those with its first choice's
// bits (kernels/cuda/gemm_lt.h): a run tuned (DIVLAB_GEMM_TUNING=log, which also names each
// tuned shape's candidates, times and choice on stderr) gives the losses of a run that is not
// (0), bit for bit. The bench size's GEMMs are past the tuner's 1 GFLOP; the op-level test
// (GpuOps.GemmTuningChangesNoBits) compares each candidate's output, this one a whole run.
TEST(GpuTrain, TuningTheGemmsChangesNoLossAndLogsEachChoice) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_tuning");
  const std::string sets =
      " --set backend=cuda --set train.precision=bf16 --set model.vocab=8192 "
      "--set model.d_model=512 --set model.n_layers=2 --set model.n_heads=8 "
      "--set model.seq_len=256 --set train.batch=32 --set train.steps=4 "
      "--set train.seed=" +
      std::to_string(test_seed() % 1000);
  const auto run = [&](const std::string& tuning) {
    const std::string out = dir + "/" + tuning + ".h5", log = dir + "/" + tuning + ".log";
    const std::string cmd = "DIVLAB_GEMM_TUNING=" + tuning + " " + DIVLAB_BIN + " train --quiet" +
                            sets + " --out " + out + " > " + log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return std::pair{TraceReader(out).floats("/metrics/loss"), text};
  };
  const auto [untuned, quiet] = run("0");
  const auto [tuned, logged] = run("log");
  ASSERT_EQ(untuned.size(), 4u);
  ASSERT_EQ(tuned.size(), untuned.size());
  for (size_t i = 0; i < tuned.size(); ++i)
    EXPECT_EQ(tuned[i], untuned[i]) << "step " << i << " (seed " << test_seed() << ")";
  EXPECT_EQ(quiet.find("gemm tuning:"), std::string::npos) << quiet;
  // Each linear layer's three GEMMs at 8 192 tokens (qkv, projection, MLP up and down, the head)
  // and each choice one of the candidates timed.
  size_t lines = 0;
  for (size_t at = logged.find("divlab: gemm tuning: "); at != std::string::npos;
       at = logged.find("divlab: gemm tuning: ", at + 1)) {
    const std::string line = logged.substr(at, logged.find('\n', at) - at);
    const size_t runs = line.rfind("; runs #");
    ASSERT_NE(runs, std::string::npos) << line;
    const std::string chosen = " #" + line.substr(runs + 8) + " ";
    EXPECT_TRUE(line.find(chosen) < runs || line.find("none timed") != std::string::npos)
        << "the kept candidate was not among those timed: " << line;
    ++lines;
  }
  EXPECT_GE(lines, 12u) << logged;
  std::filesystem::remove_all(dir);
}

}  // namespace divlab

namespace divlab {

// The example CUDA plug-in: loaded into the GPU catalogues, trained with, shadowed; in fp32
// mode as written, in bf16 mode through the adapters (widened copies of its bf16 dy); bisected.
TEST(GpuPlugin, ExampleCudaPluginTrainsIsShadowedAndBisected) {
  REQUIRE_GPU();
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string dir = temp_dir("gpu_plugin"), out = dir + "/run.h5";
    const RunConfig cfg = load_config(
        "", {"backend=cuda", std::string("train.precision=") + precision,
             std::string("plugins=[") + DIVLAB_EXAMPLE_CUDA_PLUGIN + "]", "data=zipf:1.1",
             "model.vocab=512", "model.seq_len=64", "train.batch=64", "train.steps=20",
             "kernels.embed_rmsnorm_backward=example_cuda_fp32_atomic", "shadow.every=10",
             "shadow.variants=[embed_rmsnorm_backward=example_cuda_bf16_atomic]"});
    TrainOptions opt;
    opt.out = out, opt.progress = false;
    EXPECT_EQ(train(cfg, opt).status, RunStatus::Completed) << precision;
    const auto rel =
        TraceReader(out).floats("/shadow/embed_rmsnorm_backward/example_cuda_bf16_atomic/rel_l2");
    ASSERT_EQ(rel.size(), 2u) << precision;
    // The bf16 atomics' error, far above fp32 rounding (the fp32-atomic kernel: ~1e-7). Measured
    // on an H100, 8 runs: 2.6e-2 to 3.4e-2 at step 0, 1.1e-2 to 1.5e-2 at step 10 (the hot
    // rows' gradients shrink as the unigram is learned).
    for (double r : rel) EXPECT_GT(r, 1e-3) << precision;
    unlink(out.c_str());
    rmdir(dir.c_str());
  }
  // bisect, on the seed bug's regime (a skewed chain, SGD, 16k tokens per step), names the
  // plug-in's bf16-atomic kernel among two swaps; the other is harmless at this run's logits.
  const std::string dir = temp_dir("gpu_plugin_bisect"), config = dir + "/two-swaps.toml";
  std::ofstream(config) << "backend = \"cuda\"\ndata = \"markov:0.8,0.8\"\nplugins = [\""
                        << DIVLAB_EXAMPLE_CUDA_PLUGIN
                        << "\"]\n[model]\nvocab = 64\nd_model = 32\nn_layers = 1\nn_heads = 2\n"
                           "seq_len = 32\n[train]\nbatch = 512\nsteps = 100\noptimizer = \"sgd\"\n"
                           "lr = 0.3\nmomentum = 0.9\ngrad_clip = 0.0\nwarmup_steps = 20\n[eval]\n"
                           "every = 0\n[kernels]\n"
                           "embed_rmsnorm_backward = \"example_cuda_bf16_atomic\"\n"
                           "cross_entropy = \"no_max_subtraction\"\n";
  const std::string cmd = std::string(DIVLAB_BIN) + " bisect " + config + " --seeds 4 --out " +
                          dir + "/bisect --jobs 2 > " + dir + "/bisect.log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream log(dir + "/bisect.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("culprit: embed_rmsnorm_backward=example_cuda_bf16_atomic (diverged"),
            std::string::npos)
      << text;
}

// The bf16 example plug-in (a kernel as a benchmark submission writes it: raw __nv_bfloat16
// pointers, its own launch configuration, the given stream), plugged in as written: `check` in
// the GPU's bf16 mode catches the kernel that skips each row's tail and passes the correct one;
// a llama model trains with the correct one while the other is shadowed; a grid sweeps both.
TEST(GpuPlugin, Bf16CudaPluginIsCheckedTrainedShadowedAndSwept) {
  REQUIRE_GPU();
  for (const char* variant : {"example_cuda_bf16_swiglu", "example_cuda_bf16_swiglu_vec8"}) {
    CheckOptions opt;
    opt.target = std::string("swiglu_forward=") + variant;
    opt.backend = Backend::Cuda, opt.precision = Precision::Bf16;
    opt.plugins = {DIVLAB_EXAMPLE_CUDA_BF16_PLUGIN};
    opt.seed = test_seed(), opt.sanitizer = false, opt.isolated = false;
    const CheckReport r = run_check(opt);
    const bool packed = std::string(variant).find("vec8") != std::string::npos;
    EXPECT_EQ(r.pass, !packed) << variant << "\n" << format_check(r);
    if (packed) {
      EXPECT_NE(std::find(r.failing.begin(), r.failing.end(), "shapes random"), r.failing.end())
          << format_check(r);
      EXPECT_TRUE(r.benchmark_verifier_passes) << "the benchmark's verifier would pass it";
    }
  }
  // The training half runs the llama model on real text.
  if (!std::filesystem::is_directory(data_dir() + "/brown"))
    GTEST_SKIP() << "checked; the Brown corpus is not at " << data_dir()
                 << "/brown (scripts/setup.sh fetches it; carry data/ to the GPU machine)";
  const std::string dir = temp_dir("gpu_bf16_plugin"), out = dir + "/run.h5";
  const std::vector<std::string> llama = {
      "backend=cuda",
      "train.precision=bf16",
      std::string("plugins=[") + DIVLAB_EXAMPLE_CUDA_BF16_PLUGIN + "]",
      "data=brown",
      "model.vocab=96",
      "model.arch=llama",
      "model.n_heads=4",
      "model.n_kv_heads=2",
      "model.mlp_hidden=44",
      "model.seq_len=32",
      "train.batch=16",
      "train.steps=20"};
  std::vector<std::string> shadowed = llama;
  for (const char* s : {"kernels.swiglu_forward=example_cuda_bf16_swiglu", "shadow.every=5",
                        "shadow.variants=[swiglu_forward=example_cuda_bf16_swiglu_vec8]"})
    shadowed.push_back(s);
  TrainOptions opt;
  opt.out = out, opt.progress = false;
  EXPECT_EQ(train(load_config("", shadowed), opt).status, RunStatus::Completed);
  const auto rel =
      TraceReader(out).floats("/shadow/swiglu_forward/example_cuda_bf16_swiglu_vec8/rel_l2");
  ASSERT_EQ(rel.size(), 4u);
  for (double v : rel) EXPECT_GT(v, 1e-2);  // 4 of every 44 outputs per row never written
  unlink(out.c_str());
  // A grid over both and the reference, through the command line.
  const std::string grid = dir + "/grid.toml", sweep = dir + "/sweep";
  std::ofstream(grid) << "[set]\nbackend = \"cuda\"\ndata = \"brown\"\nplugins = [\""
                      << DIVLAB_EXAMPLE_CUDA_BF16_PLUGIN
                      << "\"]\n[set.model]\nvocab = 96\narch = \"llama\"\nn_heads = 4\n"
                         "n_kv_heads = 2\nmlp_hidden = 44\nseq_len = 32\n[set.train]\n"
                         "precision = \"bf16\"\nbatch = 16\nsteps = 20\n[axes.train]\n"
                         "seed = [1, 2]\n[axes.kernels]\nswiglu_forward = [\"reference\", "
                         "\"example_cuda_bf16_swiglu\", \"example_cuda_bf16_swiglu_vec8\"]\n";
  const std::string cmd = std::string(DIVLAB_BIN) + " sweep --config " + grid + " --out " + sweep +
                          " --jobs 1 > " + dir + "/sweep.log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream log(dir + "/sweep.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("6 completed"), std::string::npos) << text;
}

// An optimizer update from a plug-in, on the device: the example's SGD passes check there and
// trains as the reference does in both modes (in the bf16 mode the reference's update writes the
// weights' bf16 copy in the same pass, which a plug-in's update leaves to the cast after it).
TEST(GpuPlugin, AnOptimizerUpdatePlugsInOnTheGpu) {
  REQUIRE_GPU();
  CheckOptions opt;
  opt.target = "sgd_step=example_cuda_sgd", opt.backend = Backend::Cuda;
  opt.plugins = {DIVLAB_EXAMPLE_CUDA_PLUGIN};
  opt.seed = test_seed(), opt.sanitizer = false, opt.isolated = false;
  const CheckReport r = run_check(opt);
  EXPECT_TRUE(r.failing.empty()) << format_check(r);
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string dir = temp_dir("gpu_plugin_sgd");
    std::vector<std::vector<double>> losses;
    for (const char* sgd : {"reference", "example_cuda_sgd"}) {
      const std::string out = dir + "/" + sgd + ".h5";
      const RunConfig cfg = load_config(
          "", {"backend=cuda", std::string("train.precision=") + precision,
               std::string("plugins=[") + DIVLAB_EXAMPLE_CUDA_PLUGIN + "]", "data=zipf:1.1",
               "model.vocab=512", "model.seq_len=64", "train.batch=16", "train.steps=20",
               "train.optimizer=sgd", std::string("kernels.sgd_step=") + sgd});
      TrainOptions train_opt;
      train_opt.out = out, train_opt.progress = false;
      ASSERT_EQ(train(cfg, train_opt).status, RunStatus::Completed) << precision << " " << sgd;
      losses.push_back(TraceReader(out).floats("/metrics/loss"));
      unlink(out.c_str());
    }
    rmdir(dir.c_str());
    ASSERT_EQ(losses[0].size(), losses[1].size());
    for (size_t s = 0; s < losses[0].size(); ++s)
      EXPECT_NEAR(losses[1][s], losses[0][s], 1e-4 * std::abs(losses[0][s]))
          << precision << " step " << s;
  }
}

// A check of one of the racy CUDA plug-in's kernels, in this process, without the sanitizer pass.
namespace {
CheckOptions racy_plugin_check(const std::string& target) {
  CheckOptions opt;
  opt.target = target, opt.backend = Backend::Cuda;
  opt.plugins = {DIVLAB_RACY_CUDA_PLUGIN};
  opt.seed = test_seed(), opt.sanitizer = false, opt.isolated = false;
  return opt;
}
// `target`, checked as `opt` asks, runs `condition` and passes the whole check.
void expect_runs_and_passes(CheckOptions opt, const char* target, const std::string& condition) {
  opt.target = target;
  const CheckReport ok = run_check(opt);
  const auto it = std::find_if(ok.conditions.begin(), ok.conditions.end(),
                               [&](const ConditionResult& c) { return c.name == condition; });
  ASSERT_NE(it, ok.conditions.end()) << target;
  EXPECT_TRUE(it->ran) << target << ": " << it->note;
  EXPECT_TRUE(ok.failing.empty()) << target << "\n" << format_check(ok);
}
}  // namespace

// check's concurrent-load condition: a kernel that stages its sums in device memory every call
// shares is exact one call at a time and fails only when calls run at once on several streams
// while GEMMs load the device; the references, and a kernel whose float atomics vary the order,
// pass it.
TEST(GpuCheck, ARaceOnSharedDeviceStateFailsOnlyUnderConcurrentLoad) {
  REQUIRE_GPU();
  CheckOptions opt = racy_plugin_check("add=racy_staging");
  const CheckReport racy = run_check(opt);
  EXPECT_EQ(racy.failing, std::vector<std::string>{"concurrent load"}) << format_check(racy);
  EXPECT_NE(format_check(racy).find("a race on shared scratch"), std::string::npos)
      << format_check(racy);
  opt.plugins = {DIVLAB_EXAMPLE_CUDA_PLUGIN};
  for (const char* target :
       {"add=reference", "linear_forward=reference", "linear_backward=reference",
        "attention_backward=reference", "rmsnorm_backward=reference",
        "embed_rmsnorm_backward=reference", "embed_rmsnorm_backward=example_cuda_fp32_atomic"}) {
    opt.target = target;
    const CheckReport ok = run_check(opt);
    for (const ConditionResult& c : ok.conditions)
      if (c.name == "concurrent load") {
        EXPECT_TRUE(c.ran) << target;
        EXPECT_FALSE(c.failed) << target << "\n" << format_check(ok);
      }
  }
}

// A kernel that launches on a stream of its own is exact whenever its inputs are in memory before
// it is queued and it finishes before its outputs are read; "concurrent load" writes them on the
// given stream behind a hold, as training does, and it reads the poison left there until then.
// (On a GPU busy with other work, a condition that reads its outputs soon after the call may
// catch it too: "call 257" did, beside another test.)
TEST(GpuCheck, AKernelOutsideTheStreamItIsGivenFailsUnderConcurrentLoad) {
  REQUIRE_GPU();
  const CheckReport r = run_check(racy_plugin_check("add=own_stream"));
  EXPECT_NE(std::find(r.failing.begin(), r.failing.end(), "concurrent load"), r.failing.end())
      << format_check(r);
  EXPECT_NE(format_check(r).find("work outside the stream it is given"), std::string::npos)
      << format_check(r);
}

// A kernel whose grid is capped at 65 535 blocks of 256 threads with no loop past them is exact on
// every array up to 2^24 values and leaves the rest unwritten: "arrays past 2^24" fails it alone.
// The flat ops' references and the built-in candidates pass that condition.
TEST(GpuCheck, AGridCappedAt65535BlocksFailsOnlyPast2To24Values) {
  REQUIRE_GPU();
  CheckOptions opt = racy_plugin_check("add=grid_capped");
  const CheckReport capped = run_check(opt);
  EXPECT_EQ(capped.failing, std::vector<std::string>{"arrays past 2^24"}) << format_check(capped);
  for (const char* target : {"add=reference", "gelu_backward=reference", "sgd_step=reference",
                             "adamw_step=reference", "softcap_forward=reference"}) {
    expect_runs_and_passes(opt, target, "arrays past 2^24");
  }
}

// A cross-entropy whose rows start at an unsigned 32-bit offset is exact on every array up to 2^32
// values; past them its last rows read (and overwrite) the first rows' logits: "logits past
// 2^32" fails it alone. The references of the ops with logits-sized arrays pass that condition.
TEST(GpuCheck, A32BitOffsetFailsOnlyOnLogitsPast2To32Values) {
  REQUIRE_GPU();
  CheckOptions opt = racy_plugin_check("cross_entropy=offset32");
  const CheckReport wraps = run_check(opt);
  EXPECT_EQ(wraps.failing, std::vector<std::string>{"logits past 2^32"}) << format_check(wraps);
  for (const char* target : {"cross_entropy=reference", "linear_backward=reference"}) {
    expect_runs_and_passes(opt, target, "logits past 2^32");
  }
}

// A kernel of one thread a channel launches nothing past 1024 channels and leaves the launch's
// error pending: check names the error under "channels wide" alone (not as unwritten outputs),
// and a run stops at the call, naming the op and variant, instead of training on with its
// outputs never written (it completed, at the entropy of uniform guessing, before).
TEST(GpuCheck, ALaunchThatFailsIsTheKernelsErrorInCheckAndInARun) {
  REQUIRE_GPU();
  const CheckReport r = run_check(racy_plugin_check("rmsnorm_forward=thread_per_channel"));
  EXPECT_EQ(r.failing, std::vector<std::string>{"channels wide"}) << format_check(r);
  // (CUDA 13 calls a block past 1024 threads cudaErrorInvalidValue; others, InvalidConfiguration.)
  const std::string error = "a CUDA plug-in kernel left an error: cudaErrorInvalid";
  EXPECT_NE(format_check(r).find(error), std::string::npos) << format_check(r);
  const std::string dir = temp_dir("gpu_plugin_launch"), out = dir + "/run.h5";
  const RunConfig cfg =
      load_config("", {"backend=cuda", "train.precision=fp32",
                       std::string("plugins=[") + DIVLAB_RACY_CUDA_PLUGIN + "]", "data=zipf:1.1",
                       "model.vocab=512", "model.d_model=1152", "model.n_heads=8",
                       "model.n_layers=1", "model.seq_len=32", "train.batch=4", "train.steps=3",
                       "kernels.rmsnorm_forward=thread_per_channel"});
  TrainOptions opt;
  opt.out = out, opt.progress = false;
  try {
    train(cfg, opt);
    ADD_FAILURE() << "the run went on";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("in op rmsnorm_forward (variant thread_per_channel"), std::string::npos)
        << what;
    EXPECT_NE(what.find(error), std::string::npos) << what;
  }
  EXPECT_EQ(TraceReader(out).string_attr("/", "status"), "failed");
  unlink(out.c_str());
  rmdir(dir.c_str());
}

// A kernel that allocates device scratch at every call and never releases it gives the right
// values at every condition; the 257th call sees the device's memory grow (128 KiB a call at the
// aligned shape). The built-in reference does not grow it.
TEST(GpuCheck, DeviceMemoryThatGrowsAtEveryCallFailsTheWarmedUpCall) {
  REQUIRE_GPU();
  CheckOptions opt = racy_plugin_check("add=leaks_device_scratch");
  const CheckReport leaking = run_check(opt);
  EXPECT_EQ(leaking.failing, std::vector<std::string>{"call 257 (warmed up)"})
      << format_check(leaking);
  // (The host heap grows a little too: the driver's record of every allocation.)
  const std::string report = format_check(leaking);
  EXPECT_NE(report.find("leaks memory: "), std::string::npos) << report;
  EXPECT_NE(report.find("device memory +"), std::string::npos) << report;
  for (const char* target : {"add=reference", "linear_backward=reference"}) {
    opt.target = target;
    const CheckReport ok = run_check(opt);
    EXPECT_TRUE(ok.failing.empty()) << target << "\n" << format_check(ok);
  }
}

// A kernel that writes one value past the device scratch it asked for: check's scratch is exactly
// the size asked, between guards read back after each call, so every condition names the write
// (compute-sanitizer's memcheck does not: the write stays inside the allocation).
TEST(GpuCheck, DeviceScratchWrittenPastItsEndFailsEveryCondition) {
  REQUIRE_GPU();
  const CheckReport r = run_check(racy_plugin_check("add=scratch_one_short"));
  const std::string report = format_check(r);
  for (const char* condition :
       {"shape tiny", "shape odd", "shapes random", "concurrent load", "call 257 (warmed up)"})
    EXPECT_NE(std::find(r.failing.begin(), r.failing.end(), condition), r.failing.end())
        << condition << "\n"
        << report;
  EXPECT_NE(report.find("(asked for 34628 bytes): written up to 4 bytes past its end"),
            std::string::npos)
      << report;
}

// Run in a child of the test below (DIVLAB_TEST_HOLD_FILE set): holds 1 GiB of device memory,
// says so in that file, and waits to be killed. Skipped when run as a test of its own.
TEST(GpuCheck, HelperHoldingDeviceMemory) {
  const char* ready = std::getenv("DIVLAB_TEST_HOLD_FILE");
  if (ready == nullptr) GTEST_SKIP() << "run by OtherProcessesDeviceMemoryIsNotThisProcesss";
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, size_t(1) << 30), cudaSuccess);
  ASSERT_EQ(cudaMemset(p, 1, size_t(1) << 30), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::ofstream(ready) << "held\n";
  pause();
}

// The leak probe's reading (kernels/memory.h bytes_in_use) is this process's own where the
// driver's NVML lists it: another process taking 1 GiB does not move it; this one's 256 MiB do.
TEST(GpuCheck, OtherProcessesDeviceMemoryIsNotThisProcesss) {
  REQUIRE_GPU();
  if (cuda::own_device_bytes() < 0)
    GTEST_SKIP() << "NVML does not list this process here: the probe reads the whole device";
  const std::string dir = temp_dir("gpu_hold"), ready = dir + "/ready";
  const int64_t before = cuda::own_device_bytes();
  SpawnOptions so;
  so.setenv = {"DIVLAB_TEST_HOLD_FILE=" + ready};
  const pid_t helper =
      spawn_process({"/proc/self/exe", "--gtest_filter=GpuCheck.HelperHoldingDeviceMemory"}, so);
  ASSERT_GT(helper, 0);
  for (int i = 0; i < 600 && !std::filesystem::exists(ready); ++i) usleep(50 * 1000);
  const bool held = std::filesystem::exists(ready);
  const int64_t beside = cuda::own_device_bytes();
  kill(helper, SIGKILL);
  waitpid(helper, nullptr, 0);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(held) << "the helper never held its 1 GiB";
  EXPECT_LT(beside - before, int64_t(64) << 20) << "another process's 1 GiB counted as ours";
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, size_t(256) << 20), cudaSuccess);
  const int64_t grown = cuda::own_device_bytes();
  cudaFree(p);
  EXPECT_GE(grown - beside, int64_t(256) << 20);
  EXPECT_EQ(int64_t(cuda::device_bytes_in_use()), cuda::own_device_bytes());
}

// `divlab check TARGET --backend cuda` with the test plug-in and its sanitizer pass (`extra`:
// more arguments, shell-quoted): the exit code and everything it printed.
namespace {
std::pair<int, std::string> check_with_sanitizers(const std::string& dir, const std::string& target,
                                                  const std::string& extra = "") {
  const std::string log = dir + "/" + target + ".log";
  const std::string cmd = std::string(DIVLAB_BIN) + " check " + target +
                          " --backend cuda --plugins " + DIVLAB_RACY_CUDA_PLUGIN + " --seed " +
                          std::to_string(test_seed()) + " " + extra + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
          std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>())};
}
}  // namespace

// check's compute-sanitizer pass: a kernel that reuses a shared-memory tile without the barrier
// after it is read computes the right values (the warps of a block keep close) and racecheck
// reports the hazard: the check fails it as "sanitizer racecheck", naming the race. The
// reference, its GEMM load and the pass's other tools stay clean.
TEST(GpuCheck, ASharedMemoryRaceFailsTheSanitizerPass) {
  REQUIRE_GPU();
  if (!on_path("compute-sanitizer")) GTEST_SKIP() << "compute-sanitizer is not on PATH";
  const std::string dir = temp_dir("gpu_check_racecheck");
  const auto check = [&](const std::string& target) { return check_with_sanitizers(dir, target); };
  const auto [racy_rc, racy] = check("rmsnorm_forward=missing_barrier");
  EXPECT_EQ(racy_rc, 1) << racy;
  EXPECT_NE(racy.find("[sanitizer racecheck]"), std::string::npos) << racy;
  EXPECT_NE(racy.find("compute-sanitizer racecheck: ERRORS: RACECHECK SUMMARY"), std::string::npos)
      << racy;
  EXPECT_NE(racy.find("rmsnorm_missing_barrier"), std::string::npos) << racy;
  EXPECT_NE(racy.find("compute-sanitizer memcheck: ERROR SUMMARY: 0 errors"), std::string::npos)
      << racy;
  const auto [ok_rc, ok] = check("rmsnorm_forward=reference");
  EXPECT_EQ(ok_rc, 0) << ok;
  EXPECT_NE(ok.find("compute-sanitizer racecheck: RACECHECK SUMMARY: 0 hazards"), std::string::npos)
      << ok;
  EXPECT_NE(ok.find("compute-sanitizer synccheck: ERROR SUMMARY: 0 errors"), std::string::npos)
      << ok;
}

// --condition: the sanitizer pass runs over the conditions named. racecheck, which runs the shape
// conditions alone, still finds the race where one that reaches it is named (rows of 256: two
// tiles of 128, the second overwriting the first), and says it did not run where none is (the
// race is in no condition's values: that check passes, its line telling why).
TEST(GpuCheck, TheSanitizerPassRunsOverTheConditionsNamed) {
  REQUIRE_GPU();
  if (!on_path("compute-sanitizer")) GTEST_SKIP() << "compute-sanitizer is not on PATH";
  const std::string dir = temp_dir("gpu_check_condition");
  const auto [shape_rc, shape] =
      check_with_sanitizers(dir, "rmsnorm_forward=missing_barrier", "--condition 'shape large'");
  EXPECT_EQ(shape_rc, 1) << shape;
  EXPECT_NE(shape.find("1 of "), std::string::npos) << shape;
  EXPECT_NE(shape.find("[sanitizer racecheck]"), std::string::npos) << shape;
  const auto [values_rc, values] =
      check_with_sanitizers(dir, "rmsnorm_forward=missing_barrier", "--condition 'values NaN'");
  EXPECT_EQ(values_rc, 0) << values;
  EXPECT_NE(values.find("compute-sanitizer racecheck: not run (it runs the shape conditions, and "
                        "--condition names none)"),
            std::string::npos)
      << values;
  for (const char* clean : {"compute-sanitizer memcheck: ERROR SUMMARY: 0 errors",
                            "compute-sanitizer synccheck: ERROR SUMMARY: 0 errors"})
    EXPECT_NE(values.find(clean), std::string::npos) << clean << "\n" << values;
}

// A barrier that the threads past a row's end pass by while the others wait at it (the rest of
// their warp waiting at the next one) is undefined in CUDA and forgiven by today's GPUs: every
// condition's values are right, and synccheck reports the split warp, naming the kernel and its
// line. The check fails it under synccheck, and under no condition of values.
TEST(GpuCheck, ABarrierPartOfAWarpPassesByFailsUnderSynccheck) {
  REQUIRE_GPU();
  if (!on_path("compute-sanitizer")) GTEST_SKIP() << "compute-sanitizer is not on PATH";
  const auto [rc, text] =
      check_with_sanitizers(temp_dir("gpu_check_synccheck"), "rmsnorm_forward=barrier_in_branch");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("verdict: FAIL under: [sanitizer "), std::string::npos) << text;
  EXPECT_NE(text.find("[sanitizer synccheck]"), std::string::npos) << text;
  EXPECT_NE(text.find("compute-sanitizer synccheck: ERRORS: ERROR SUMMARY: "), std::string::npos)
      << text;
  EXPECT_NE(text.find("first: Barrier error detected."), std::string::npos) << text;
  EXPECT_NE(text.find("rmsnorm_barrier_in_branch"), std::string::npos) << text;
  EXPECT_NE(text.find("compute-sanitizer memcheck: ERROR SUMMARY: 0 errors"), std::string::npos)
      << text;
}

// A candidate that fails on its values alone is no sanitizer finding: the checked run under each
// tool ends with its failing verdict's exit code, which the tools report ("Target application
// returned an error") without counting it, and none of the three lines fails.
TEST(GpuCheck, ACandidateWrongOnlyInItsValuesHasNoSanitizerFinding) {
  REQUIRE_GPU();
  if (!on_path("compute-sanitizer")) GTEST_SKIP() << "compute-sanitizer is not on PATH";
  const auto [rc, text] =
      check_with_sanitizers(temp_dir("gpu_check_values_only"), "softcap_forward=omitted");
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("verdict: FAIL under: ["), std::string::npos) << text;
  EXPECT_EQ(text.find("[sanitizer"), std::string::npos) << text;
  for (const char* clean : {"compute-sanitizer memcheck: ERROR SUMMARY: 0 errors",
                            "compute-sanitizer racecheck: RACECHECK SUMMARY: 0 hazards",
                            "compute-sanitizer synccheck: ERROR SUMMARY: 0 errors"})
    EXPECT_NE(text.find(clean), std::string::npos) << clean << "\n" << text;
}

// A kernel that hangs (a grid barrier past the resident blocks) fails the conditions it hangs
// under, and the sanitizer pass, which runs every condition in one process with no hang clock,
// is not run after it: check returns.
TEST(GpuCheck, AKernelThatHangsEndsTheCheckWithoutTheSanitizerPass) {
  REQUIRE_GPU();
  if (!on_path("compute-sanitizer")) GTEST_SKIP() << "compute-sanitizer is not on PATH";
  const std::string log = temp_dir("gpu_check_hang") + "/check.log";
  const std::string cmd = std::string(DIVLAB_BIN) + " check add=grid_barrier --backend cuda " +
                          "--time-limit 5 --plugins " + DIVLAB_RACY_CUDA_PLUGIN + " --seed " +
                          std::to_string(test_seed()) + " > " + log + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << text;
  EXPECT_NE(text.find("[arrays large (4 M)]"), std::string::npos) << text;
  EXPECT_NE(text.find("hang: no result within 5 s"), std::string::npos) << text;
  EXPECT_NE(text.find("compute-sanitizer not run (the kernel hung under '"), std::string::npos)
      << text;
}

// A sanitizer that ends without its summary (killed, crashed, unable to start the check) has its
// line say how it ended and that nothing was judged ("no summary" alone said neither).
TEST(GpuCheck, ASanitizerEndedBeforeItsSummarySaysHowAndJudgesNothing) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_check_killed_sanitizer");
  const std::string tool = dir + "/compute-sanitizer";
  std::ofstream(tool) << "#!/bin/sh\necho 'a tool killed at its start'\nkill -9 $$\n";
  std::filesystem::permissions(tool, std::filesystem::perms::owner_all);
  const std::string log = dir + "/check.log";
  const std::string cmd = "PATH=" + dir + ":$PATH " + DIVLAB_BIN + " check add=reference " +
                          "--backend cuda --seed " + std::to_string(test_seed()) + " > " + log +
                          " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << text;
  for (const char* tool_name : {"memcheck", "racecheck", "synccheck"})
    EXPECT_NE(text.find(std::string("compute-sanitizer ") + tool_name +
                        ": no summary line (it ended with SIGKILL (Killed); not judged; its "
                        "log's last line: a tool killed at its start)"),
              std::string::npos)
        << text;
}
}  // namespace divlab
