// The GPU backend through the trainer's front door: a trace written by a cuda run (with shadow
// mode on the GPU), and a model too large for the device refused before anything is allocated or
// written.
#include <unistd.h>

#include "experiments/config.h"
#include "experiments/train.h"
#include "io/trace.h"
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
  EXPECT_EQ(train(cfg, opt).status, "completed");
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

// Every shadowable op's GPU reference shadowed at every step in fp32 mode: each replay path
// (inputs, token ids, outputs; all copies queued, read by the worker after a fence) must agree
// with the fp64 CPU reference as closely as the op tests require. A copy read before it arrived
// would show as a large error (or garbage) here.
TEST(GpuTrain, ShadowedReferencesMatchTheFp64ReferenceAtEveryStep) {
  REQUIRE_GPU();
  const std::string dir = temp_dir("gpu_shadow_all"), out = dir + "/run.h5";
  const std::vector<std::string> ops = {"rmsnorm_forward", "rmsnorm_backward", "linear_forward",
                                        "attention_forward", "cross_entropy"};
  std::string variants = "shadow.variants=[embed_rmsnorm_backward=fp64_accum";
  for (const auto& op : ops) variants += ", " + op + "=reference";
  const RunConfig cfg =
      load_config("", {"backend=cuda", "train.precision=fp32", "data=zipf:1.1", "model.vocab=301",
                       "model.d_model=72", "model.n_heads=4", "model.seq_len=37", "train.batch=3",
                       "train.steps=12", "shadow.every=1", variants + "]",
                       "train.seed=" + std::to_string(test_seed() % 1000)});
  TrainOptions opt;
  opt.out = out, opt.progress = false;
  EXPECT_EQ(train(cfg, opt).status, "completed");
  const TraceReader r(out);
  for (const auto& name : {"embed_rmsnorm_backward/fp64_accum", "rmsnorm_forward/reference",
                           "rmsnorm_backward/reference", "linear_forward/reference",
                           "attention_forward/reference", "cross_entropy/reference"}) {
    const auto rel = r.floats(std::string("/shadow/") + name + "/rel_l2");
    ASSERT_EQ(rel.size(), 12u) << name;
    for (size_t i = 0; i < rel.size(); ++i) EXPECT_LT(rel[i], 1e-5) << name << " step " << i;
  }
  unlink(out.c_str());
  rmdir(dir.c_str());
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

}  // namespace divlab

namespace divlab {

// The example CUDA plug-in: loaded into the GPU catalogues, trained with, shadowed; in fp32
// mode as written, in bf16 mode through the adapters (widened copies of its bf16 dy).
TEST(GpuPlugin, ExampleCudaPluginTrainsAndIsShadowed) {
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
    EXPECT_EQ(train(cfg, opt).status, "completed") << precision;
    const auto rel =
        TraceReader(out).floats("/shadow/embed_rmsnorm_backward/example_cuda_bf16_atomic/rel_l2");
    ASSERT_EQ(rel.size(), 2u) << precision;
    for (double r : rel) EXPECT_GT(r, 1e-2) << precision;
    unlink(out.c_str());
    rmdir(dir.c_str());
  }
}

}  // namespace divlab
