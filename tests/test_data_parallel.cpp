// Simulated data-parallel ranks (train.ranks): the batch split into shards whose gradients the
// grad_reduce op averages. The reference reduction must give the one-rank run's training to
// rounding; its variants must do what the catalogue says they do to a run. And gradient
// accumulation (train.micro_batches): each shard run as M batches, each adding its gradient into
// the step's; with the reference kernels the whole batch's training to rounding, and, unlike
// ranks, the dose of a kernel that accumulates in low precision kept whole.
#include <algorithm>
#include <cmath>

#include "experiments/config.h"
#include "experiments/train.h"
#include "io/trace.h"
#include "tests/support/check.h"
#include "tests/support/fixtures.h"
#include "tests/support/hot_row.h"

namespace divlab {
using namespace testing;

namespace {
// Where this binary's runs write their traces (one folder, so a test can read a run's trace).
const std::string& run_dir() {
  static const std::string dir = temp_dir("data_parallel");
  return dir;
}

// A small model's losses over `steps` steps; `extra` overrides on top.
std::vector<double> losses(const std::string& name, std::vector<std::string> extra,
                           std::string* status = nullptr, std::string* nan_op = nullptr) {
  std::vector<std::string> keys = {"model.vocab=64",
                                   "model.d_model=32",
                                   "model.n_layers=2",
                                   "model.n_heads=2",
                                   "model.seq_len=16",
                                   "train.batch=8",
                                   "train.steps=25",
                                   "train.lr=0.1",
                                   "train.threads=1",
                                   "data=markov:0.8,0.8",
                                   "checkpoint.every=0",
                                   "train.grad_clip=1",
                                   "train.seed=" + std::to_string(test_seed() % 1000)};
  keys.insert(keys.end(), extra.begin(), extra.end());
  const std::string out = run_dir() + "/" + name + ".h5";
  TrainOptions opt;
  opt.out = out, opt.progress = false, opt.force = true;
  train(load_config("", keys), opt);
  const TraceReader r(out);
  if (status) *status = r.string_attr("/", "status");
  if (nan_op && r.has_attr("/", "nan_op")) *nan_op = r.string_attr("/", "nan_op");
  return r.floats("/metrics/loss");
}

double largest_relative_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    gap = std::max(gap, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return gap;
}
std::vector<double> series(const std::string& name, const std::string& path) {
  return TraceReader(run_dir() + "/" + name + ".h5").floats(path);
}
}  // namespace

TEST(DataParallel, RanksWithTheReferenceReductionTrainAsOneRank) {
  // Same batches, same gradients up to the order of the sums. At step 0 (no trajectory yet) the
  // gradients agree to the precision's rounding; over the run, this small model at lr 0.3
  // amplifies any rounding difference (fp64 runs of other summation orders drift apart by up
  // to ~1e-8), so the band is the run's measured noise floor: 4x the fp32 run's own distance
  // from fp64.
  const auto exact = losses("one-fp64", {"train.precision=fp64"});
  const auto fp32 = losses("one-fp32", {"train.precision=fp32"});
  const double noise = std::max(1e-5, 4 * largest_relative_gap(fp32, exact));
  for (const char* ranks : {"2", "4", "8"}) {
    const std::string r = std::string("train.ranks=") + ranks;
    for (const char* precision : {"fp64", "fp32"}) {
      const bool is64 = std::string(precision) == "fp64";
      const std::string name = std::string("ranks-") + ranks + precision;
      const auto many =
          losses(name, {std::string("train.precision=") + precision, r, "eval.every=10"});
      const auto& one = is64 ? exact : fp32;
      ASSERT_EQ(many.size(), one.size());
      const TraceReader split(run_dir() + "/" + name + ".h5");
      const TraceReader whole(run_dir() + "/one-" + precision + ".h5");
      for (const char* p : {"wte.weight", "blocks.0.attn.qkv.weight", "lm_head.weight"}) {
        const std::string g = std::string("/metrics/grad_norm_by_param/") + p;
        EXPECT_NEAR(split.floats(g)[0], whole.floats(g)[0],
                    (is64 ? 1e-13 : 1e-5) * whole.floats(g)[0])
            << p << " at step 0, " << ranks << " ranks, " << precision << " (seed " << test_seed()
            << ")";
      }
      EXPECT_LT(largest_relative_gap(many, one), is64 ? 1e-6 : noise)
          << ranks << " ranks, " << precision << " (seed " << test_seed() << ")";
    }
  }
}

TEST(DataParallel, AMissingWorldSizeDivisionShowsUnderSgdAndHidesUnderAdamW) {
  // The field's documented bug: gradients R times too large. SGD takes R times the step;
  // AdamW's m / sqrt(v) does not see a gradient's scale, only eps does: with R x eps, R x the
  // gradients give the same update, bitwise (a power-of-two scale commutes with every rounding).
  // With the same eps the runs differ by eps's share of the update alone, which this small model
  // usually leaves near 1e-6 but on a rare seed amplifies to ~3e-3 (seed 122), so that gap is
  // judged against SGD's, never against a fixed bar (the smallest SGD / AdamW ratio over train
  // seeds 1-400 is 249).
  // (Without clipping, which the catalogue names as a mask: a clipped norm hides the scale.)
  const std::vector<std::string> sgd = {"train.ranks=4", "train.optimizer=sgd", "train.lr=0.1",
                                        "train.grad_clip=0"};
  const std::vector<std::string> adamw = {"train.ranks=4", "train.optimizer=adamw", "train.lr=3e-3",
                                          "train.grad_clip=0", "train.eps=1e-8"};
  auto with = [](std::vector<std::string> keys, std::vector<std::string> extra) {
    keys.insert(keys.end(), extra.begin(), extra.end());
    return keys;
  };
  const std::string sum = "kernels.grad_reduce=sum_not_mean";
  const double sgd_gap =
      largest_relative_gap(losses("sgd-sum", with(sgd, {sum})), losses("sgd-ref", sgd));
  const auto adamw_ref = losses("adamw-ref", adamw);
  const double adamw_gap = largest_relative_gap(losses("adamw-sum", with(adamw, {sum})), adamw_ref);
  const double adamw_eps_scaled_gap = largest_relative_gap(
      losses("adamw-sum-eps4", with(adamw, {sum, "train.eps=4e-8"})), adamw_ref);
  const std::string seed = " (seed " + std::to_string(test_seed()) + ")";
  EXPECT_GT(sgd_gap, 1e-2) << "SGD with 4x gradients" << seed;
  EXPECT_EQ(adamw_eps_scaled_gap, 0.0) << "AdamW with 4x gradients and 4x eps" << seed;
  EXPECT_GT(sgd_gap, 30 * adamw_gap) << "SGD " << sgd_gap << ", AdamW " << adamw_gap << seed;
}

TEST(DataParallel, AnOverflowOnTheFp16WireIsAttributedToTheReduction) {
  // Weights so large that some gradients pass fp16's 65504: every rank's ops stay finite, the
  // reduction does not, and the NaN replay names it. The reference reduction stays finite.
  // (init_std 1e5 is where this model's gradients first pass 65504; the steps are too small to
  // move the weights, so the reference run stays finite.)
  const std::vector<std::string> big = {"train.ranks=4", "model.init_std=3e5", "train.steps=4",
                                        "train.grad_clip=0", "train.lr=1e-9"};
  std::string status, op;
  std::vector<std::string> fp16 = big;
  fp16.push_back("kernels.grad_reduce=fp16_comm");
  losses("fp16", fp16, &status, &op);
  EXPECT_EQ(status, "nan");
  EXPECT_EQ(op, "grad_reduce");
  losses("fp32", big, &status);
  EXPECT_EQ(status, "completed");
}

TEST(MicroBatches, TrainAsTheWholeBatch) {
  // fp64: the same batches and gradients up to the order of the sums, so the losses, the
  // validation losses and the step-0 gradient norms agree far inside fp32's rounding. gpt2
  // untied and tied (the head's gradient added into the embedding's rows before the scatter),
  // and llama.
  const std::vector<std::vector<std::string>> models = {
      {}, {"model.tied_embeddings=true"}, {"model.arch=llama", "model.n_kv_heads=1"}};
  for (size_t i = 0; i < models.size(); ++i) {
    std::vector<std::string> keys = models[i];
    keys.insert(keys.end(), {"train.precision=fp64", "eval.every=10"});
    const std::string whole = "model" + std::to_string(i) + "-whole";
    const auto one = losses(whole, keys);
    for (const char* micro : {"2", "8"}) {
      std::vector<std::string> split_keys = keys;
      split_keys.push_back(std::string("train.micro_batches=") + micro);
      const std::string split = "model" + std::to_string(i) + "-micro" + micro;
      const std::string what =
          split + " in " + micro + " micro-batches (seed " + std::to_string(test_seed()) + ")";
      EXPECT_LT(largest_relative_gap(losses(split, split_keys), one), 1e-10) << what;
      EXPECT_LT(
          largest_relative_gap(series(split, "/eval/val_loss"), series(whole, "/eval/val_loss")),
          1e-12)
          << what;
      EXPECT_NEAR(series(split, "/metrics/grad_norm")[0], series(whole, "/metrics/grad_norm")[0],
                  1e-13 * series(whole, "/metrics/grad_norm")[0])
          << what;
      // The dose is the step's, not the micro-batch's.
      EXPECT_EQ(series(split, "/metrics/max_row_contributions"),
                series(whole, "/metrics/max_row_contributions"))
          << what;
    }
  }
}

TEST(MicroBatches, KeepTheDoseThatRanksDivide) {
  // One step of 4096 tokens, a third of them one id: its embedding row receives ~1400 additions.
  // bf16_accum rounds each into the row's bf16 accumulator, which stalls near 256 same-size
  // additions. Four micro-batches go on adding into the same rows: the same error. Four ranks
  // start each shard's rows from zero and average them in fp32: a quarter of the dose, a smaller
  // error.
  const SplitErrors e = split_errors(cpu_catalogue<float>(), "bf16_accum", test_seed());
  expect_micro_batches_keep_the_dose(e, 0.05, test_seed());
}

}  // namespace divlab
