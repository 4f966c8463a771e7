// How often the verdict's two tests (analysis/stats.h: one-sided Welch t, exact permutation of
// the mean difference) reject at alpha = 0.05, on synthetic per-seed gaps shaped like divlab's:
// without an effect (equal spreads, and a noisy candidate ten times the controls' spread: the
// `perturbed` case) and with one (gaps all positive but skewed, as a divergence's are, and a
// plain normal shift), and how often the `lopsided` annotation would be written (every gap above
// zero, the permutation test past alpha, Welch not). The numbers behind docs/analysis.md's choice
// of Welch as the test and the annotation.
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "analysis/stats.h"
#include "bench/int_options.h"

namespace {

using Draw = std::function<double(std::mt19937_64&)>;

Draw normal(double mean, double sd) {
  return [=](std::mt19937_64& g) { return std::normal_distribution<double>(mean, sd)(g); };
}
Draw lognormal(double scale, double sigma) {
  return [=](std::mt19937_64& g) {
    return scale * std::exp(std::normal_distribution<double>(0, sigma)(g));
  };
}

struct Scenario {
  const char* name;
  Draw variant, control;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 400, seed = 1;
  if (const int rc = parse_int_options("bench_verdict_power", argc, argv,
                                       {{"--reps", &reps}, {"--seed", &seed}}))
    return rc;
  const Scenario scenarios[] = {
      {"no effect: both N(0, 1)", normal(0, 1), normal(0, 1)},
      {"no effect: candidate N(0, 10) (perturbed)", normal(0, 10), normal(0, 1)},
      {"effect: 0.1 exp(N(0, 1.5)) (skewed, > 0)", lognormal(0.1, 1.5), normal(0, 1e-3)},
      {"effect: N(0.1, 0.1) vs N(0, 0.05)", normal(0.1, 0.1), normal(0, 0.05)},
  };
  const int sizes[][2] = {{4, 4}, {8, 8}, {4, 8}};
  std::mt19937_64 gen{uint64_t(seed)};
  std::printf(
      "rejections at alpha 0.05, one-sided (mean gap > controls'), %d draws each, seed %d\n", reps,
      seed);
  std::printf("%-44s %6s %8s %8s %12s %9s\n", "gaps", "seeds", "controls", "Welch", "permutation",
              "lopsided");
  for (const auto& s : scenarios)
    for (const auto& size : sizes) {
      int welch = 0, permutation = 0, lopsided = 0;
      for (int r = 0; r < reps; ++r) {
        std::vector<double> a(static_cast<size_t>(size[0])), b(static_cast<size_t>(size[1]));
        for (double& x : a) x = s.variant(gen);
        for (double& x : b) x = s.control(gen);
        const bool by_welch = divlab::stats::welch(a, b).p_greater < 0.05;
        const bool by_permutation = divlab::stats::permutation(a, b).p_greater < 0.05;
        bool all_above = true;
        for (double x : a) all_above &= x > 0;
        welch += by_welch, permutation += by_permutation;
        lopsided += all_above && by_permutation && !by_welch;  // the annotation (materiality aside)
      }
      std::printf("%-44s %6d %8d %8.3f %12.3f %9.3f\n", s.name, size[0], size[1],
                  double(welch) / reps, double(permutation) / reps, double(lopsided) / reps);
    }
  return 0;
}
