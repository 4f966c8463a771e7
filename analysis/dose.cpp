#include "analysis/dose.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>

namespace divlab {

namespace {
std::string num(double x, const char* f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string describe(const DoseResponse& r) {
  const auto& pts = r.points;
  const std::string lo = num(pts.front().dose, "%.0f"), hi = num(pts.back().dose, "%.0f");
  if (!std::isnan(r.diverged_from) && std::isnan(r.quiet_up_to))
    return "diverged at every dose measured (" + lo + " to " + hi + ")";
  if (!std::isnan(r.diverged_from))
    return "no divergence up to dose " + num(r.quiet_up_to, "%.0f") + ", diverged from dose " +
           num(r.diverged_from, "%.0f") + " on (measured " + lo + " to " + hi + ")";
  // No crossing: say whether the gap at least grows toward the band.
  const DosePoint& top = pts.back();
  std::string s = "no divergence at any dose measured (" + lo + " to " + hi + ")";
  if (top.band > 0)
    s += "; at the highest dose the gap is " + num(top.gap, "%+.4f") + " (95 % CI " +
         num(top.ci_low, "%+.4f") + " to " + num(top.ci_high, "%+.4f") +
         ") against a control band of " + num(top.band, "%.4f");
  return s;
}
}  // namespace

bool is_dose_key(const std::string& key) {
  return key == "train.batch" || key == "model.seq_len";
}

std::vector<DoseResponse> dose_responses(const std::vector<Verdict>& verdicts) {
  // (series, variant) -> points, in the order the series first appear.
  std::vector<DoseResponse> out;
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (const auto& v : verdicts) {
    if (v.seeds < 1 || v.tokens_per_step <= 0) continue;
    const auto key = std::make_pair(v.series, v.variant);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, out.size()).first;
      DoseResponse r;
      r.series = v.series, r.variant = v.variant, r.control = v.control;
      out.push_back(std::move(r));
    }
    DosePoint p;
    p.tokens_per_step = v.tokens_per_step;
    p.dose = v.dose, p.dose_min = v.dose_min, p.dose_max = v.dose_max;
    p.seeds = v.seeds;
    p.gap = v.gap, p.ci_low = v.gap_ci_low, p.ci_high = v.gap_ci_high;
    p.band = v.control_band, p.p_welch = v.p_welch, p.verdict = v.verdict;
    out[it->second].points.push_back(p);
  }
  std::vector<DoseResponse> series;
  for (auto& r : out) {
    std::vector<double> sizes;
    for (const auto& p : r.points) sizes.push_back(p.tokens_per_step);
    std::sort(sizes.begin(), sizes.end());
    if (std::unique(sizes.begin(), sizes.end()) - sizes.begin() < 2) continue;
    std::sort(r.points.begin(), r.points.end(),
              [](const DosePoint& a, const DosePoint& b) { return a.dose < b.dose; });
    // The diverged run of points at the top of the range, if any.
    size_t first = r.points.size();
    while (first > 0 && r.points[first - 1].verdict == Outcome::Diverged) --first;
    if (first < r.points.size()) {
      r.diverged_from = r.points[first].dose;
      if (first > 0) r.quiet_up_to = r.points[first - 1].dose;
    }
    r.summary = describe(r);
    series.push_back(std::move(r));
  }
  return series;
}

std::string dose_markdown(const std::vector<DoseResponse>& responses) {
  if (responses.empty()) return "";
  std::ostringstream md;
  md << "## Dose-response\n\n"
        "Dose = most additions one embedding-gradient row received in a step (the hottest "
        "token's count in the step's batch, micro-batches counted together as they add into "
        "the rows the one before left; with data-parallel ranks, in one rank's shard), mean "
        "over seeds with the seeds' range. Gap = final loss gap (variant - reference, nats) with "
        "its 95 % confidence interval over "
        "seeds; band = the control band at the last step (a t quantile of standard errors of a "
        "seed-mean control gap): the noise floor the gap must leave. Per-seed gaps: seeds.csv.\n\n";
  for (const auto& r : responses) {
    md << "### " << r.series << ": `" << r.variant << "`" << (r.control ? " (control)" : "")
       << "\n\n"
       << r.summary << ".\n\n"
       << "| tokens per step | dose (range) | seeds | gap | 95 % CI | band | p (Welch) | verdict "
          "|\n"
       << "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const auto& p : r.points)
      md << "| " << num(p.tokens_per_step, "%.0f") << " | " << num(p.dose, "%.0f") << " ("
         << num(p.dose_min, "%.0f") << "-" << num(p.dose_max, "%.0f") << ") | " << p.seeds << " | "
         << num(p.gap, "%+.4f") << " | " << num(p.ci_low, "%+.4f") << " to "
         << num(p.ci_high, "%+.4f") << " | " << (p.band > 0 ? num(p.band, "%.4f") : "-") << " | "
         << num(p.p_welch, "%.2g") << " | " << p.verdict << " |\n";
    md << "\n";
  }
  return md.str();
}

std::string dose_table(const std::vector<DoseResponse>& responses) {
  std::ostringstream t;
  for (const auto& r : responses) {
    t << "dose-response: " << r.series << ", " << r.variant << (r.control ? " [control]" : "")
      << "\n";
    t << "  tokens/step      dose (seeds' range)   seeds        gap            95 % CI"
         "       band  p(welch)  verdict\n";
    for (const auto& p : r.points) {
      char line[256];
      std::snprintf(
          line, sizeof line,
          "  %11.0f  %8.0f (%6.0f-%6.0f)  %5d  %+9.4f  %+9.4f to %+8.4f  %9.4f  %8.2g  %s\n",
          p.tokens_per_step, p.dose, p.dose_min, p.dose_max, p.seeds, p.gap, p.ci_low, p.ci_high,
          p.band, p.p_welch, name_of(p.verdict));
      t << line;
    }
    t << "  " << r.summary << "\n";
  }
  return t.str();
}

}  // namespace divlab
