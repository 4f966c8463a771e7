// The statistics behind a verdict, written out so they can be checked against references.
#pragma once

#include <cstdint>
#include <vector>

namespace divlab::stats {

double mean(const std::vector<double>& x);
double variance(const std::vector<double>& x);          // unbiased (n - 1); 0 for n < 2
double root_mean_square(const std::vector<double>& x);  // around zero; 0 for no values

// Regularised incomplete beta I_x(a, b) (continued fraction, Lentz's method).
double incomplete_beta(double a, double b, double x);
// P(T > t) for Student's t with `df` degrees of freedom.
double student_t_upper(double t, double df);
// The t with P(T > t) = p (0 < p < 1), by bisection on student_t_upper.
double student_t_quantile_upper(double p, double df);

struct Interval {
  double low = 0, high = 0;
};
// Two-sided confidence interval of the mean of x (t-interval; needs >= 2 values, else the
// mean alone).
Interval mean_interval(const std::vector<double>& x, double confidence = 0.95);

struct TestResult {
  double statistic = 0, df = 0;
  double p_greater = 1;  // H1: mean(a) > mean(b)
  double p_less = 1;     // H1: mean(a) < mean(b)
};
// Welch's unequal-variance t-test of a against b (each needs >= 2 values).
TestResult welch(const std::vector<double>& a, const std::vector<double>& b);
// One-sample t-test of a against 0 (needs >= 2 values).
TestResult one_sample(const std::vector<double>& a);
// Permutation test of mean(a) - mean(b): exact over all splits when there are at most
// `max_exact` of them, else `samples` random splits with a fixed seed, the observed split counted
// among them (so a p-value is at least 1 / (samples + 1), never 0).
TestResult permutation(const std::vector<double>& a, const std::vector<double>& b,
                       int64_t max_exact = 20000, int samples = 20000);
// Wilcoxon-Mann-Whitney rank-sum test of a against b: the permutation test above on the values'
// ranks in a and b together (ties given their mean rank), so exact over at most `max_exact`
// splits. A value far beyond the rest counts as one rank, not as its size.
TestResult rank_sum(const std::vector<double>& a, const std::vector<double>& b);
// Exact sign test of a's values against zero, zeros dropped: with X ~ Binomial(nonzero, 1/2),
// p_greater = P(X >= positives), p_less = P(X >= negatives); statistic = positives, df =
// nonzero values. It sees only which side each value lies on, so no few values far out,
// either way, can outweigh the rest (as they can a mean).
TestResult sign_test(const std::vector<double>& a);
// The median (the mean of the middle two for an even count); NaN for no values.
double median(std::vector<double> x);
// Hedges' g: the mean difference in pooled standard deviations, small-sample corrected.
double hedges_g(const std::vector<double>& a, const std::vector<double>& b);

// First index from which `gap` stays above `band` (or below -band, for sign < 0) to the end;
// -1 if it never does. Needs the last `min_run` points (at least) outside the band.
int64_t onset(const std::vector<double>& gap, const std::vector<double>& band, int sign,
              int64_t min_run);

// Trailing moving average over `window` points.
std::vector<double> smooth(const std::vector<double>& x, int64_t window);

}  // namespace divlab::stats
