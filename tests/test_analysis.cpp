// The statistics behind verdicts, the verdicts themselves (compute_verdicts on synthetic cells)
// and the dose-response, on inputs with known answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "analysis/dose.h"
#include "analysis/stats.h"
#include "analysis/verdicts.h"
#include "common/errors.h"
#include "tests/support/check.h"

namespace divlab {
namespace {

TEST(Stats, StudentTQuantilesMatchTables) {
  // Two-sided 95 % critical values (any statistics table): df 1, 2, 7, 30.
  EXPECT_NEAR(stats::student_t_quantile_upper(0.025, 1), 12.706205, 1e-5);
  EXPECT_NEAR(stats::student_t_quantile_upper(0.025, 2), 4.302653, 1e-6);
  EXPECT_NEAR(stats::student_t_quantile_upper(0.025, 7), 2.364624, 1e-6);
  EXPECT_NEAR(stats::student_t_quantile_upper(0.025, 30), 2.042272, 1e-6);
  EXPECT_NEAR(stats::student_t_quantile_upper(0.975, 7), -2.364624, 1e-6);
  EXPECT_NEAR(stats::student_t_quantile_upper(0.5, 7), 0.0, 1e-9);
}

TEST(Stats, MeanIntervalCoversTheMeanAtItsLevel) {
  // 95 % intervals from 4 normal draws cover the true mean in ~95 % of 4000 trials (binomial
  // sd 0.34 %, so 93.5-96.5 % is over four sd wide).
  std::mt19937_64 gen(testing::test_seed());
  std::normal_distribution<double> d(1.5, 0.3);
  int covered = 0;
  const int trials = 4000;
  for (int i = 0; i < trials; ++i) {
    std::vector<double> x(4);
    for (auto& v : x) v = d(gen);
    const auto ci = stats::mean_interval(x);
    covered += ci.low <= 1.5 && 1.5 <= ci.high;
  }
  EXPECT_NEAR(double(covered) / trials, 0.95, 0.015) << "seed " << testing::test_seed();
  const auto one = stats::mean_interval({2.0});
  EXPECT_EQ(one.low, 2.0);
  EXPECT_EQ(one.high, 2.0);
}

TEST(Stats, PermutationPValuesAreNeverZero) {
  // Two samples that no split of the pool separates further: exactly 1 / C(n, k) when every
  // split is enumerated (the observed one is among them), 1 / (samples + 1) when they are drawn.
  std::mt19937_64 gen(testing::test_seed());
  std::normal_distribution<double> d(0, 0.01);
  std::vector<double> a(16), b(16);
  for (auto& v : a) v = 1 + d(gen);
  for (auto& v : b) v = d(gen);
  const auto sampled = stats::permutation(a, b, 20000, 999);
  EXPECT_DOUBLE_EQ(sampled.p_greater, 1.0 / 1000) << "seed " << testing::test_seed();
  EXPECT_DOUBLE_EQ(sampled.p_less, 1.0);
  const std::vector<double> a3(a.begin(), a.begin() + 3), b3(b.begin(), b.begin() + 3);
  const auto exact = stats::permutation(a3, b3);  // C(6, 3) = 20 splits
  EXPECT_DOUBLE_EQ(exact.p_greater, 1.0 / 20) << "seed " << testing::test_seed();
}

Verdict point(const std::string& series, const std::string& variant, double tokens, double dose,
              double gap, Outcome verdict) {
  Verdict v;
  v.series = series, v.variant = variant, v.verdict = verdict;
  v.seeds = 8, v.tokens_per_step = tokens, v.dose = dose;
  v.dose_min = dose * 0.99, v.dose_max = dose * 1.01;
  v.gap = gap, v.gap_ci_low = gap - 0.01, v.gap_ci_high = gap + 0.01, v.control_band = 0.02;
  return v;
}

// A decaying loss with autocorrelated noise (SGD-like), `steps` long.
std::vector<double> noisy_curve(std::mt19937_64& gen, int steps, double noise) {
  std::normal_distribution<double> d(0, noise);
  std::vector<double> x(steps);
  double wobble = 0;
  for (int t = 0; t < steps; ++t) {
    wobble = 0.95 * wobble + d(gen);
    x[t] = 2.0 + 3.0 * std::exp(-t / 150.0) + wobble;
  }
  return x;
}

Cell synthetic_cell(const std::string& data, const std::string& variant, bool control, int seed,
                    std::vector<double> loss) {
  Cell c;
  c.path = "cells/" + std::to_string(seed) + variant + ".h5";
  c.status = RunStatus::Completed;
  c.config = {{"data", data},
              {"train.seed", std::to_string(seed)},
              {"train.batch", "8"},
              {"model.seq_len", "64"}};
  if (variant != "reference") c.config["kernels.embed_rmsnorm_backward"] = variant;
  c.variant = variant == "reference" ? variant : "embed_rmsnorm_backward=" + variant;
  c.control = control;
  c.seed = seed;
  c.loss = std::move(loss);
  c.max_row = std::vector<double>(c.loss.size(), 100.0);
  return c;
}

// Two data groups x 4 seeds x (reference, a benign control, a candidate); the candidate's loss
// rises by `gap` from step 300 in the "skewed" group only. Controls and candidates drift from
// the reference by a random walk of `drift` per step: 2e-4 ends near 0.005, above the 0.1 %
// materiality floor (0.002 here), so the tests' own false-positive rate shows; 2e-5 stays below.
std::vector<Cell> two_groups(std::mt19937_64& gen, double gap, double drift_per_step) {
  const int steps = 600;
  std::normal_distribution<double> tiny(0, drift_per_step);
  std::vector<Cell> cells;
  for (const std::string data : {"skewed", "flat"})
    for (int seed = 0; seed < 4; ++seed) {
      const auto base = noisy_curve(gen, steps, 0.005);
      for (const auto& [variant, control] : std::vector<std::pair<std::string, bool>>{
               {"reference", false}, {"fp32_reordered", true}, {"bf16_accum", false}}) {
        std::vector<double> loss = base;
        double drift = 0;
        for (int t = 0; t < steps; ++t) {
          if (variant != "reference") drift += tiny(gen);
          loss[t] += drift;
          if (variant == "bf16_accum" && data == "skewed" && t >= 300)
            loss[t] += gap * std::min(1.0, (t - 300) / 100.0);
        }
        cells.push_back(synthetic_cell(data, variant, control, seed, loss));
      }
    }
  return cells;
}

Verdict find_verdict(const std::vector<Verdict>& verdicts, const std::string& group,
                     const std::string& variant) {
  for (const auto& v : verdicts)
    if (v.group == group && v.variant == "embed_rmsnorm_backward=" + variant) return v;
  throw std::runtime_error("no verdict for " + group + " " + variant);
}

TEST(Verdicts, AnInjectedGapDivergesWithItsOnsetAndTheRestHold) {
  std::mt19937_64 gen(testing::test_seed());
  const auto verdicts = compute_verdicts(two_groups(gen, 0.05, 2e-5), 0.05);
  ASSERT_EQ(verdicts.size(), 4u);  // 2 groups x (control, candidate)
  const Verdict bug = find_verdict(verdicts, "data=skewed", "bf16_accum");
  EXPECT_EQ(bug.verdict, Outcome::Diverged) << "seed " << testing::test_seed();
  EXPECT_EQ(bug.compared_with, "controls");
  EXPECT_EQ(bug.seeds, 4);
  EXPECT_NEAR(bug.gap, 0.05, 0.01) << "seed " << testing::test_seed();
  // How early an onset may come is a rate (the next test); a 0.05 gap is past the band at once.
  EXPECT_GE(bug.onset, 0) << "seed " << testing::test_seed();
  EXPECT_LE(bug.onset, 420) << "seed " << testing::test_seed();
  EXPECT_EQ(bug.tokens_per_step, 512);
  EXPECT_EQ(bug.seed_traces.size(), 4u);
  EXPECT_EQ(bug.settings.at("data"), "skewed");
  const Verdict flat = find_verdict(verdicts, "data=flat", "bf16_accum");
  EXPECT_EQ(flat.verdict, Outcome::NoDivergence) << "seed " << testing::test_seed();
  EXPECT_EQ(flat.onset, -1);
  EXPECT_TRUE(find_verdict(verdicts, "data=flat", "fp32_reordered").control);
}

TEST(Verdicts, AnOnsetBeforeTheGapStartsIsAsRareAsItsBandSays) {
  // Before step 300 the candidate's gap is a drift like the controls', so its mean stays past the
  // band from there on (an early onset) at about the band's one-sided level (0.135 %; 19 of
  // 20 000 grids measured). A single grid cannot assert it (that is a 1-in-1000 flake): of 300
  // grids, 5 early onsets would be P < 1e-4 at that rate. The median onset (315 measured) follows
  // the gap's start.
  std::mt19937_64 gen(testing::test_seed());
  const int grids = 300;
  int early = 0;
  std::vector<long long> onsets;
  for (int grid = 0; grid < grids; ++grid) {
    const auto verdicts = compute_verdicts(two_groups(gen, 0.05, 2e-5), 0.05);
    const long long onset = find_verdict(verdicts, "data=skewed", "bf16_accum").onset;
    early += onset >= 0 && onset < 280;
    onsets.push_back(onset);
  }
  EXPECT_LE(early, 4) << "of " << grids << ", seed " << testing::test_seed();
  std::nth_element(onsets.begin(), onsets.begin() + grids / 2, onsets.end());
  EXPECT_GE(onsets[grids / 2], 300) << "seed " << testing::test_seed();
  EXPECT_LE(onsets[grids / 2], 330) << "seed " << testing::test_seed();
}

TEST(Verdicts, WithoutAGapDivergenceIsAsRareAsAlphaSays) {
  // 50 grids without an injected gap, 4 verdicts each: a one-sided test at alpha = 0.05 calls
  // about 5 % of them diverged (binomial sd 1.5 %); 12 % is over four sd above that.
  std::mt19937_64 gen(testing::test_seed());
  int diverged = 0, total = 0;
  for (int grid = 0; grid < 50; ++grid)
    for (const auto& v : compute_verdicts(two_groups(gen, 0.0, 2e-4), 0.05)) {
      diverged += v.verdict == Outcome::Diverged;
      ++total;
    }
  EXPECT_LE(double(diverged) / total, 0.12)
      << diverged << " of " << total << ", seed " << testing::test_seed();
}

TEST(Verdicts, RunsWithoutAPartnerOrThatStoppedOnNanGetNoResult) {
  std::mt19937_64 gen(testing::test_seed());
  std::vector<Cell> cells;
  for (int seed = 0; seed < 3; ++seed) {
    const auto base = noisy_curve(gen, 100, 0.005);
    cells.push_back(synthetic_cell("d", "reference", false, seed, base));
    Cell nan = synthetic_cell("d", "fp16_accum", false, seed, base);
    nan.status = RunStatus::Nan;
    nan.nan_where = "backward embed_rmsnorm_backward layer 0 grad wte.weight, step 7";
    cells.push_back(nan);
  }
  cells.push_back(synthetic_cell("d", "bf16_accum", false, 0, noisy_curve(gen, 100, 0.005)));
  const auto verdicts = compute_verdicts(cells, 0.05);
  ASSERT_EQ(verdicts.size(), 2u);
  const Verdict nan = find_verdict(verdicts, "all", "fp16_accum");
  EXPECT_EQ(nan.verdict, Outcome::Nan);
  EXPECT_EQ(nan.nan_runs.size(), 3u);
  EXPECT_NE(nan.nan_where.find("step 7"), std::string::npos);
  const Verdict one = find_verdict(verdicts, "all", "bf16_accum");
  EXPECT_EQ(one.verdict, Outcome::TooFewSeeds);
  EXPECT_NE(one.no_verdict_reason.find("1 of 1 seeds paired"), std::string::npos)
      << one.no_verdict_reason;
}

// `seeds` seeds of a reference and a benign control that moves each seed's loss by ~1e-3, and
// one candidate per entry of `shifts`, whose loss curve is the reference's moved by shift(seed).
std::vector<Cell> shifted_seeds(std::mt19937_64& gen,
                                const std::map<std::string, std::function<double(int)>>& shifts,
                                int seeds = 8,
                                const std::vector<std::string>& controls = {"fp32_reordered"},
                                double control_sd = 1e-3) {
  std::normal_distribution<double> small(0, control_sd);
  std::vector<Cell> cells;
  for (int seed = 0; seed < seeds; ++seed) {
    const auto base = noisy_curve(gen, 200, 0.005);
    auto shifted = [&](double by) {
      auto loss = base;
      for (double& x : loss) x += by;
      return loss;
    };
    cells.push_back(synthetic_cell("d", "reference", false, seed, base));
    for (const auto& control : controls)
      cells.push_back(synthetic_cell("d", control, true, seed, shifted(small(gen))));
    for (const auto& [variant, shift] : shifts)
      cells.push_back(synthetic_cell("d", variant, false, seed, shifted(shift(seed))));
  }
  return cells;
}

TEST(Verdicts, ACandidateThatMovesEverySeedEitherWayIsPerturbedNotDiverged) {
  // "noisy" moves each seed's loss by 0.04-0.06 with alternating signs (no consistent gap: AdamW
  // at a huge dose), "biased" by +0.04-0.06 in every seed.
  std::mt19937_64 gen(testing::test_seed());
  std::uniform_real_distribution<double> size(0.04, 0.06);
  const auto verdicts = compute_verdicts(
      shifted_seeds(gen, {{"noisy", [&](int seed) { return (seed % 2 ? -1 : 1) * size(gen); }},
                          {"biased", [&](int) { return size(gen); }}}),
      0.05);
  const Verdict noisy = find_verdict(verdicts, "all", "noisy");
  EXPECT_EQ(noisy.verdict, Outcome::NoDivergence) << "seed " << testing::test_seed();
  EXPECT_TRUE(noisy.perturbed) << "p_shift " << noisy.p_shift << ", seed " << testing::test_seed();
  EXPECT_GT(noisy.shift, 0.04);
  EXPECT_LT(noisy.control_shift, 0.005);
  const Verdict biased = find_verdict(verdicts, "all", "biased");
  EXPECT_EQ(biased.verdict, Outcome::Diverged) << "seed " << testing::test_seed();
  EXPECT_FALSE(biased.perturbed);  // a divergence already says more
  EXPECT_FALSE(find_verdict(verdicts, "all", "fp32_reordered").perturbed);
}

// Three seeds moved far past two controls, in no direction, one of them far beyond the other two
// (an embedding gradient accumulated in fp16 under SGD: +0.015, +0.71, -0.024 against controls
// within 6e-6): Welch's t on the |gaps| loses it in the variance the far seed inflates; the
// rank-sum test sees every seed past every control.
TEST(Verdicts, ThreeSeedsFarPastTheControlsOneFarBeyondIsPerturbed) {
  std::mt19937_64 gen(testing::test_seed());
  std::uniform_real_distribution<double> scale(0.8, 1.2);
  const double moved[] = {0.015, 0.71, -0.024};
  const std::vector<Cell> cells =
      shifted_seeds(gen, {{"fp16_accum", [&](int seed) { return moved[seed] * scale(gen); }}}, 3,
                    {"fp32_reordered", "fp64_accum"}, 3e-6);
  const Verdict v = find_verdict(compute_verdicts(cells, 0.05), "all", "fp16_accum");
  EXPECT_EQ(v.verdict, Outcome::NoDivergence) << "seed " << testing::test_seed();
  EXPECT_TRUE(v.perturbed) << "p_shift " << v.p_shift << ", seed " << testing::test_seed();
  EXPECT_NEAR(v.p_shift, 2.0 / 84, 1e-12);  // every seed past all six control gaps, doubled
}

TEST(Verdicts, EverySeedOnOneSideWithOneFarBeyondIsLopsidedNotPerturbed) {
  // "lopsided" raises seven seeds' loss by 0.03-0.05 and seed 5's by 1.0 (a run that blew up):
  // Welch's t cannot call it (p ~ 0.1), the exact permutation test can (p ~ 1 / 12 870). "mixed"
  // is the same but for seed 2, lowered by 0.04.
  std::mt19937_64 gen(testing::test_seed());
  std::uniform_real_distribution<double> size(0.03, 0.05);
  std::vector<double> moved(8);
  for (int seed = 0; seed < 8; ++seed) moved[size_t(seed)] = seed == 5 ? 1.0 : size(gen);
  const auto verdicts = compute_verdicts(
      shifted_seeds(gen,
                    {{"lopsided", [&](int seed) { return moved[size_t(seed)]; }},
                     {"mixed", [&](int seed) { return seed == 2 ? -0.04 : moved[size_t(seed)]; }}}),
      0.05);
  const Verdict lop = find_verdict(verdicts, "all", "lopsided");
  EXPECT_EQ(lop.verdict, Outcome::NoDivergence)
      << "p " << lop.p_welch << ", seed " << testing::test_seed();
  EXPECT_GT(lop.p_welch, 0.05);
  EXPECT_LT(lop.p_permutation, 0.001);
  EXPECT_TRUE(lop.lopsided) << "seed " << testing::test_seed();
  EXPECT_FALSE(lop.perturbed);  // one direction: not noise
  const Verdict mixed = find_verdict(verdicts, "all", "mixed");
  EXPECT_FALSE(mixed.lopsided) << "seed " << testing::test_seed();  // 7 of 8: sign test p 0.07
  EXPECT_EQ(mixed.seeds_one_way, 7);
  EXPECT_FALSE(find_verdict(verdicts, "all", "fp32_reordered").lopsided);
}

TEST(Verdicts, MostSeedsOneWayAndAFewChaoticOnesEitherWayIsLopsided) {
  // As bf16_accum on real text at 1 M tokens a step (docs/findings.md): 19 of 24 seeds' loss up
  // by 0.02-0.08, five chaotic seeds (2, 7, 12, 17, 22) moved by 0.4-0.6, three down and two
  // up, which swamp the mean (Welch p 0.1-0.7 over every draw of the sizes). "balanced" moves
  // every seed the same sizes with the signs of 12 and 12: no side.
  std::mt19937_64 gen(testing::test_seed());
  std::uniform_real_distribution<double> small(0.02, 0.08), large(0.4, 0.6);
  std::vector<double> moved(24);
  for (int seed = 0; seed < 24; ++seed)
    moved[size_t(seed)] = seed % 5 == 2 ? (seed % 2 ? 1 : -1) * large(gen) : small(gen);
  const auto verdicts = compute_verdicts(
      shifted_seeds(
          gen,
          {{"chaotic", [&](int seed) { return moved[size_t(seed)]; }},
           {"balanced",
            [&](int seed) { return (seed % 2 ? 1 : -1) * std::abs(moved[size_t(seed)]); }}},
          24),
      0.05);
  const Verdict v = find_verdict(verdicts, "all", "chaotic");
  EXPECT_EQ(v.verdict, Outcome::NoDivergence)
      << "p " << v.p_welch << ", seed " << testing::test_seed();
  EXPECT_EQ(v.seeds_one_way, 21);  // 19 small and the 2 chaotic seeds moved up
  EXPECT_GT(v.median_gap, 0.02);
  EXPECT_NEAR(v.p_sign, 2 * (2024 + 276 + 24 + 1) / 16777216.0, 1e-15);  // P(X >= 21 | 24)
  EXPECT_TRUE(v.lopsided) << "p_welch " << v.p_welch << ", seed " << testing::test_seed();
  EXPECT_FALSE(v.perturbed);
  const Verdict balanced = find_verdict(verdicts, "all", "balanced");
  EXPECT_EQ(balanced.seeds_one_way, 12);
  EXPECT_DOUBLE_EQ(balanced.p_sign, 1.0);
  EXPECT_FALSE(balanced.lopsided);
}

TEST(Stats, RankSumCountsRanksNotSizes) {
  // Every value of a above every one of b: one split in C(6, 3) = 20, whatever the sizes.
  EXPECT_NEAR(stats::rank_sum({3, 4, 1000}, {0, 1, 2}).p_greater, 1.0 / 20, 1e-15);
  EXPECT_NEAR(stats::rank_sum({3, 4, 5}, {0, 1, 2}).p_greater, 1.0 / 20, 1e-15);
  EXPECT_NEAR(stats::rank_sum({3, 4, 5}, {0, 1, 2}).p_less, 1.0, 1e-15);
  // Ties share their mean rank: {1, 2, 2, 3} ranks {1, 2.5, 2.5, 4}; a = {2, 3} sums 6.5, which
  // 2 of the 6 splits reach.
  EXPECT_NEAR(stats::rank_sum({2, 3}, {1, 2}).p_greater, 2.0 / 6, 1e-15);
  EXPECT_NEAR(stats::rank_sum({1, 1}, {1, 1}).p_greater, 1.0, 1e-15);
  // One value far beyond the rest: Welch's t loses what the ranks keep.
  const std::vector<double> a = {0.015, 0.71, 0.024}, b = {1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6};
  EXPECT_NEAR(stats::rank_sum(a, b).p_greater, 1.0 / 84, 1e-15);
  EXPECT_GT(stats::welch(a, b).p_greater, 0.1);
}

TEST(Stats, SignTestAndMedianMatchHandCounts) {
  // 9 positive, 1 negative, 2 zeros (dropped): P(X >= 9 | 10) = 11 / 1024.
  const std::vector<double> x = {0.3, -5, 0.1, 0.2, 0, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0};
  const auto r = stats::sign_test(x);
  EXPECT_EQ(r.statistic, 9);
  EXPECT_EQ(r.df, 10);
  EXPECT_NEAR(r.p_greater, 11.0 / 1024, 1e-15);
  EXPECT_NEAR(r.p_less, 1023.0 / 1024, 1e-15);
  EXPECT_DOUBLE_EQ(stats::sign_test({}).p_greater, 1.0);
  // 2 000 seeds (C(2000, i) overflows a double): 1 050 positive, P(X >= 1050) = 0.0134121 (scipy)
  std::vector<double> many(2000, -1.0);
  std::fill(many.begin(), many.begin() + 1050, 1.0);
  EXPECT_NEAR(stats::sign_test(many).p_greater, 0.01341207, 1e-8);
  EXPECT_DOUBLE_EQ(stats::median(x), 0.35);  // the middle two of 12: 0.3 and 0.4
  EXPECT_DOUBLE_EQ(stats::median({3, 1, 2}), 2);
  EXPECT_TRUE(std::isnan(stats::median({})));
}

TEST(Verdicts, ASeedTwiceInAGroupIsRefusedNamingBothTraces) {
  // Pooled sweeps (divlab analyze A B --out C) that ran the same seeds would count one run's
  // evidence twice; a candidate's seed twice, or a reference's, is refused.
  std::mt19937_64 gen(testing::test_seed());
  for (const std::string twice : {"reference", "bf16_accum"}) {
    std::vector<Cell> cells;
    for (int seed = 0; seed < 3; ++seed)
      for (const std::string variant : {"reference", "bf16_accum"}) {
        cells.push_back(synthetic_cell("d", variant, false, seed, noisy_curve(gen, 50, 0.005)));
        cells.back().path = "a/cells/" + variant + std::to_string(seed) + ".h5";
      }
    cells.push_back(synthetic_cell("d", twice, false, 1, noisy_curve(gen, 50, 0.005)));
    cells.back().path = "b/cells/0001.h5";
    try {
      compute_verdicts(cells, 0.05);
      ADD_FAILURE() << twice << "'s seed 1 twice was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("seed 1"), std::string::npos) << what;
      EXPECT_NE(what.find("a/cells/" + twice + "1.h5"), std::string::npos) << what;
      EXPECT_NE(what.find("b/cells/0001.h5"), std::string::npos) << what;
    }
  }
}

TEST(DoseResponse, FindsWhereTheVerdictsCrossAndStay) {
  // Given out of order, as groups come from a map: sorted by dose.
  const std::vector<Verdict> v = {
      point("data=brown", "bug", 262144, 9800, 0.30, Outcome::Diverged),
      point("data=brown", "bug", 16384, 610, 0.001, Outcome::NoDivergence),
      point("data=brown", "bug", 65536, 2450, 0.08, Outcome::Diverged),
      point("data=brown", "bug", 4096, 150, -0.002, Outcome::NoDivergence)};
  const auto r = dose_responses(v);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].points.size(), 4u);
  EXPECT_EQ(r[0].points.front().dose, 150);
  EXPECT_EQ(r[0].points.back().dose, 9800);
  EXPECT_EQ(r[0].quiet_up_to, 610);
  EXPECT_EQ(r[0].diverged_from, 2450);
  EXPECT_NE(r[0].summary.find("no divergence up to dose 610, diverged from dose 2450"),
            std::string::npos)
      << r[0].summary;
  EXPECT_NE(dose_markdown(r).find("| 65536 | 2450 (2426-2474) | 8 | +0.0800 |"), std::string::npos)
      << dose_markdown(r);
}

TEST(DoseResponse, AFlatLawHasNoCrossing) {
  const std::vector<Verdict> v = {point("s", "bug", 16384, 610, 0.001, Outcome::NoDivergence),
                                  point("s", "bug", 65536, 2450, -0.003, Outcome::NoDivergence),
                                  point("s", "bug", 262144, 9800, 0.004, Outcome::NoDivergence)};
  const auto r = dose_responses(v);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(std::isnan(r[0].diverged_from));
  EXPECT_TRUE(std::isnan(r[0].quiet_up_to));
  EXPECT_NE(r[0].summary.find("no divergence at any dose measured (610 to 9800)"),
            std::string::npos)
      << r[0].summary;
}

TEST(DoseResponse, ADivergenceThatDoesNotPersistToTheTopIsNoCrossing) {
  // Diverged in the middle only: chance, or a different effect; never called a threshold.
  const std::vector<Verdict> v = {point("s", "bug", 16384, 610, 0.001, Outcome::NoDivergence),
                                  point("s", "bug", 65536, 2450, 0.05, Outcome::Diverged),
                                  point("s", "bug", 262144, 9800, 0.004, Outcome::NoDivergence)};
  const auto r = dose_responses(v);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(std::isnan(r[0].diverged_from));
}

TEST(DoseResponse, EveryDoseDivergedAndSeriesNeedTwoSizes) {
  const std::vector<Verdict> v = {
      point("a", "bug", 16384, 610, 0.1, Outcome::Diverged),
      point("a", "bug", 65536, 2450, 0.2, Outcome::Diverged),
      point("a", "ctl", 16384, 610, 0.0, Outcome::NoDivergence),
      point("a", "ctl", 65536, 2450, 0.0, Outcome::NoDivergence),
      // One size only: not a series.
      point("b", "bug", 65536, 2450, 0.2, Outcome::Diverged),
      // Two groups of one size (e.g. two seeds' doses): still not a series.
      point("c", "bug", 65536, 2450, 0.2, Outcome::Diverged),
      point("c", "bug", 65536, 2600, 0.2, Outcome::Diverged)};
  const auto r = dose_responses(v);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].variant, "bug");
  EXPECT_EQ(r[0].diverged_from, 610);
  EXPECT_TRUE(std::isnan(r[0].quiet_up_to));
  EXPECT_NE(r[0].summary.find("diverged at every dose measured"), std::string::npos);
  EXPECT_EQ(r[1].variant, "ctl");
  EXPECT_NE(dose_table(r).find("dose-response: a, ctl"), std::string::npos);
}

}  // namespace
}  // namespace divlab
