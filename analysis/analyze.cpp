#include "analysis/analyze.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "analysis/dose.h"
#include "analysis/stats.h"
#include "common/host.h"
#include "experiments/config.h"
#include "experiments/toml_reader.h"
#include "experiments/trace.h"
#include "experiments/version.h"
#include "kernels/registry.h"

namespace divlab {

// The onset band: how many standard errors of a seed-mean gap (control spread / sqrt(seeds))
// the variant's mean gap must stay beyond. On the scale of the compared curve, so more seeds
// sharpen the onset instead of widening the band.
constexpr double kBandStandardErrors = 3.0;
// Practical significance: a gap under 0.1 % of the reference's loss is no divergence however
// consistent it is (Megatron's golden-value checks floor their tolerance at the same 1e-3
// relative). Bit-exact CPU runs make tiny systematic gaps significant: AdamW hides bf16_accum's
// scale error down to a gap of 3e-5 with p = 0.03 on near-uniform data.
constexpr double kMinRelativeGap = 1e-3;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Cell {
  std::string path, status;
  std::map<std::string, std::string> config;  // resolved key -> value text
  std::vector<double> loss, val_loss, max_row;
  std::string group_key, variant;
  double tokens_per_step = 0;  // train.batch x model.seq_len (0 if the trace does not say)
  std::string nan_where;       // "backward linear_backward layer 1 grad mlp.fc.weight, step 17"
  bool control = false;
  long long seed = 0;
  std::string provenance;  // "divlab COMMIT on HOST (BACKEND)": who wrote the trace
};

std::vector<std::string> list_traces(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir((dir + "/cells").c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 3 && n.substr(n.size() - 3) == ".h5") out.push_back(dir + "/cells/" + n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool ignored_for_grouping(const std::string& key) {
  for (const char* prefix : {"kernels.", "shadow.", "trace.", "debug."})
    if (key.rfind(prefix, 0) == 0) return true;
  return key == "train.seed" || key == "train.threads";
}

Cell load_cell(const std::string& path) {
  Cell c;
  c.path = path;
  const TraceReader r(path);  // InputError if not HDF5
  c.status = r.string_attr("/", "status");
  if (c.status == "nan") {
    auto attr = [&](const char* name) {
      try {
        return r.string_attr("/", name);
      } catch (const InputError&) {
        return std::string("?");
      }
    };
    c.nan_where = attr("nan_pass") + " " + attr("nan_op") + " layer " + attr("nan_layer") + " " +
                  attr("nan_tensor") + ", step " + attr("nan_step");
  }
  c.config =
      read_toml_texts(r.string_attr("/", "config_toml"), "trace '" + path + "': config_toml");
  {
    auto attr = [&](const char* name) {
      try {
        return r.string_attr("/", name);
      } catch (const InputError&) {
        return std::string("?");
      }
    };
    c.provenance =
        "divlab " + attr("git_commit") + " on " + attr("host") + " (" + attr("backend") + ")";
  }
  if (!r.exists("/metrics/loss")) throw InputError("trace '" + path + "': no /metrics/loss");
  c.loss = r.floats("/metrics/loss");
  if (r.exists("/eval/val_loss")) c.val_loss = r.floats("/eval/val_loss");
  if (r.exists("/metrics/max_row_contributions")) {
    for (int64_t v : r.ints("/metrics/max_row_contributions")) c.max_row.push_back(double(v));
  }
  c.seed = std::stoll(c.config.count("train.seed") ? c.config["train.seed"] : "0");
  std::vector<std::string> swapped;
  bool all_benign = true;
  for (const auto& kv : c.config) {
    const std::string &key = kv.first, &value = kv.second;
    if (key.rfind("kernels.", 0) != 0 || value == "reference") continue;
    const std::string op = key.substr(8);
    swapped.push_back(op + "=" + value);
    bool benign = false;
    cpu_catalogue<float>().for_each_op([&](const auto& ops, auto) {
      if (ops.op != op) return;
      if (const auto* e = ops.find(value)) benign = e->doc.benign;
    });
    all_benign = all_benign && benign;
  }
  std::sort(swapped.begin(), swapped.end());
  for (const auto& s : swapped) c.variant += (c.variant.empty() ? "" : "+") + s;
  if (c.variant.empty()) c.variant = "reference";
  c.control = !swapped.empty() && all_benign;
  for (const auto& [key, value] : c.config)
    if (!ignored_for_grouping(key)) c.group_key += key + "=" + value + "\n";
  if (c.config.count("train.batch") && c.config.count("model.seq_len"))
    c.tokens_per_step =
        std::stod(c.config.at("train.batch")) * std::stod(c.config.at("model.seq_len"));
  return c;
}

double tail_mean(const std::vector<double>& x, size_t n) {
  double s = 0;
  const size_t k = std::min(n, x.size());
  for (size_t i = x.size() - k; i < x.size(); ++i) s += x[i];
  return s / double(k);
}

std::string csv_escape(const std::string& s) {
  return s.find_first_of(",\"") == std::string::npos ? s : "\"" + s + "\"";
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

struct Series {  // one variant's per-seed curves within a group, paired with the reference
  std::vector<double> gaps, areas, val_gaps, doses;
  std::vector<long long> seeds;
  std::vector<std::pair<std::string, std::string>> traces;  // per seed: reference, variant
  std::vector<std::vector<double>> smooth_gap;  // per seed: smooth(variant) - smooth(reference)
  std::vector<std::vector<double>> smooth_ref, smooth_variant;
  std::string nan_where;
  bool any_nan = false;
  int candidate_nan = 0, reference_nan = 0, unpaired = 0;  // seeds not paired, and why
  std::vector<std::string> nan_runs;
};

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

std::string cell_name(const Cell& c) {
  const std::string file = c.path.substr(c.path.find_last_of('/') + 1);
  return file.substr(0, file.rfind(".h5"));
}

std::string nan_run(const Cell& c, const char* role) {
  return "cell " + cell_name(c) + " (seed " + std::to_string(c.seed) + ", " + role +
         "): " + c.nan_where;
}

void write_summary(const std::string& path, const std::vector<Verdict>& verdicts) {
  TraceWriter w(path, true);
  using K = TraceWriter::Kind;
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const Verdict& v = verdicts[i];
    const std::string g = "/verdicts/" + std::to_string(i);
    w.attr(g, "group", v.group);
    w.attr(g, "variant", v.variant);
    w.attr(g, "verdict", v.verdict);
    w.attr(g, "control", int64_t(v.control));
    w.attr(g, "seeds", int64_t(v.seeds));
    w.attr(g, "onset_step", int64_t(v.onset));
    w.attr(g, "series", v.series);
    w.attr(g, "no_verdict_reason", v.no_verdict_reason);
    w.attr(g, "nan_runs", join(v.nan_runs, "\n"));
    const std::pair<const char*, double> numbers[] = {{"gap", v.gap},
                                                      {"area", v.area},
                                                      {"val_gap", v.val_gap},
                                                      {"p_welch", v.p_welch},
                                                      {"p_permutation", v.p_permutation},
                                                      {"hedges_g", v.hedges_g},
                                                      {"dose", v.dose},
                                                      {"dose_min", v.dose_min},
                                                      {"dose_max", v.dose_max},
                                                      {"tokens_per_step", v.tokens_per_step},
                                                      {"gap_ci_low", v.gap_ci_low},
                                                      {"gap_ci_high", v.gap_ci_high},
                                                      {"control_band", v.control_band},
                                                      {"final_loss_ref", v.final_loss_ref}};
    for (const auto& [name, value] : numbers) w.attr(g, name, value);
    const std::pair<const char*, const std::vector<double>*> curves[] = {
        {"ref_curve", &v.ref_curve},       {"variant_curve", &v.variant_curve},
        {"gap_curve", &v.gap_curve},       {"band_curve", &v.band_curve},
        {"spread_curve", &v.spread_curve}, {"seed_gaps", &v.seed_gaps},
        {"seed_doses", &v.seed_doses}};
    for (const auto& [name, data] : curves) {
      w.array(g + "/" + name, K::Float64, int64_t(data->size()));
      if (!data->empty()) w.write_array(g + "/" + name, *data);
    }
  }
  w.publish();  // written whole, then renamed into place
}

// analysis/plots.py draws the PNGs; returns "ok" or why not.
std::string run_plots(const std::string& dir) {
  const char* py = std::getenv("DIVLAB_PYTHON");
  const std::string cmd = std::string(py && *py ? py : DIVLAB_DEFAULT_PYTHON) + " " +
                          DIVLAB_SOURCE_DIR "/analysis/plots.py '" + dir + "' > '" + dir +
                          "/plots.log' 2>&1";
  const int rc = std::system(cmd.c_str());
  return rc == 0 ? "ok" : "failed, see " + dir + "/plots.log";
}

std::string fmt(double x, const char* f = "%.3g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// A verdict in plain words with one symbol, for readers of the report.
std::string verdict_words(const std::string& verdict) {
  static const std::map<std::string, std::string> words = {
      {"diverged", "✗ diverged"},
      {"lower-loss", "↓ lower loss"},
      {"no-divergence", "✓ no divergence"},
      {"nan", "✗ stopped on NaN"},
      {"reference-nan", "? reference stopped on NaN"},
      {"too-few-seeds", "? too few seeds"},
      {"no-reference", "? no reference run"}};
  const auto it = words.find(verdict);
  return it == words.end() ? verdict : it->second;
}

// The report's first sentence: which candidates diverged and where, and where the same
// candidate did not (what masked it), or that none did.
std::string headline(const std::vector<Verdict>& verdicts) {
  std::map<std::string, std::vector<const Verdict*>> diverged, held;
  size_t candidates = 0;
  std::set<std::string> groups;
  for (const auto& v : verdicts) {
    groups.insert(v.group);
    if (v.control || v.variant == "reference") continue;
    ++candidates;
    (v.verdict == "diverged" || v.verdict == "nan" ? diverged : held)[v.variant].push_back(&v);
  }
  if (diverged.empty())
    return "No candidate diverged from the reference beyond the benign controls' noise (" +
           std::to_string(candidates) + " candidate rows in " + std::to_string(groups.size()) +
           " groups).";
  auto list = [](const std::vector<const Verdict*>& rows, bool details) {
    std::string out;
    for (size_t i = 0; i < rows.size() && i < 4; ++i) {
      const Verdict& v = *rows[i];
      out += (i ? "; " : "") + (v.group.empty() ? std::string("the grid") : v.group);
      if (details && v.verdict == "nan") out += ": stopped on NaN";
      if (details && v.verdict == "diverged")
        out += ": gap " + fmt(v.gap, "%+.4f") + " nats" +
               (v.onset >= 0 ? ", from step " + std::to_string(v.onset) : "");
    }
    if (rows.size() > 4) out += "; and " + std::to_string(rows.size() - 4) + " more";
    return out;
  };
  std::string out;
  for (const auto& [variant, rows] : diverged) {
    const auto it = held.find(variant);
    const size_t total = rows.size() + (it == held.end() ? 0 : it->second.size());
    out += (out.empty() ? "" : " ") +
           ("`" + variant + "` diverged in " + std::to_string(rows.size()) + " of " +
            std::to_string(total) + " groups (" + list(rows, true) + ")");
    out += it == held.end() ? "." : "; not in " + list(it->second, false) + ".";
  }
  return out;
}

void write_report(const AnalyzeOptions& opt, const std::vector<Verdict>& verdicts,
                  const std::vector<DoseResponse>& responses,
                  const std::vector<std::string>& unfinished, const std::string& plots,
                  const std::set<std::string>& provenance) {
  std::ofstream md(opt.dir + "/report.md");
  std::string written_by;
  for (const auto& p : provenance) written_by += (written_by.empty() ? "" : ", ") + p;
  md << "# divlab analysis: " << opt.dir << "\n\n"
     << headline(verdicts) << "\n\n"
     << "Analysed " << utc_now() << " by divlab " << kDivlabVersion << " (" << kGitCommit << ") on "
     << hostname() << " (" << cpu_model() << "); traces written by " << written_by << ".\n\n";
  if (plots == "ok" && access((opt.dir + "/story.png").c_str(), F_OK) == 0)
    md << "![loss curves of reference, candidates and controls per row, and the dose-response]"
          "(story.png)\n\n";
  md << "Each candidate is paired with the reference run of the same seed; its gap is the mean "
        "of (candidate - reference) training loss over the last 10 % of steps. Gaps are tested "
        "against the benign controls' gaps with a one-sided Welch t-test (alpha = "
     << opt.alpha
     << "; a permutation test is reported beside it), and the onset is the first step after "
        "which the smoothed mean gap stays outside the control band (3 standard errors of a "
        "seed-mean control gap) for "
        "good. A verdict of `diverged` needs both. Method: docs/analysis.md.\n\n"
     << "| group | variant | verdict | seeds | gap (nats) | gap / loss | p (Welch) | p (perm.) | "
        "Hedges g | onset step | val gap (nats) | dose: max additions to one row per step "
        "(seeds' range) |\n"
     << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& v : verdicts)
    md << "| " << v.group << " | `" << v.variant << "`" << (v.control ? " (control)" : "") << " | "
       << verdict_words(v.verdict) << " | " << v.seeds << " | " << fmt(v.gap, "%+.4f") << " | "
       << fmt(100 * v.gap / v.final_loss_ref, "%+.2f%%") << " | " << fmt(v.p_welch) << " | "
       << fmt(v.p_permutation) << " | " << fmt(v.hedges_g, "%.2f") << " | "
       << (v.onset >= 0 && v.verdict == "diverged" ? std::to_string(v.onset) : "-") << " | "
       << (std::isnan(v.val_gap) ? "-" : fmt(v.val_gap, "%+.4f")) << " | " << fmt(v.dose, "%.0f")
       << " (" << fmt(v.dose_min, "%.0f") << "-" << fmt(v.dose_max, "%.0f") << ") |\n";
  bool any_missing = false;
  for (const auto& v : verdicts) any_missing |= !v.no_verdict_reason.empty() || !v.nan_runs.empty();
  if (any_missing) md << "\n## Rows without a verdict, and runs that stopped on NaN\n";
  for (const auto& v : verdicts) {
    if (v.no_verdict_reason.empty() && v.nan_runs.empty()) continue;
    md << "\n`" << v.variant << "` in " << v.group << ": "
       << (v.no_verdict_reason.empty() ? "verdict from the seeds that paired"
                                       : "no verdict: " + v.no_verdict_reason)
       << ".\n";
    for (const auto& run : v.nan_runs) md << "- stopped on NaN: " << run << "\n";
  }
  if (!responses.empty()) md << "\n" << dose_markdown(responses);
  if (!unfinished.empty()) {
    md << "\nLeft out (not finished):\n\n";
    for (const auto& u : unfinished) md << "- " << u << "\n";
  }
  md << "\n## Plots\n\n";
  if (plots != "ok") {
    md << "Not drawn: " << plots << "\n";
    return;
  }
  md << "![gap against dose, per seed](dose.png)\n\n";
  if (access((opt.dir + "/shadow.png").c_str(), F_OK) == 0)
    md << "![shadow error by token-frequency bucket](shadow.png)\n\n";
  for (size_t i = 0; i < verdicts.size(); ++i)
    if (access((opt.dir + "/verdict-" + std::to_string(i) + ".png").c_str(), F_OK) == 0)
      md << "![" << verdicts[i].group << " " << verdicts[i].variant << "](verdict-" << i
         << ".png)\n";
}

}  // namespace

std::vector<Verdict> analyze(const AnalyzeOptions& opt) {
  if (access(opt.dir.c_str(), R_OK) != 0)
    throw InputError("analyze '" + opt.dir + "': no such folder");
  const auto paths = list_traces(opt.dir);
  if (paths.empty())
    throw InputError("analyze '" + opt.dir + "': no traces (expected " + opt.dir + "/cells/*.h5)");
  std::vector<Cell> cells;
  std::vector<std::string> unfinished;
  for (const auto& p : paths) {
    Cell c = load_cell(p);
    if (c.status == "completed" || c.status == "nan")
      cells.push_back(std::move(c));
    else
      unfinished.push_back(p + " (" + c.status + ")");
  }
  std::map<std::string, std::vector<Cell*>> groups;
  for (auto& c : cells) groups[c.group_key].push_back(&c);
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
    for (Cell* c : members) {
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
        if (c->status == "nan") {
          s.any_nan = true;
          s.nan_where = c->nan_where;
          ++s.candidate_nan;
          s.nan_runs.push_back(nan_run(*c, "candidate"));
        }
        if (it == ref.end()) {
          ++s.unpaired;
          continue;
        }
        if (it->second->status == "nan") {  // no reference curve to pair this seed with
          ++s.reference_nan;
          s.nan_runs.push_back(nan_run(*it->second, "reference"));
          continue;
        }
        if (c->status == "nan") continue;
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
      v.tokens_per_step = members[0]->tokens_per_step;
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
        v.verdict = "no-reference";
        v.no_verdict_reason = "the group has no reference run (every kernel at its reference)";
      } else if (s.any_nan) {
        v.verdict = "nan";
        v.nan_where = s.nan_where;
        v.no_verdict_reason = "the candidate stopped on NaN in " + std::to_string(s.candidate_nan) +
                              " of " + std::to_string(tried) + " seeds: a finding, not a loss gap";
      } else if (s.gaps.size() < 2) {
        v.verdict = s.gaps.empty() && s.reference_nan > 0 ? "reference-nan" : "too-few-seeds";
        v.no_verdict_reason = std::to_string(s.gaps.size()) + " of " + std::to_string(tried) +
                              " seeds paired (2 needed)";
        if (s.reference_nan > 0)
          v.no_verdict_reason += "; the reference stopped on NaN in " +
                                 std::to_string(s.reference_nan) +
                                 " (lower train.lr, or add train.grad_clip)";
        if (s.unpaired > 0)
          v.no_verdict_reason += "; " + std::to_string(s.unpaired) + " without a reference run";
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
        // Onset: the mean gap curve against the control band (3 standard errors of a mean gap).
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
          band[t] = kBandStandardErrors * std::sqrt(ms / double(s.smooth_gap.size()));
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
            v.p_welch < opt.alpha && material && (control_curves.empty() || v.onset >= 0);
        v.verdict = !significant ? "no-divergence" : sign > 0 ? "diverged" : "lower-loss";
        // An onset is the start of a divergence: none is reported (csv, summary, plots, report)
        // for a gap that did not pass its test.
        if (!significant) v.onset = -1;
      }
      verdicts.push_back(v);
    }
  }

  // verdicts.csv: one column list drives the header and every row, so they cannot drift; the
  // grid keys that distinguish the groups get a column each after `group` (tidy data).
  {
    std::set<std::string> setting_keys;
    for (const auto& v : verdicts)
      for (const auto& [k, value] : v.settings) setting_keys.insert(k);
    using Column = std::pair<std::string, std::function<std::string(const Verdict&)>>;
    auto num = [](double x) {
      std::ostringstream o;
      o << x;
      return o.str();
    };
    std::vector<Column> columns = {{"group", [](const Verdict& v) { return v.group; }}};
    for (const auto& k : setting_keys)
      columns.push_back({k, [k](const Verdict& v) {
                           const auto it = v.settings.find(k);
                           return it == v.settings.end() ? std::string() : it->second;
                         }});
    const std::vector<Column> results = {
        {"variant", [](const Verdict& v) { return v.variant; }},
        {"control", [](const Verdict& v) { return std::string(v.control ? "1" : "0"); }},
        {"verdict", [](const Verdict& v) { return v.verdict; }},
        {"seeds", [](const Verdict& v) { return std::to_string(v.seeds); }},
        {"final_loss_ref", [&](const Verdict& v) { return num(v.final_loss_ref); }},
        {"gap", [&](const Verdict& v) { return num(v.gap); }},
        {"gap_rel", [&](const Verdict& v) { return num(v.gap / v.final_loss_ref); }},
        {"gap_ci_low", [&](const Verdict& v) { return num(v.gap_ci_low); }},
        {"gap_ci_high", [&](const Verdict& v) { return num(v.gap_ci_high); }},
        {"control_band", [&](const Verdict& v) { return num(v.control_band); }},
        {"area", [&](const Verdict& v) { return num(v.area); }},
        {"val_gap", [&](const Verdict& v) { return num(v.val_gap); }},
        {"p_welch", [&](const Verdict& v) { return num(v.p_welch); }},
        {"p_permutation", [&](const Verdict& v) { return num(v.p_permutation); }},
        {"hedges_g", [&](const Verdict& v) { return num(v.hedges_g); }},
        {"compared_with", [](const Verdict& v) { return v.compared_with; }},
        {"onset_step", [](const Verdict& v) { return std::to_string(v.onset); }},
        {"dose", [&](const Verdict& v) { return num(v.dose); }},
        {"dose_min", [&](const Verdict& v) { return num(v.dose_min); }},
        {"dose_max", [&](const Verdict& v) { return num(v.dose_max); }},
        {"tokens_per_step", [&](const Verdict& v) { return num(v.tokens_per_step); }},
        {"nan_where", [](const Verdict& v) { return v.nan_where; }},
        {"nan_runs", [](const Verdict& v) { return join(v.nan_runs, "; "); }},
        {"no_verdict_reason", [](const Verdict& v) { return v.no_verdict_reason; }}};
    columns.insert(columns.end(), results.begin(), results.end());
    std::ofstream csv(opt.dir + "/verdicts.csv");
    for (size_t i = 0; i < columns.size(); ++i)
      csv << (i ? "," : "") << csv_escape(columns[i].first);
    csv << "\n";
    for (const auto& v : verdicts) {
      for (size_t i = 0; i < columns.size(); ++i)
        csv << (i ? "," : "") << csv_escape(columns[i].second(v));
      csv << "\n";
    }
  }
  // seeds.csv: every paired seed's gap against the dose it received (the per-seed scatter).
  {
    std::ofstream csv(opt.dir + "/seeds.csv");
    csv << "group,variant,control,seed,dose,gap,tokens_per_step\n";
    for (const auto& v : verdicts)
      for (size_t i = 0; i < v.seed_gaps.size(); ++i)
        csv << csv_escape(v.group) << "," << csv_escape(v.variant) << "," << v.control << ","
            << v.seed_ids[i] << "," << v.seed_doses[i] << "," << v.seed_gaps[i] << ","
            << v.tokens_per_step << "\n";
  }
  const auto responses = dose_responses(verdicts);
  {
    std::ofstream csv(opt.dir + "/dose_response.csv");
    csv << "series,variant,control,tokens_per_step,dose,dose_min,dose_max,seeds,gap,gap_ci_low,"
           "gap_ci_high,control_band,p_welch,verdict,quiet_up_to,diverged_from\n";
    for (const auto& r : responses)
      for (const auto& p : r.points)
        csv << csv_escape(r.series) << "," << csv_escape(r.variant) << "," << r.control << ","
            << p.tokens_per_step << "," << p.dose << "," << p.dose_min << "," << p.dose_max << ","
            << p.seeds << "," << p.gap << "," << p.ci_low << "," << p.ci_high << "," << p.band
            << "," << p.p_welch << "," << p.verdict << "," << r.quiet_up_to << ","
            << r.diverged_from << "\n";
  }
  write_summary(opt.dir + "/summary.h5", verdicts);
  const std::string plots = opt.plots ? run_plots(opt.dir) : "not requested (--no-plots)";
  std::set<std::string> provenance;
  for (const auto& c : cells) provenance.insert(c.provenance);
  write_report(opt, verdicts, responses, unfinished, plots, provenance);
  if (opt.verbose) {
    std::printf("%-40s %-40s %-14s %5s %10s %9s %9s %7s %8s\n", "group", "variant", "verdict",
                "seeds", "gap", "p(welch)", "p(perm)", "onset", "dose");
    for (const auto& v : verdicts)
      std::printf("%-40s %-40s %-14s %5d %+10.4f %9.2g %9.2g %7lld %8.0f\n", v.group.c_str(),
                  (v.variant + (v.control ? " [control]" : "")).c_str(), v.verdict.c_str(), v.seeds,
                  v.gap, v.p_welch, v.p_permutation, v.onset, v.dose);
    for (const auto& v : verdicts) {
      if (!v.no_verdict_reason.empty())
        std::printf("%s %s: no verdict: %s\n", v.group.c_str(), v.variant.c_str(),
                    v.no_verdict_reason.c_str());
      for (const auto& run : v.nan_runs) std::printf("  stopped on NaN: %s\n", run.c_str());
    }
    for (const auto& u : unfinished) std::printf("not finished, left out: %s\n", u.c_str());
    std::printf("%s", dose_table(responses).c_str());
    std::printf("wrote %s/verdicts.csv, summary.h5, report.md (plots: %s)\n", opt.dir.c_str(),
                plots.c_str());
  }
  return verdicts;
}

}  // namespace divlab
