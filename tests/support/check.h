// Test helpers shared by every op's tests: fresh random inputs, central finite differences in
// double, and one normalised error measure with a report of the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/memory.h"

namespace divlab::testing {

// The op context a test calls kernels with: a workspace in the kernels' memory (one per memory,
// kept for the test binary's life), the default stream, per-call seeds from seed 0.
inline OpContext test_context(const MemoryOps& memory = host_memory()) {
  static std::map<const MemoryOps*, OpContextSource> sources;
  return sources.try_emplace(&memory, memory).first->second.next();
}

// A fresh seed per test run (printed on failure), unless DIVLAB_TEST_SEED pins one.
inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("DIVLAB_TEST_SEED")) return uint64_t(std::stoull(s));
    return uint64_t(std::random_device{}()) << 32 | std::random_device{}();
  }();
  return seed;
}

template <class T>
std::vector<T> randn(size_t n, std::mt19937_64& gen, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(gen));
  return v;
}

// max_i |a_i - b_i| / max_i |b_i|: the error relative to the tensor's scale, so tiny elements
// do not dominate. Reports the worst element's index and values.
struct Comparison {
  double error = 0;
  size_t worst = 0;
  double a = 0, b = 0;
  std::string describe(const std::string& what) const {
    std::ostringstream s;
    s.precision(10);
    s << what << ": normalised error " << error << " at element " << worst << " (" << a
      << " vs reference " << b << ")";
    return s.str();
  }
};

template <class A, class B>
Comparison compare(const std::vector<A>& a, const std::vector<B>& b) {
  Comparison c;
  double scale = 0, worst = -1;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(double(b[i])));
  scale = std::max(scale, 1e-300);
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    if (!(d <= worst)) worst = d, c.worst = i, c.a = double(a[i]), c.b = double(b[i]);
  }
  c.error = worst / scale;
  return c;
}

#define EXPECT_CLOSE(actual, expected, tol, what)                                                  \
  do {                                                                                             \
    const auto _c = ::divlab::testing::compare((actual), (expected));                              \
    EXPECT_LT(_c.error, (tol)) << _c.describe(what) << " (seed " << ::divlab::testing::test_seed() \
                               << ")";                                                             \
  } while (0)

// d objective / d x by central differences, perturbing x in place (restored afterwards).
inline std::vector<double> numeric_grad(const std::function<double()>& objective, double* x,
                                        size_t n, double h = 1e-6) {
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = objective();
    x[i] = keep - h;
    const double down = objective();
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}
inline std::vector<double> numeric_grad(const std::function<double()>& objective,
                                        std::vector<double>& x, double h = 1e-6) {
  return numeric_grad(objective, x.data(), x.size(), h);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Gradchecks must reach this (issue #2: max relative error < 1e-6 over all parameters).
constexpr double kGradcheckTol = 1e-6;

}  // namespace divlab::testing
