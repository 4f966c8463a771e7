// `divlab check --train`'s grid per op and its summary sentence. (The end-to-end run is in
// tests/py/test_check.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "experiments/check_train.h"
#include "experiments/grid.h"
#include "tests/support/fixtures.h"

namespace divlab {
using namespace testing;

namespace {
// The grid check would run for `op`, loaded the way the sweep loads it.
Grid loaded(Op op, const std::vector<std::string>& plugins = {}) {
  const CheckTrainGrid g =
      check_train_grid(op, {"reference"}, Backend::Cpu, Precision::Fp32, plugins);
  const std::string path = temp_dir("check_train") + "/" + op_name(op) + ".grid.toml";
  std::ofstream(path) << g.text;
  return load_grid(path, g.quick);
}
const std::vector<std::string>* axis(const Grid& g, const std::string& key) {
  for (const auto& [k, values] : g.axes)
    if (k == key) return &values;
  return nullptr;
}
bool every_cell_has(const Grid& g, const std::string& setting) {
  for (const auto& cell : g.cells) {
    bool found = false;
    for (const auto& s : cell) found = found || s == setting;
    if (!found) return false;
  }
  return true;
}
}  // namespace

// Every op gets a grid that loads, whose last (fastest) axis is its kernels, on the backend asked;
// with one of its variants as the candidate, so the grid's model calls the op (a kernel choice
// for an op the model never calls does not load).
TEST(CheckTrain, EveryOpGetsAGridThatLoads) {
  for (int i = 0; i < kOpCount; ++i) {
    const Op op = Op(i);
    SCOPED_TRACE(op_name(op));
    std::vector<std::string> arms = {"reference"};
    cpu_catalogue<float>().for_each_op([&](const auto& ops, auto) {
      if (ops.op == op_name(op) && ops.entries.size() > 1) arms.push_back(ops.entries[1].name);
    });
    const CheckTrainGrid c = check_train_grid(op, arms, Backend::Cpu, Precision::Fp32, {});
    const std::string path = temp_dir("check_train") + "/" + op_name(op) + ".arms.toml";
    std::ofstream(path) << c.text;
    const Grid g = load_grid(path, c.quick);
    ASSERT_FALSE(g.axes.empty());
    EXPECT_EQ(g.axes.back().first, std::string("kernels.") + op_name(op));
    EXPECT_EQ(g.axes.back().second, arms);
    EXPECT_TRUE(every_cell_has(g, "backend=cpu"));
  }
}

// The kind of error decides the grid: hot rows for the token ops, unaligned sizes for the rest,
// an update only under its own optimizer, the weight copy in the mode that calls it.
TEST(CheckTrain, TheGridFollowsTheOpsKindOfError) {
  const Grid tokens = loaded(Op::embed_rmsnorm_backward);
  ASSERT_NE(axis(tokens, "data"), nullptr);
  EXPECT_EQ(*axis(tokens, "data"), (std::vector<std::string>{"markov:0.8,0.8", "markov:0,0.8"}));
  EXPECT_EQ(tokens.size(), 2u * 2 * 3);  // --quick: two chains, two optimizers, three seeds

  const Grid dense = loaded(Op::linear_forward);
  EXPECT_EQ(axis(dense, "data"), nullptr);
  EXPECT_TRUE(every_cell_has(dense, "model.vocab=97"));
  EXPECT_EQ(axis(dense, "train.optimizer")->size(), 2u);

  EXPECT_EQ(*axis(loaded(Op::sgd_step), "train.optimizer"), std::vector<std::string>{"sgd"});
  EXPECT_EQ(*axis(loaded(Op::adamw_step), "train.optimizer"),
            std::vector<std::string>{"adamw train.lr=3e-3"});
  EXPECT_TRUE(every_cell_has(loaded(Op::cast), "train.precision=bf16"));
  // Any op checked in the bf16 mode trains in it (a bf16 kernel runs in no other).
  const CheckTrainGrid bf16 =
      check_train_grid(Op::swiglu_forward, {"reference"}, Backend::Cpu, Precision::Bf16, {});
  const std::string path = temp_dir("check_train") + "/swiglu_bf16.grid.toml";
  std::ofstream(path) << bf16.text;
  EXPECT_TRUE(every_cell_has(load_grid(path, bf16.quick), "train.precision=bf16"));
  EXPECT_FALSE(every_cell_has(loaded(Op::swiglu_forward), "train.precision=bf16"));
  // The llama family's ops in a llama model with shared kv heads and a soft-cap.
  for (Op op : {Op::rope_forward, Op::gqa_backward, Op::softcap_forward, Op::add_rmsnorm_forward}) {
    const Grid llama = loaded(op);
    EXPECT_TRUE(every_cell_has(llama, "model.arch=llama")) << op_name(op);
    EXPECT_TRUE(every_cell_has(llama, "model.n_kv_heads=2")) << op_name(op);
  }
  EXPECT_FALSE(every_cell_has(dense, "model.arch=llama"));
  EXPECT_FALSE(every_cell_has(dense, "train.precision=bf16"));
  // The gradient reduction over data-parallel ranks, unclipped (clipping hides a scale error).
  const Grid ranks = loaded(Op::grad_reduce);
  EXPECT_TRUE(every_cell_has(ranks, "train.ranks=4"));
  for (const auto& cell : ranks.cells) {
    const auto clip = std::find_if(cell.begin(), cell.end(), [](const std::string& s) {
      return s.rfind("train.grad_clip=", 0) == 0;
    });
    ASSERT_NE(clip, cell.end());
    EXPECT_EQ(std::stod(clip->substr(16)), 0.0) << *clip;
  }
  EXPECT_FALSE(every_cell_has(dense, "train.ranks=4"));
}

namespace {
Verdict verdict(const std::string& group, const std::string& variant, Outcome result,
                int first_cell, bool control = false) {
  Verdict v;
  v.group = group, v.variant = variant, v.verdict = result, v.first_cell = first_cell;
  v.control = control, v.gap = result == Outcome::NoDivergence ? 0.0001 : 0.5, v.p_welch = 0.01;
  return v;
}
}  // namespace

TEST(CheckTrain, TheSummarySaysWhereTheCandidateChangedTrainingInGridOrder) {
  const std::string bug = "linear_forward=tail_skip";
  const std::string s =
      train_summary(bug, {verdict("train.optimizer=adamw", bug, Outcome::NoDivergence, 12),
                          verdict("train.optimizer=sgd", bug, Outcome::Diverged, 0),
                          verdict("train.optimizer=sgd", "linear_forward=fp64_accum",
                                  Outcome::NoDivergence, 0, true)});
  EXPECT_EQ(s.rfind("summary: linear_forward=tail_skip changed training in 1 of 2 groups: "
                    "train.optimizer=sgd: diverged (gap +0.5000, p 0.01",
                    0),
            0u)
      << s;
  EXPECT_NE(s.find("; no divergence in train.optimizer=adamw"), std::string::npos) << s;
  EXPECT_EQ(s.find("note:"), std::string::npos) << s;

  const std::string quiet =
      train_summary(bug, {verdict("g", bug, Outcome::NoDivergence, 0),
                          verdict("g", "linear_forward=fp64_accum", Outcome::Diverged, 0, true)});
  EXPECT_NE(quiet.find("moved no group's mean loss past its controls' noise floor (1 group"),
            std::string::npos)
      << quiet;
  EXPECT_NE(quiet.find("note: the control linear_forward=fp64_accum in g: diverged"),
            std::string::npos)
      << quiet;

  // No consistent gap, yet every run moved (AdamW at a huge dose): said, not called no effect.
  Verdict noisy = verdict("train.optimizer=adamw", bug, Outcome::NoDivergence, 0);
  noisy.perturbed = true, noisy.shift = 0.05, noisy.control_shift = 0.0025, noisy.p_shift = 0.003;
  const std::string moved = train_summary(bug, {noisy});
  EXPECT_EQ(moved.find("this grid shows no effect"), std::string::npos) << moved;
  EXPECT_NE(moved.find("note: perturbed, in no consistent direction, in train.optimizer=adamw: "
                       "each seed's final loss moved 20x as far as the controls (root mean "
                       "square 0.05 against 0.0025, p = 0.003)"),
            std::string::npos)
      << moved;
  noisy.control_shift = 0;  // bit-exact controls: no ratio to print
  EXPECT_NE(train_summary(bug, {noisy}).find("where the controls did not move theirs"),
            std::string::npos);

  // Most seeds one way, some far beyond the rest: Welch's t misses it, and the summary says so.
  Verdict lopsided = verdict("train.optimizer=sgd", bug, Outcome::NoDivergence, 0);
  lopsided.lopsided = true, lopsided.gap = 0.013, lopsided.p_welch = 0.16;
  lopsided.seeds = 24, lopsided.seeds_one_way = 19, lopsided.median_gap = 0.035;
  const std::string one_way = train_summary(bug, {lopsided});
  EXPECT_EQ(one_way.find("this grid shows no effect"), std::string::npos) << one_way;
  EXPECT_NE(one_way.find("no verdict, but the seeds moved one way"), std::string::npos) << one_way;
  EXPECT_NE(one_way.find("note: lopsided, the seeds one way but some far beyond the rest, which "
                         "Welch's t does not call, in train.optimizer=sgd: 19 of 24 seeds, median "
                         "gap +0.0350, mean +0.0130, p 0.16 by Welch's t"),
            std::string::npos)
      << one_way;
}

}  // namespace divlab
