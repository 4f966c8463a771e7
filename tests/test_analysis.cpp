// The statistics behind verdicts and the dose-response, on inputs with known answers.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "analysis/dose.h"
#include "analysis/stats.h"
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

Verdict point(const std::string& series, const std::string& variant, double tokens, double dose,
              double gap, const std::string& verdict) {
  Verdict v;
  v.series = series, v.variant = variant, v.verdict = verdict;
  v.seeds = 8, v.tokens_per_step = tokens, v.dose = dose;
  v.dose_min = dose * 0.99, v.dose_max = dose * 1.01;
  v.gap = gap, v.gap_ci_low = gap - 0.01, v.gap_ci_high = gap + 0.01, v.control_band = 0.02;
  return v;
}

TEST(DoseResponse, FindsWhereTheVerdictsCrossAndStay) {
  // Given out of order, as groups come from a map: sorted by dose.
  const std::vector<Verdict> v = {point("data=brown", "bug", 262144, 9800, 0.30, "diverged"),
                                  point("data=brown", "bug", 16384, 610, 0.001, "no-divergence"),
                                  point("data=brown", "bug", 65536, 2450, 0.08, "diverged"),
                                  point("data=brown", "bug", 4096, 150, -0.002, "no-divergence")};
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
  const std::vector<Verdict> v = {point("s", "bug", 16384, 610, 0.001, "no-divergence"),
                                  point("s", "bug", 65536, 2450, -0.003, "no-divergence"),
                                  point("s", "bug", 262144, 9800, 0.004, "no-divergence")};
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
  const std::vector<Verdict> v = {point("s", "bug", 16384, 610, 0.001, "no-divergence"),
                                  point("s", "bug", 65536, 2450, 0.05, "diverged"),
                                  point("s", "bug", 262144, 9800, 0.004, "no-divergence")};
  const auto r = dose_responses(v);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(std::isnan(r[0].diverged_from));
}

TEST(DoseResponse, EveryDoseDivergedAndSeriesNeedTwoSizes) {
  const std::vector<Verdict> v = {
      point("a", "bug", 16384, 610, 0.1, "diverged"),
      point("a", "bug", 65536, 2450, 0.2, "diverged"),
      point("a", "ctl", 16384, 610, 0.0, "no-divergence"),
      point("a", "ctl", 65536, 2450, 0.0, "no-divergence"),
      // One size only: not a series.
      point("b", "bug", 65536, 2450, 0.2, "diverged"),
      // Two groups of one size (e.g. two seeds' doses): still not a series.
      point("c", "bug", 65536, 2450, 0.2, "diverged"),
      point("c", "bug", 65536, 2600, 0.2, "diverged")};
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
