#include "analysis/verdicts.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <set>
#include <sstream>

#include "analysis/dose.h"
#include "analysis/stats.h"
#include "common/errors.h"

namespace divlab {

std::ostream& operator<<(std::ostream& out, Outcome o) {
  return out << name_of(o);
}

// The onset band: the variant's seed-mean gap must stay beyond the control spread / sqrt(seeds)
// times the Student t quantile, at the one-sided level of 3 normal standard errors (0.135 %),
// with one degree of freedom per control curve. The spread is estimated from those few curves,
// so a fixed 3 let 1.5 % of injected gaps start their onset long before the gap did (4 control
// curves: P(t_4 > 3) = 2 %); the t quantile keeps that rate at the level meant. On the scale of
// the compared curve, so more seeds sharpen the onset instead of widening the band.
constexpr double kBandNormalStandardErrors = 3.0;
// Practical significance: a gap under 0.1 % of the reference's loss is no divergence however
// consistent it is (Megatron's golden-value checks floor their tolerance at the same 1e-3
// relative). Bit-exact CPU runs make tiny systematic gaps significant: AdamW hides bf16_accum's
// scale error down to a gap of 3e-5 with p = 0.03 on near-uniform data.
constexpr double kMinRelativeGap = 1e-3;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

bool ignored_for_grouping(const std::string& key) {
  for (const char* prefix : {"kernels.", "shadow.", "trace.", "debug."})
    if (key.rfind(prefix, 0) == 0) return true;
  // Where the plug-ins were loaded from is bookkeeping; what they hold is `plugins.build`.
  return key == "train.seed" || key == "train.threads" || key == "plugins";
}

// The config keys that define a cell's group: everything but kernels, seed and bookkeeping.
std::string group_key(const Cell& c) {
  std::string key;
  for (const auto& [k, value] : c.config)
    if (!ignored_for_grouping(k)) key += k + "=" + value + "\n";
  return key;
}

// train.batch x model.seq_len, 0 if the config does not say.
double tokens_per_step(const Cell& c) {
  const auto b = c.config.find("train.batch"), t = c.config.find("model.seq_len");
  return b == c.config.end() || t == c.config.end() ? 0
                                                    : std::stod(b->second) * std::stod(t->second);
}

double tail_mean(const std::vector<double>& x, size_t n) {
  double s = 0;
  const size_t k = std::min(n, x.size());
  for (size_t i = x.size() - k; i < x.size(); ++i) s += x[i];
  return s / double(k);
}

// What distinguishes groups: the grouping keys whose values differ between them.
std::map<std::string, std::string> group_labels(
    const std::map<std::string, std::vector<Cell*>>& groups) {
  std::map<std::string, std::set<std::string>> values;
  for (const auto& [key, cells] : groups)
    for (const auto& [k, v] : cells[0]->config)
      if (!ignored_for_grouping(k)) values[k].insert(v);
  std::map<std::string, std::string> labels;
  for (const auto& [key, cells] : groups) {
    std::string label;
    for (const auto& [k, vs] : values)
      if (vs.size() > 1 && cells[0]->config.count(k))
        label += (label.empty() ? "" : " ") + k + "=" + cells[0]->config.at(k);
    labels[key] = label.empty() ? "all" : label;
  }
  return labels;
}

// The distinguishing keys of a group, one by one (its label is "key=value key=value ...").
std::map<std::string, std::string> group_settings(const Cell& cell, const std::string& label) {
  std::map<std::string, std::string> out;
  std::istringstream words(label);
  for (std::string w; words >> w;) {
    const std::string key = w.substr(0, w.find('='));
    if (cell.config.count(key)) out[key] = cell.config.at(key);
  }
  return out;
}

std::vector<double> absolute(std::vector<double> x) {
  for (double& v : x) v = std::abs(v);
  return x;
}

struct Series {  // one variant's per-seed curves within a group, paired with the reference
  std::vector<double> gaps, areas, val_gaps, doses;
  std::vector<long long> seeds;
  std::vector<std::pair<std::string, std::string>> traces;  // per seed: reference, variant
  std::vector<std::vector<double>> smooth_gap;  // per seed: smooth(variant) - smooth(reference)
  std::vector<std::vector<double>> smooth_ref, smooth_variant;
  std::string nan_where;
  bool any_nan = false;
  int candidate_nan = 0, reference_nan = 0, unpaired = 0;  // seeds not paired, and why
  int candidate_crashed = 0, reference_crashed = 0;
  std::vector<std::string> nan_runs, crashed_runs;
};

std::string cell_name(const Cell& c) {
  const std::string file = c.path.substr(c.path.find_last_of('/') + 1);
  return file.substr(0, file.rfind(".h5"));
}

std::string nan_run(const Cell& c, const char* role) {
  return "cell " + cell_name(c) + " (seed " + std::to_string(c.seed) + ", " + role +
         "): " + c.nan_where;
}
std::string crashed_run(const Cell& c, const char* role) {
  return "cell " + cell_name(c) + " (seed " + std::to_string(c.seed) + ", " + role +
         "): " + c.crash;
}

}  // namespace

SeedSides seed_sides(const std::vector<double>& gaps) {
  const stats::TestResult signs = stats::sign_test(gaps);
  SeedSides s;
  s.median = stats::median(gaps);
  s.positive = int(signs.statistic), s.negative = int(signs.df - signs.statistic);
  s.p_sign = std::min(1.0, 2 * std::min(signs.p_greater, signs.p_less));
  return s;
}

double shift_p(const std::vector<double>& gaps, const std::vector<double>& control_gaps,
               double alpha) {
  const std::vector<double> moved = absolute(gaps), control_moved = absolute(control_gaps);
  const double welch = stats::welch(moved, control_moved).p_greater;
  // The rank-sum test's smallest p is one over the number of splits (C(n + m, n)): below alpha / 2
  // it can reject, and the two tests share alpha; else (3 seeds beside 3 control gaps) Welch alone.
  double splits = 1;
  for (size_t i = 0; i < moved.size(); ++i)
    splits = splits * double(moved.size() + control_moved.size() - i) / double(i + 1);
  if (splits * alpha / 2 <= 1) return welch;
  return std::min(1.0, 2 * std::min(welch, stats::rank_sum(moved, control_moved).p_greater));
}

bool lopsided_gaps(const std::vector<double>& gaps, double p_permutation, double min_gap,
                   double alpha) {
  const double mean = stats::mean(gaps);
  const int sign = mean >= 0 ? 1 : -1;
  const bool every_seed =
      std::all_of(gaps.begin(), gaps.end(), [&](double g) { return sign * g > 0; }) &&
      std::abs(mean) >= min_gap && p_permutation < alpha;
  const SeedSides s = seed_sides(gaps);
  const bool majority_side = s.median > 0 ? s.positive > s.negative : s.negative > s.positive;
  const bool most_seeds = s.p_sign < alpha && std::abs(s.median) >= min_gap && majority_side;
  return every_seed || most_seeds;
}

std::vector<Verdict> compute_verdicts(std::vector<Cell> cells, double alpha) {
  std::map<std::string, std::vector<Cell*>> groups;
  for (auto& c : cells) groups[group_key(c)].push_back(&c);
  const auto labels = group_labels(groups);
  // A group's dose series: its label without the keys that set the tokens per step.
  std::map<std::string, std::string> series_labels;
  for (const auto& [key, label] : labels) {
    std::string kept;
    std::istringstream words(label);
    for (std::string w; words >> w;)
      if (!is_dose_key(w.substr(0, w.find('=')))) kept += (kept.empty() ? "" : " ") + w;
    series_labels[key] = kept.empty() ? "all" : kept;
  }

  std::vector<Verdict> verdicts;
  for (auto& [key, members] : groups) {
    std::map<long long, Cell*> ref;  // seed -> reference cell
    std::map<std::string, std::vector<Cell*>> by_variant;
    std::map<std::pair<std::string, long long>, const Cell*> seen;  // (variant, seed) -> cell
    for (Cell* c : members) {
      // Pooled sweeps (analyze.h) must bring their own seeds: a seed twice would count one
      // run's evidence twice, or pair a candidate with another run's reference.
      const auto [it, fresh] = seen.emplace(std::make_pair(c->variant, c->seed), c);
      if (!fresh)
        throw InputError("seed " + std::to_string(c->seed) + " of " + c->variant + " twice in '" +
                         labels.at(key) + "': " + it->second->path + " and " + c->path +
                         " (pool sweeps run with different seeds: --seed-offset)");
      if (c->variant == "reference")
        ref[c->seed] = c;
      else
        by_variant[c->variant].push_back(c);
    }
    // Smoothing window and tail length: a tenth of the run.
    size_t steps = 0;
    for (const auto& [s, c] : ref) steps = std::max(steps, c->loss.size());
    const size_t window = std::max<size_t>(1, steps / 10);
    std::map<std::string, Series> series;
    for (const auto& [variant, vcells] : by_variant) {
      Series& s = series[variant];
      for (Cell* c : vcells) {
        const auto it = ref.find(c->seed);
        if (c->crashed()) {  // a finding of its own; nothing to pair
          ++s.candidate_crashed;
          s.crashed_runs.push_back(crashed_run(*c, "candidate"));
          continue;
        }
        if (c->status == RunStatus::Nan) {
          s.any_nan = true;
          s.nan_where = c->nan_where;
          ++s.candidate_nan;
          s.nan_runs.push_back(nan_run(*c, "candidate"));
        }
        if (it == ref.end()) {
          ++s.unpaired;
          continue;
        }
        if (it->second->crashed()) {
          ++s.reference_crashed;
          s.crashed_runs.push_back(crashed_run(*it->second, "reference"));
          continue;
        }
        if (it->second->status == RunStatus::Nan) {  // no reference curve to pair this seed with
          ++s.reference_nan;
          s.nan_runs.push_back(nan_run(*it->second, "reference"));
          continue;
        }
        if (c->status == RunStatus::Nan) continue;
        const Cell& r = *it->second;
        const size_t n = std::min(c->loss.size(), r.loss.size());
        std::vector<double> a(c->loss.begin(), c->loss.begin() + long(n)),
            b(r.loss.begin(), r.loss.begin() + long(n));
        s.gaps.push_back(tail_mean(a, window) - tail_mean(b, window));
        s.seeds.push_back(c->seed);
        s.traces.emplace_back(r.path, c->path);
        s.doses.push_back(r.max_row.empty() ? 0 : stats::mean(r.max_row));
        double area = 0;
        for (size_t i = 0; i < n; ++i) area += a[i] - b[i];
        s.areas.push_back(area / double(n));
        const auto sa = stats::smooth(a, int64_t(window)), sb = stats::smooth(b, int64_t(window));
        std::vector<double> g(n);
        for (size_t i = 0; i < n; ++i) g[i] = sa[i] - sb[i];
        s.smooth_gap.push_back(g);
        s.smooth_ref.push_back(sb);
        s.smooth_variant.push_back(sa);
        if (!c->val_loss.empty() && c->val_loss.size() == r.val_loss.size())
          s.val_gaps.push_back(c->val_loss.back() - r.val_loss.back());
      }
    }
    double dose = 0, ref_final = 0, dose_min = kNaN, dose_max = kNaN;
    for (const auto& [seed, c] : ref) {
      const double d = c->max_row.empty() ? 0 : stats::mean(c->max_row);
      dose += d;
      dose_min = std::isnan(dose_min) ? d : std::min(dose_min, d);
      dose_max = std::isnan(dose_max) ? d : std::max(dose_max, d);
      ref_final += tail_mean(c->loss, window);
    }
    dose /= double(std::max<size_t>(1, ref.size()));
    ref_final /= double(std::max<size_t>(1, ref.size()));

    for (const auto& [variant, s] : series) {
      Verdict v;
      v.group = labels.at(key);
      v.settings = group_settings(*members[0], labels.at(key));
      v.variant = variant;
      v.control = by_variant[variant][0]->control;
      v.seeds = int(s.gaps.size());
      v.final_loss_ref = ref_final;
      v.dose = dose;
      v.dose_min = dose_min, v.dose_max = dose_max;
      v.tokens_per_step = tokens_per_step(*members[0]);
      for (const Cell* c : members) {
        const std::string name = c->path.substr(c->path.find_last_of('/') + 1);
        const int number = std::atoi(name.c_str());  // NNNN.h5; 0 for other names
        v.first_cell = v.first_cell < 0 ? number : std::min(v.first_cell, number);
      }
      v.series = series_labels.at(key);
      v.seed_ids = s.seeds, v.seed_gaps = s.gaps, v.seed_doses = s.doses;
      v.seed_traces = s.traces;
      v.gap = stats::mean(s.gaps);
      const stats::Interval ci = stats::mean_interval(s.gaps);
      v.gap_ci_low = ci.low, v.gap_ci_high = ci.high;
      v.area = stats::mean(s.areas);
      v.val_gap = s.val_gaps.empty() ? kNaN : stats::mean(s.val_gaps);
      // The noise floor: every other benign control in the group.
      std::vector<double> control_gaps;
      std::vector<const std::vector<double>*> control_curves;
      for (const auto& [other, os] : series)
        if (other != variant && by_variant[other][0]->control) {
          control_gaps.insert(control_gaps.end(), os.gaps.begin(), os.gaps.end());
          for (const auto& g : os.smooth_gap) control_curves.push_back(&g);
        }
      v.nan_runs = s.nan_runs;
      const int tried = int(by_variant[variant].size());
      if (ref.empty()) {
        v.verdict = Outcome::NoReference;
        v.no_verdict_reason = "the group has no reference run (every kernel at its reference)";
      } else if (s.candidate_crashed > 0) {
        v.verdict = Outcome::Crashed;
        v.no_verdict_reason = "the candidate crashed in " + std::to_string(s.candidate_crashed) +
                              " of " + std::to_string(tried) + " seeds: " + s.crashed_runs[0];
      } else if (s.any_nan) {
        v.verdict = Outcome::Nan;
        v.nan_where = s.nan_where;
        v.no_verdict_reason = "the candidate stopped on NaN in " + std::to_string(s.candidate_nan) +
                              " of " + std::to_string(tried) + " seeds: a finding, not a loss gap";
      } else if (s.gaps.size() < 2) {
        v.verdict =
            s.gaps.empty() && s.reference_nan > 0 ? Outcome::ReferenceNan : Outcome::TooFewSeeds;
        v.no_verdict_reason = std::to_string(s.gaps.size()) + " of " + std::to_string(tried) +
                              " seeds paired (2 needed)";
        if (s.reference_nan > 0)
          v.no_verdict_reason += "; the reference stopped on NaN in " +
                                 std::to_string(s.reference_nan) +
                                 " (lower train.lr, or add train.grad_clip)";
        if (s.unpaired > 0)
          v.no_verdict_reason += "; " + std::to_string(s.unpaired) + " without a reference run";
        if (s.reference_crashed > 0)
          v.no_verdict_reason += "; the reference crashed in " +
                                 std::to_string(s.reference_crashed) + " (" + s.crashed_runs[0] +
                                 ")";
      } else {
        stats::TestResult welch, perm;
        if (control_gaps.size() >= 2) {
          v.compared_with = "controls";
          welch = stats::welch(s.gaps, control_gaps);
          perm = stats::permutation(s.gaps, control_gaps);
          v.hedges_g = stats::hedges_g(s.gaps, control_gaps);
        } else {
          v.compared_with = "zero";
          welch = stats::one_sample(s.gaps);
          perm = stats::permutation(s.gaps, std::vector<double>(s.gaps.size(), 0.0));
          v.hedges_g = kNaN;
        }
        const int sign = v.gap >= 0 ? 1 : -1;
        v.p_welch = sign > 0 ? welch.p_greater : welch.p_less;
        v.p_permutation = sign > 0 ? perm.p_greater : perm.p_less;
        // Onset: the mean gap curve against the control band (see kBandNormalStandardErrors).
        const double band_quantile =
            control_curves.empty()
                ? 0.0
                : stats::student_t_quantile_upper(
                      0.5 * std::erfc(kBandNormalStandardErrors / std::sqrt(2.0)),
                      double(control_curves.size()));
        size_t n = SIZE_MAX;
        for (const auto& g : s.smooth_gap) n = std::min(n, g.size());
        for (const auto* g : control_curves) n = std::min(n, g->size());
        std::vector<double> gap(n, 0.0), band(n, 0.0), spread(n, 0.0);
        const double seeds = double(s.smooth_gap.size());
        for (size_t t = 0; t < n; ++t) {
          for (const auto& g : s.smooth_gap) gap[t] += g[t] / seeds;
          for (const auto& g : s.smooth_gap) spread[t] += (g[t] - gap[t]) * (g[t] - gap[t]);
          spread[t] = std::sqrt(spread[t] / (seeds - 1));  // >= 2 seeds paired here
          double ms = 0;  // mean square of the control gaps: their spread around zero
          for (const auto* g : control_curves) ms += (*g)[t] * (*g)[t];
          if (!control_curves.empty()) ms /= double(control_curves.size());
          band[t] = band_quantile * std::sqrt(ms / double(s.smooth_gap.size()));
        }
        v.onset = control_curves.empty() ? -1 : stats::onset(gap, band, sign, int64_t(window));
        v.gap_curve = gap, v.band_curve = band, v.spread_curve = spread;
        v.control_band = band.empty() ? 0 : band.back();
        v.ref_curve.assign(n, 0.0), v.variant_curve.assign(n, 0.0);
        for (size_t i = 0; i < s.smooth_ref.size(); ++i)
          for (size_t t = 0; t < n; ++t) {
            v.ref_curve[t] += s.smooth_ref[i][t] / double(s.smooth_ref.size());
            v.variant_curve[t] += s.smooth_variant[i][t] / double(s.smooth_variant.size());
          }
        const bool material = std::abs(v.gap) >= kMinRelativeGap * std::abs(v.final_loss_ref);
        const bool significant =
            v.p_welch < alpha && material && (control_curves.empty() || v.onset >= 0);
        v.verdict = !significant ? Outcome::NoDivergence
                    : sign > 0   ? Outcome::Diverged
                                 : Outcome::LowerLoss;
        const double min_gap = kMinRelativeGap * std::abs(v.final_loss_ref);
        const SeedSides sides = seed_sides(s.gaps);
        v.median_gap = sides.median, v.p_sign = sides.p_sign;
        v.seeds_one_way = sides.median >= 0 ? sides.positive : sides.negative;
        v.lopsided = !significant && !v.control && v.p_welch >= alpha &&
                     lopsided_gaps(s.gaps, v.p_permutation, min_gap, alpha);
        v.shift = stats::root_mean_square(s.gaps);
        if (control_gaps.size() >= 2) {
          v.control_shift = stats::root_mean_square(control_gaps);
          v.p_shift = shift_p(s.gaps, control_gaps, alpha);
          // A lopsided row's seeds moved one way: a direction, not noise.
          v.perturbed = !significant && !v.control && !v.lopsided && v.p_shift < alpha &&
                        v.shift >= kMinRelativeGap * std::abs(v.final_loss_ref);
        }
        // An onset is the start of a divergence: none is reported (csv, summary, plots, report)
        // for a gap that did not pass its test.
        if (!significant) v.onset = -1;
      }
      verdicts.push_back(v);
    }
  }
  return verdicts;
}

}  // namespace divlab
