#include "analysis/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "common/rng.h"

namespace divlab::stats {

double mean(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v;
  return x.empty() ? std::numeric_limits<double>::quiet_NaN() : s / double(x.size());
}

double variance(const std::vector<double>& x) {
  if (x.size() < 2) return 0;
  const double m = mean(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return s / double(x.size() - 1);
}

double root_mean_square(const std::vector<double>& x) {
  double ss = 0;
  for (double v : x) ss += v * v;
  return x.empty() ? 0 : std::sqrt(ss / double(x.size()));
}

namespace {
// Continued fraction for I_x(a, b), valid for x < (a + 1) / (a + b + 2).
double beta_fraction(double a, double b, double x) {
  const double tiny = 1e-300, eps = 1e-15;
  double c = 1, d = 1 - (a + b) * x / (a + 1);
  if (std::abs(d) < tiny) d = tiny;
  d = 1 / d;
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((a + m2 - 1) * (a + m2));
    d = 1 + aa * d, c = 1 + aa / c;
    if (std::abs(d) < tiny) d = tiny;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d, h *= d * c;
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1));
    d = 1 + aa * d, c = 1 + aa / c;
    if (std::abs(d) < tiny) d = tiny;
    if (std::abs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1) < eps) break;
  }
  return h;
}
}  // namespace

double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) +
                                a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1) / (a + b + 2)) return front * beta_fraction(a, b, x) / a;
  return 1 - front * beta_fraction(b, a, 1 - x) / b;
}

double student_t_upper(double t, double df) {
  if (std::isnan(t)) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(t)) return t > 0 ? 0.0 : 1.0;
  const double tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t));
  return t > 0 ? tail : 1 - tail;
}

namespace {
TestResult from_t(double t, double df) {
  TestResult r;
  r.statistic = t, r.df = df;
  r.p_greater = student_t_upper(t, df);
  r.p_less = student_t_upper(-t, df);
  return r;
}
}  // namespace

TestResult welch(const std::vector<double>& a, const std::vector<double>& b) {
  const double va = variance(a) / double(a.size()), vb = variance(b) / double(b.size());
  const double diff = mean(a) - mean(b), se2 = va + vb;
  if (se2 == 0) {  // no spread at all: the difference is exact
    const double t = diff == 0 ? 0 : diff * std::numeric_limits<double>::infinity();
    return from_t(t, double(a.size() + b.size() - 2));
  }
  const double df = se2 * se2 / (va * va / double(a.size() - 1) + vb * vb / double(b.size() - 1));
  return from_t(diff / std::sqrt(se2), df);
}

TestResult one_sample(const std::vector<double>& a) {
  const double se = std::sqrt(variance(a) / double(a.size()));
  const double m = mean(a);
  const double t = se == 0 ? (m == 0 ? 0 : m * std::numeric_limits<double>::infinity()) : m / se;
  return from_t(t, double(a.size() - 1));
}

TestResult rank_sum(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<std::pair<double, size_t>> pool;  // value, position in a then b
  for (size_t i = 0; i < a.size(); ++i) pool.emplace_back(a[i], i);
  for (size_t i = 0; i < b.size(); ++i) pool.emplace_back(b[i], a.size() + i);
  std::sort(pool.begin(), pool.end());
  std::vector<double> rank(pool.size());
  for (size_t i = 0; i < pool.size();) {
    size_t j = i;
    while (j + 1 < pool.size() && pool[j + 1].first == pool[i].first) ++j;
    for (size_t k = i; k <= j; ++k) rank[pool[k].second] = double(i + j) / 2 + 1;
    i = j + 1;
  }
  return permutation(std::vector<double>(rank.begin(), rank.begin() + long(a.size())),
                     std::vector<double>(rank.begin() + long(a.size()), rank.end()));
}

TestResult sign_test(const std::vector<double>& a) {
  int positive = 0, negative = 0;
  for (double v : a) positive += v > 0, negative += v < 0;
  const int n = positive + negative;
  // P(X >= k) for X ~ Binomial(n, 1/2): I_{1/2}(k, n - k + 1), no C(n, i) to overflow.
  auto upper_tail = [n](int k) { return k <= 0 ? 1.0 : incomplete_beta(k, n - k + 1.0, 0.5); };
  TestResult r;
  r.statistic = positive, r.df = n;
  r.p_greater = upper_tail(positive), r.p_less = upper_tail(negative);
  return r;
}

double median(std::vector<double> x) {
  if (x.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t mid = x.size() / 2;
  std::nth_element(x.begin(), x.begin() + std::ptrdiff_t(mid), x.end());
  if (x.size() % 2) return x[mid];
  const double upper = x[mid];
  return 0.5 * (upper + *std::max_element(x.begin(), x.begin() + std::ptrdiff_t(mid)));
}

TestResult permutation(const std::vector<double>& a, const std::vector<double>& b,
                       int64_t max_exact, int samples) {
  std::vector<double> pool = a;
  pool.insert(pool.end(), b.begin(), b.end());
  const size_t n = pool.size(), k = a.size();
  const double total = [&] {
    double s = 0;
    for (double v : pool) s += v;
    return s;
  }();
  auto stat = [&](double sum_a) { return sum_a / double(k) - (total - sum_a) / double(n - k); };
  double observed = 0;
  for (double v : a) observed += v;
  const double obs = stat(observed), tol = 1e-12 * (1 + std::abs(obs));
  // Number of splits: C(n, k).
  double splits = 1;
  for (size_t i = 0; i < k; ++i) splits = splits * double(n - i) / double(i + 1);
  int64_t ge = 0, le = 0, count = 0;
  if (splits <= double(max_exact)) {
    std::vector<bool> pick(n, false);
    std::fill(pick.begin(), pick.begin() + long(k), true);
    do {
      double s = 0;
      for (size_t i = 0; i < n; ++i)
        if (pick[i]) s += pool[i];
      const double v = stat(s);
      ge += v >= obs - tol, le += v <= obs + tol, ++count;
    } while (std::prev_permutation(pick.begin(), pick.end()));
  } else {
    Rng rng(12345);
    std::vector<size_t> idx(n);
    for (int sample = 0; sample < samples; ++sample) {
      for (size_t i = 0; i < n; ++i) idx[i] = i;
      double s = 0;
      for (size_t i = 0; i < k; ++i) {
        std::swap(idx[i], idx[i + rng.below(n - i)]);
        s += pool[idx[i]];
      }
      const double v = stat(s);
      ge += v >= obs - tol, le += v <= obs + tol, ++count;
    }
  }
  TestResult r;
  r.statistic = obs;
  if (splits <= double(max_exact)) {  // every split, the observed one among them: never 0
    r.p_greater = double(ge) / double(count);
    r.p_less = double(le) / double(count);
  } else {  // sampled: the observed split counts as one more (never 0; Phipson & Smyth 2010)
    r.p_greater = double(ge + 1) / double(count + 1);
    r.p_less = double(le + 1) / double(count + 1);
  }
  return r;
}

double hedges_g(const std::vector<double>& a, const std::vector<double>& b) {
  const double na = double(a.size()), nb = double(b.size());
  const double pooled =
      std::sqrt(((na - 1) * variance(a) + (nb - 1) * variance(b)) / (na + nb - 2));
  const double d = (mean(a) - mean(b)) / pooled;
  return d * (1 - 3 / (4 * (na + nb) - 9));
}

int64_t onset(const std::vector<double>& gap, const std::vector<double>& band, int sign,
              int64_t min_run) {
  const int64_t n = int64_t(gap.size());
  int64_t start = n;
  for (int64_t t = n - 1; t >= 0; --t) {
    const double g = sign > 0 ? gap[t] : -gap[t];
    if (!(g > band[t])) break;
    start = t;
  }
  return n - start >= min_run ? (start < n ? start : -1) : -1;
}

std::vector<double> smooth(const std::vector<double>& x, int64_t window) {
  std::vector<double> out(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    s += x[i];
    if (int64_t(i) >= window) s -= x[i - size_t(window)];
    out[i] = s / double(std::min<int64_t>(int64_t(i) + 1, window));
  }
  return out;
}

double student_t_quantile_upper(double p, double df) {
  double lo = 0, hi = 1;
  const bool negative = p > 0.5;
  const double q = negative ? 1 - p : p;
  while (student_t_upper(hi, df) > q) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    (student_t_upper(mid, df) > q ? lo : hi) = mid;
  }
  const double t = 0.5 * (lo + hi);
  return negative ? -t : t;
}

Interval mean_interval(const std::vector<double>& x, double confidence) {
  const double m = mean(x);
  if (x.size() < 2) return {m, m};
  const double df = double(x.size() - 1);
  const double half = student_t_quantile_upper((1 - confidence) / 2, df) *
                      std::sqrt(variance(x) / double(x.size()));
  return {m - half, m + half};
}

}  // namespace divlab::stats
