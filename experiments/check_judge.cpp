#include "experiments/check_judge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/common/lowp.h"

namespace divlab {

namespace {
constexpr double kBiasTolerance = 1e-3;  // |sum(|v| - |r|)| / sum|r|: systematic shrink or growth
// Fewer values carrying an output's sum (its effective count, (sum|r|)^2 / sum r^2: a softmax
// gradient's row is carried by its target's entry): rounding noise alone reaches 1e-3.
constexpr double kBiasMinValues = 4096;
constexpr double kRowUpdated = 1e-6;  // a row counts as updated above this x the output's max

const char* row_label(RowKey key) {
  return key == RowKey::TokenId ? "token id" : key == RowKey::Position ? "position" : "row";
}
}  // namespace

std::string format_e(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", x);
  return b;
}

// Per output, twice the largest change that rounding the inputs to bf16 makes to the exact
// result, relative to the output's largest value (for an output the op adds into, its largest
// contribution, the scale measure() judges it on). An output with few elements, or one that sums
// terms which cancel, can sit more than 1e-2 from the reference in an honest bf16 kernel (one
// that computes exactly on rounded inputs); this much more error is accepted there. Twice: the
// kernel's own rounding of its output adds to it.
std::vector<double> rounding_allowance(const OpRun& ref, const OpRun& rounded,
                                       const std::vector<std::vector<double>>& initial,
                                       const std::vector<ArgSpec>& written) {
  std::vector<double> allow(ref.outputs.size(), 0.0);
  for (size_t o = 0; o < ref.outputs.size() && o < written.size(); ++o) {
    if (written[o].role == ArgRole::Saved) continue;
    const bool contribution = written[o].role == ArgRole::Accumulate;
    double max_ref = 0, moved = 0;
    // The initial contents of an output the op adds into are the same in both runs, so the
    // difference of the outputs is the difference of the contributions.
    for (size_t i = 0; i < ref.outputs[o].size(); ++i) {
      const double r = ref.outputs[o][i] - (contribution ? initial[o][i] : 0.0);
      max_ref = std::max(max_ref, std::abs(r));
      const double d = std::abs(rounded.outputs[o][i] - ref.outputs[o][i]);
      if (std::isfinite(d)) moved = std::max(moved, d);
    }
    allow[o] = max_ref > 0 ? 2 * moved / max_ref : 0.0;
  }
  return allow;
}

// Which of the reference's outputs the NaNs planted in `x`'s inputs reach in exact arithmetic:
// the reference run twice with each NaN replaced by one finite value and then another, an output
// that moves depends on one. A reference may give NaN further than that: a blocked product
// multiplies the zeros of a causal mask with a later position's NaN (0 x NaN), so a kernel that
// never reads the later position is as right as one that does.
std::vector<std::vector<bool>> nan_reach(const std::string& op, const KernelSet<double>& reference,
                                         const OpInputs& x, const OpShape& s) {
  auto with = [&](double value) {
    OpInputs y = x;
    for (auto& v : y.values)
      for (double& e : v)
        if (std::isnan(e)) e = value;
    return call_op(op, reference, y, s);
  };
  const OpRun a = with(0.75), b = with(-1.25);
  std::vector<std::vector<bool>> reach(a.outputs.size());
  for (size_t o = 0; o < a.outputs.size(); ++o) {
    reach[o].resize(a.outputs[o].size());
    for (size_t i = 0; i < a.outputs[o].size(); ++i)
      reach[o][i] = !(a.outputs[o][i] == b.outputs[o][i]);
  }
  return reach;
}

// Compares the variant's outputs with the reference's: outputs the op adds into on the
// contribution (output minus its initial contents), saved state not at all. `allow` (per
// output, normalised) is error accepted beyond the 1e-2 bar; empty: none. With NaNs in the
// inputs (`nan_reach` non-empty: nan_reach above) a value non-finite in either run is not
// measured, and one the kernel left finite where the reference is not and the NaNs reach is
// counted as hidden.
void measure(ConditionResult& r, const OpRun& got, const OpRun& ref,
             const std::vector<std::vector<double>>& initial, const std::vector<ArgSpec>& written,
             const std::vector<double>& allow, const std::vector<std::vector<bool>>& nan_reach) {
  const bool nan_inputs = !nan_reach.empty();
  double worst_norm = -1;
  size_t pass = 0, total = 0;
  for (size_t o = 0; o < ref.outputs.size() && o < written.size(); ++o) {
    const ArgSpec& spec = written[o];
    if (spec.role == ArgRole::Saved) continue;
    // Bias per output: summed over all of them, a large output (the cross-entropy's losses)
    // would dilute a gradient's systematic shrink below the bar. An output of bf16 values is
    // compared with the reference rounded to bf16: many equal values (a uniform softmax's
    // gradient) share one rounding, which is no shrink or growth of the kernel's.
    const bool contribution = spec.role == ArgRole::Accumulate;
    const auto &gv = got.outputs[o], &rv = ref.outputs[o], &init = initial[o];
    double abs_v = 0, abs_r = 0, sq_r = 0;
    const bool bf16_values =
        spec.role == ArgRole::Output && std::all_of(gv.begin(), gv.end(), [](double v) {
          return !std::isfinite(v) || double(lowp::bf16_rne(float(v))) == v;
        });
    const int64_t n = int64_t(rv.size());
    const int64_t w = spec.size() == n && spec.cols > 0 ? spec.cols : n;
    auto v_at = [&](int64_t i) {
      return contribution ? gv[size_t(i)] - init[size_t(i)] : gv[size_t(i)];
    };
    auto r_at = [&](int64_t i) {
      return contribution ? rv[size_t(i)] - init[size_t(i)] : rv[size_t(i)];
    };
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n; ++i) max_ref = std::max(max_ref, std::abs(r_at(i)));
    for (int64_t row = 0; row * w < n; ++row) {
      double d2 = 0, r2 = 0, row_ref = 0, row_got = 0;
      for (int64_t i = row * w; i < std::min(n, (row + 1) * w); ++i) {
        const double v = v_at(i), b = r_at(i), d = v - b;
        if (nan_inputs && !(std::isfinite(b) && std::isfinite(v))) {
          // NaN spreading further than in the reference is harmless in a step already lost.
          if (std::isfinite(v) && nan_reach[o][size_t(i)] && r.nans_hidden++ == 0)
            r.nan_example = "output " + std::to_string(o) + " (" + row_label(spec.key) + " " +
                            std::to_string(row) + ", col " + std::to_string(i - row * w) +
                            "): " + format_e(v) + " where the reference gives " + format_e(b);
          continue;
        }
        if (std::isfinite(b) && !std::isfinite(v)) r.finite = false;
        d2 += d * d, r2 += b * b;
        row_ref = std::max(row_ref, std::abs(b)), row_got = std::max(row_got, std::abs(v));
        if (std::abs(d) > max_diff || (std::isnan(d) && !std::isnan(max_diff))) {
          max_diff = std::isnan(d) ? NAN : std::abs(d);
          const double norm = max_ref > 0 ? std::abs(d) / max_ref : std::abs(d);
          if (!(norm <= worst_norm)) {
            worst_norm = std::isnan(norm) ? INFINITY : norm;
            r.worst = "output " + std::to_string(o) + " (" + row_label(spec.key) + " " +
                      std::to_string(row) + ", col " + std::to_string(i - row * w) +
                      "): " + format_e(v) + " vs " + format_e(b) + (contribution ? " added" : "");
          }
        }
        pass += std::abs(d) <= 1e-2 + 1e-2 * std::abs(b);
        ++total;
        const double stored = bf16_values ? double(lowp::bf16_rne(float(b))) : b;
        abs_v += std::abs(v), abs_r += std::abs(stored), sq_r += stored * stored;
      }
      const double rel = r2 > 0 ? std::sqrt(d2 / r2) : (d2 > 0 ? INFINITY : 0.0);
      if (!(rel <= r.row_error)) {
        r.row_error = std::isnan(rel) ? INFINITY : std::max(r.row_error, rel);
        r.worst_row = "output " + std::to_string(o) + " (" + row_label(spec.key) + " " +
                      std::to_string(row) + ", its largest value " + format_e(row_ref) +
                      ", the output's " + format_e(max_ref) + ")";
      }
      // Rows: a scatter that skips an id, or writes one it should not, fails by name. Only where
      // the op adds rows in (a gradient by id or position): a forward's row of zeros is a wrong
      // value (an overflow, a padding id skipped), which the error and worst element name.
      if (contribution && spec.rows > 1 && w < n) {
        const bool should = row_ref > kRowUpdated * max_ref, did = row_got > 0;
        const bool wrongly = row_ref == 0 && row_got > kRowUpdated * max_ref;
        if ((should && !did) || wrongly) {
          (should ? r.rows_not_updated : r.rows_wrongly_updated)++;
          if (r.row_example.empty())
            r.row_example = "output " + std::to_string(o) + ", " + row_label(spec.key) + " " +
                            std::to_string(row);
        }
      }
    }
    const double norm = max_ref > 0 ? max_diff / max_ref : max_diff;
    r.norm_error = std::isnan(norm) ? INFINITY : std::max(r.norm_error, norm);
    const double allowed = o < allow.size() ? allow[o] : 0.0;
    r.rounding_allowance = std::max(r.rounding_allowance, allowed);
    r.beyond_allowance = std::isnan(norm) ? INFINITY : std::max(r.beyond_allowance, norm - allowed);
    const bool enough = sq_r > 0 && abs_r * abs_r >= kBiasMinValues * sq_r;
    const double bias = enough ? (abs_v - abs_r) / abs_r : 0.0;
    // Non-finite outputs are reported as such; the output furthest from unbiased is the row's.
    if (std::isfinite(bias) && std::abs(bias) > std::abs(r.bias)) r.bias = bias;
  }
  r.verifier_pass = total ? double(pass) / double(total) : 1.0;
}

void judge(ConditionResult& r) {
  if (r.failed) return;  // threw
  if (!r.stray_writes.empty())
    r.failed = true, r.why = "writes outside its outputs (" + r.stray_writes[0] + ")";
  else if (r.nans_hidden > 0)
    r.failed = true, r.why = "NaN hidden: " + std::to_string(r.nans_hidden) +
                             " output value(s) finite where the reference, fed the inputs' "
                             "NaNs, is not, e.g. " +
                             r.nan_example +
                             " (a kernel that drops NaNs makes a run that blew up look healthy)";
  else if (!r.finite)
    r.failed = true,
    r.why =
        "non-finite output where the reference is finite (an overflow, or an output value "
        "or scratch left unwritten or read before it is written: outputs and new scratch start "
        "as NaN)";
  else if (r.rows_not_updated > 0)
    r.failed = true, r.why = "row never updated: " + std::to_string(r.rows_not_updated) +
                             " row(s) the reference adds to, e.g. " + r.row_example;
  else if (r.rows_wrongly_updated > 0)
    r.failed = true,
    r.why = "row updated that should not be: " + std::to_string(r.rows_wrongly_updated) +
            " row(s), e.g. " + r.row_example;
  else if (r.beyond_allowance > kTolerance)
    r.failed = true, r.why = "error " + format_e(r.norm_error) + " > 1e-2" +
                             (r.rounding_allowance > 0 ? " + " + format_e(r.rounding_allowance) +
                                                             " (bf16 input rounding)"
                                                       : "");
  else if (std::abs(r.bias) > kBiasTolerance)
    r.failed = true, r.why = std::string("biased: outputs ") + (r.bias < 0 ? "shrink" : "grow") +
                             " by " + format_e(std::abs(r.bias));
}

bool bitwise_equal(const OpRun& a, const OpRun& b) {
  if (a.outputs.size() != b.outputs.size()) return false;
  // Bit patterns, not values: NaN != NaN would call a NaN-producing kernel unrepeatable (its
  // NaNs are reported as non-finite output instead).
  for (size_t o = 0; o < a.outputs.size(); ++o)
    if (a.outputs[o].size() != b.outputs[o].size() ||
        std::memcmp(a.outputs[o].data(), b.outputs[o].data(),
                    a.outputs[o].size() * sizeof(double)) != 0)
      return false;
  return true;
}

}  // namespace divlab
