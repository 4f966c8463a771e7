#include "analysis/report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "common/files.h"
#include "common/host.h"
#include "common/version.h"
#include "io/trace.h"

namespace divlab {

namespace {

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

std::string fmt(double x, const char* f = "%.3g") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// A verdict in plain words with one symbol, for readers of the report. A switch, so that an
// outcome added without its words fails to build (-Wswitch), whatever the enumerators' order.
const char* verdict_words(Outcome o) {
  switch (o) {
    case Outcome::Diverged:
      return "✗ diverged";
    case Outcome::LowerLoss:
      return "↓ lower loss";
    case Outcome::NoDivergence:
      return "✓ no divergence";
    case Outcome::Crashed:
      return "✗ crashed";
    case Outcome::Nan:
      return "✗ stopped on NaN";
    case Outcome::ReferenceNan:
      return "? reference stopped on NaN";
    case Outcome::TooFewSeeds:
      return "? too few seeds";
    case Outcome::NoReference:
      return "? no reference run";
  }
  return name_of(o);
}

// The report's first sentence: which candidates diverged and where, and where the same
// candidate did not (what masked it), or that none did; then any benign control that did not
// behave as one.
std::string headline(const std::vector<Verdict>& verdicts) {
  std::map<std::string, std::vector<const Verdict*>> diverged, held, unruly_controls;
  size_t candidates = 0;
  std::set<std::string> groups;
  for (const auto& v : verdicts) {
    groups.insert(v.group);
    const bool failed = v.verdict == Outcome::Diverged || v.verdict == Outcome::Nan ||
                        v.verdict == Outcome::Crashed;
    if (v.control && failed) unruly_controls[v.variant].push_back(&v);
    if (v.control || v.variant == "reference") continue;
    ++candidates;
    (failed ? diverged : held)[v.variant].push_back(&v);
  }
  auto list = [](const std::vector<const Verdict*>& rows, bool details) {
    std::string out;
    for (size_t i = 0; i < rows.size() && i < 4; ++i) {
      const Verdict& v = *rows[i];
      out += (i ? "; " : "") + (v.group.empty() ? std::string("the grid") : v.group);
      if (details && v.verdict == Outcome::Nan) out += ": stopped on NaN";
      if (details && v.verdict == Outcome::Crashed) out += ": crashed";
      if (details && v.verdict == Outcome::Diverged)
        out += ": gap " + fmt(v.gap, "%+.4f") + " nats" +
               (v.onset >= 0 ? ", from step " + std::to_string(v.onset) : "");
    }
    if (rows.size() > 4) out += "; and " + std::to_string(rows.size() - 4) + " more";
    return out;
  };
  // A declared control is trusted to differ from the reference by rounding alone: one that
  // diverged (a plug-in flagged DIVLAB_CONTROL that is not one) widens the noise floor every
  // other variant of its groups is judged against, so a masked candidate would read as held.
  std::string controls;
  for (const auto& [variant, rows] : unruly_controls)
    controls += " Benign control `" + variant + "` itself diverged in " +
                std::to_string(rows.size()) + (rows.size() == 1 ? " group" : " groups") + " (" +
                list(rows, true) +
                "): benign controls almost never do (3 of 1920 control verdicts in the "
                "analysis's self-test, docs/analysis.md), so it may be no control, and its gaps "
                "widen the noise floor the other variants of its groups are judged against "
                "(`divlab check` it, or rerun on fresh seeds).";
  if (candidates == 0)
    return std::string("This grid swaps in no candidate kernel (") +
           (verdicts.empty() ? "every run has the reference kernels"
                             : "only the reference and benign controls") +
           "): nothing to judge against the reference." + controls;
  if (diverged.empty())
    return "No candidate diverged from the reference beyond the benign controls' noise (" +
           std::to_string(candidates) + " candidate rows in " + std::to_string(groups.size()) +
           " groups)." + controls;
  std::string out;
  for (const auto& [variant, rows] : diverged) {
    const auto it = held.find(variant);
    const size_t total = rows.size() + (it == held.end() ? 0 : it->second.size());
    out += (out.empty() ? "" : " ") +
           ("`" + variant + "` diverged in " + std::to_string(rows.size()) + " of " +
            std::to_string(total) + " groups (" + list(rows, true) + ")");
    out += it == held.end() ? "." : "; not in " + list(it->second, false) + ".";
  }
  return out + controls;
}

}  // namespace

std::string shift_words(const Verdict& v) {
  // Past 1000x the ratio only says the controls are near bit-exact (571 538x read like a measure).
  const double times = v.control_shift > 0 ? v.shift / v.control_shift : INFINITY;
  const std::string ratio = times < 1000          ? fmt(times, "%.0f") + "x as far as the controls"
                            : v.control_shift > 0 ? "over 1000x as far as the controls"
                                                  : "where the controls did not move theirs";
  return "each seed's final loss moved " + ratio + " (root mean square " + fmt(v.shift) +
         " against " + fmt(v.control_shift) + ", p = " + fmt(v.p_shift) + ")";
}

std::string perturbed_words(const Verdict& v) {
  return "`" + v.variant + "` in " + v.group + ": perturbed. No consistent gap (" +
         fmt(v.gap, "%+.4f") + ", p = " + fmt(v.p_welch) + "), yet " + shift_words(v) +
         ": it changes every run, in no consistent direction (an optimizer that absorbs a "
         "kernel's bias, as AdamW does, still carries its noise).";
}

std::string lopsided_words(const Verdict& v) {
  const bool every = v.seeds_one_way == v.seeds;
  return "`" + v.variant + "` in " + v.group + ": lopsided. " +
         (every ? "Every seed's gap is on one side (" : "Most seeds' gaps are on one side (") +
         std::to_string(v.seeds_one_way) + " of " + std::to_string(v.seeds) + ", median " +
         fmt(v.median_gap, "%+.4f") + ", mean " + fmt(v.gap, "%+.4f") +
         "; sign test p = " + fmt(v.p_sign) + "), yet Welch's t gives p = " + fmt(v.p_welch) +
         " (the permutation test " + fmt(v.p_permutation) + "): " +
         (every ? "a seed far beyond the rest widens" : "seeds far out, either way, widen") +
         " the t-test's spread. No verdict; more seeds (divlab sweep --seed-offset, then analyze "
         "both folders) settle it.";
}

void write_summary(const std::string& path, const std::vector<Verdict>& verdicts) try {
  TraceWriter w(path, true);
  using K = TraceWriter::Kind;
  // The group is there even without rows (a grid of reference runs): readers need no special case.
  w.attr("/verdicts", "count", int64_t(verdicts.size()));
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const Verdict& v = verdicts[i];
    const std::string g = "/verdicts/" + std::to_string(i);
    w.attr(g, "group", v.group);
    w.attr(g, "variant", v.variant);
    w.attr(g, "verdict", std::string(name_of(v.verdict)));
    w.attr(g, "control", int64_t(v.control));
    w.attr(g, "seeds", int64_t(v.seeds));
    w.attr(g, "onset_step", int64_t(v.onset));
    w.attr(g, "perturbed", int64_t(v.perturbed));
    w.attr(g, "lopsided", int64_t(v.lopsided));
    w.attr(g, "seeds_one_way", int64_t(v.seeds_one_way));
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
                                                      {"shift", v.shift},
                                                      {"control_shift", v.control_shift},
                                                      {"p_shift", v.p_shift},
                                                      {"median_gap", v.median_gap},
                                                      {"p_sign", v.p_sign},
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
  w.publish();                      // written whole, then renamed into place
} catch (const TraceWriteError&) {  // the writer has removed its partial file
  throw InputError("analyze: file '" + path +
                   "': cannot be written (disk full, or the folder unwritable)");
}

void write_tables(const std::string& dir, const std::vector<Verdict>& verdicts,
                  const std::vector<DoseResponse>& responses) {
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
        {"verdict", [](const Verdict& v) { return std::string(name_of(v.verdict)); }},
        {"seeds", [](const Verdict& v) { return std::to_string(v.seeds); }},
        {"final_loss_ref", [&](const Verdict& v) { return num(v.final_loss_ref); }},
        {"gap", [&](const Verdict& v) { return num(v.gap); }},
        {"gap_rel", [&](const Verdict& v) { return num(v.gap / v.final_loss_ref); }},
        {"gap_ci_low", [&](const Verdict& v) { return num(v.gap_ci_low); }},
        {"gap_ci_high", [&](const Verdict& v) { return num(v.gap_ci_high); }},
        {"control_band", [&](const Verdict& v) { return num(v.control_band); }},
        {"shift", [&](const Verdict& v) { return num(v.shift); }},
        {"control_shift", [&](const Verdict& v) { return num(v.control_shift); }},
        {"p_shift", [&](const Verdict& v) { return num(v.p_shift); }},
        {"perturbed", [](const Verdict& v) { return std::string(v.perturbed ? "1" : "0"); }},
        {"lopsided", [](const Verdict& v) { return std::string(v.lopsided ? "1" : "0"); }},
        {"median_gap", [&](const Verdict& v) { return num(v.median_gap); }},
        {"seeds_one_way", [](const Verdict& v) { return std::to_string(v.seeds_one_way); }},
        {"p_sign", [&](const Verdict& v) { return num(v.p_sign); }},
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
    std::ostringstream csv;
    for (size_t i = 0; i < columns.size(); ++i)
      csv << (i ? "," : "") << csv_escape(columns[i].first);
    csv << "\n";
    for (const auto& v : verdicts) {
      for (size_t i = 0; i < columns.size(); ++i)
        csv << (i ? "," : "") << csv_escape(columns[i].second(v));
      csv << "\n";
    }
    write_output_file(dir + "/verdicts.csv", csv.str(), "analyze: file");
  }
  // seeds.csv: every paired seed's gap against the dose it received (the per-seed scatter).
  {
    std::ostringstream csv;
    csv << "group,variant,control,seed,dose,gap,tokens_per_step\n";
    for (const auto& v : verdicts)
      for (size_t i = 0; i < v.seed_gaps.size(); ++i)
        csv << csv_escape(v.group) << "," << csv_escape(v.variant) << "," << v.control << ","
            << v.seed_ids[i] << "," << v.seed_doses[i] << "," << v.seed_gaps[i] << ","
            << v.tokens_per_step << "\n";
    write_output_file(dir + "/seeds.csv", csv.str(), "analyze: file");
  }
  {
    std::ostringstream csv;
    csv << "series,variant,control,tokens_per_step,dose,dose_min,dose_max,seeds,gap,gap_ci_low,"
           "gap_ci_high,control_band,p_welch,verdict,quiet_up_to,diverged_from\n";
    for (const auto& r : responses)
      for (const auto& p : r.points)
        csv << csv_escape(r.series) << "," << csv_escape(r.variant) << "," << r.control << ","
            << p.tokens_per_step << "," << p.dose << "," << p.dose_min << "," << p.dose_max << ","
            << p.seeds << "," << p.gap << "," << p.ci_low << "," << p.ci_high << "," << p.band
            << "," << p.p_welch << "," << p.verdict << "," << r.quiet_up_to << ","
            << r.diverged_from << "\n";
    write_output_file(dir + "/dose_response.csv", csv.str(), "analyze: file");
  }
  write_summary(dir + "/summary.h5", verdicts);
}

void write_report(const ReportContext& ctx, const std::vector<Verdict>& verdicts,
                  const std::vector<DoseResponse>& responses) {
  std::ostringstream md;
  std::string written_by;
  for (const auto& p : ctx.provenance) written_by += (written_by.empty() ? "" : ", ") + p;
  md << "# divlab analysis: " << ctx.dir << "\n\n"
     << headline(verdicts) << "\n\n"
     << "Analysed " << utc_now() << " by divlab " << kDivlabVersion << " (" << kGitCommit << ") on "
     << hostname() << " (" << cpu_model() << "); traces written by " << written_by << ".\n\n";
  if (ctx.sources.size() == 1) md << "Cells from the sweep folder " << ctx.sources[0] << ".\n\n";
  if (ctx.sources.size() > 1)
    md << "Seeds pooled from the sweep folders " << join(ctx.sources, ", ") << ".\n\n";
  if (ctx.plots == "ok" && access((ctx.dir + "/story.png").c_str(), F_OK) == 0)
    md << "![loss curves of reference, candidates and controls per row, and the dose-response]"
          "(story.png)\n\n";
  md << "Each candidate is paired with the reference run of the same seed; its gap is the mean "
        "of (candidate - reference) training loss over the last 10 % of steps. Gaps are tested "
        "against the benign controls' gaps with a one-sided Welch t-test (alpha = "
     << ctx.alpha
     << "; a permutation test is reported beside it), and the onset is the first step after "
        "which the smoothed mean gap stays outside the control band (a t quantile, at 3 normal "
        "standard errors' level, of standard errors of a seed-mean control gap) for "
        "good. A verdict of `diverged` needs both. Method: docs/analysis.md.\n\n"
     << "| group | variant | verdict | seeds | gap (nats) | gap / loss | p (Welch) | p (perm.) | "
        "Hedges g | onset step | val gap (nats) | dose: max additions to one row per step "
        "(seeds' range) |\n"
     << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const auto& v : verdicts)
    md << "| " << v.group << " | `" << v.variant << "`" << (v.control ? " (control)" : "") << " | "
       << verdict_words(v.verdict) << (v.perturbed ? ", perturbed" : "")
       << (v.lopsided ? ", lopsided" : "") << " | " << v.seeds << " | " << fmt(v.gap, "%+.4f")
       << " | " << fmt(100 * v.gap / v.final_loss_ref, "%+.2f%%") << " | " << fmt(v.p_welch)
       << " | " << fmt(v.p_permutation) << " | " << fmt(v.hedges_g, "%.2f") << " | "
       << (v.onset >= 0 && v.verdict == Outcome::Diverged ? std::to_string(v.onset) : "-") << " | "
       << (std::isnan(v.val_gap) ? "-" : fmt(v.val_gap, "%+.4f")) << " | " << fmt(v.dose, "%.0f")
       << " (" << fmt(v.dose_min, "%.0f") << "-" << fmt(v.dose_max, "%.0f") << ") |\n";
  for (const auto& v : verdicts)
    if (v.perturbed) md << "\n" << perturbed_words(v) << "\n";
  for (const auto& v : verdicts)
    if (v.lopsided) md << "\n" << lopsided_words(v) << "\n";
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
  if (!ctx.unfinished.empty()) {
    md << "\nLeft out (not finished):\n\n";
    for (const auto& u : ctx.unfinished) md << "- " << u << "\n";
  }
  md << "\n## Plots\n\n";
  auto drawn = [&](const std::string& png) {
    return access((ctx.dir + "/" + png).c_str(), F_OK) == 0;
  };
  if (ctx.plots != "ok") {
    md << "Not drawn: " << ctx.plots << "\n";
  } else {
    if (drawn("dose.png")) md << "![gap against dose, per seed](dose.png)\n\n";
    if (drawn("shadow.png")) md << "![shadow error by token-frequency bucket](shadow.png)\n\n";
    for (size_t i = 0; i < verdicts.size(); ++i)
      if (drawn("verdict-" + std::to_string(i) + ".png"))
        md << "![" << verdicts[i].group << " " << verdicts[i].variant << "](verdict-" << i
           << ".png)\n";
  }
  write_output_file(ctx.dir + "/report.md", md.str(), "analyze: file");
}

void print_verdicts(const ReportContext& ctx, const std::vector<Verdict>& verdicts,
                    const std::vector<DoseResponse>& responses) {
  std::printf("%-40s %-40s %-14s %5s %10s %9s %9s %7s %8s\n", "group", "variant", "verdict",
              "seeds", "gap", "p(welch)", "p(perm)", "onset", "dose");
  for (const auto& v : verdicts)
    std::printf("%-40s %-40s %-14s %5d %+10.4f %9.2g %9.2g %7lld %8.0f\n", v.group.c_str(),
                (v.variant + (v.control ? " [control]" : "")).c_str(), name_of(v.verdict), v.seeds,
                v.gap, v.p_welch, v.p_permutation, v.onset, v.dose);
  for (const auto& v : verdicts) {
    if (!v.no_verdict_reason.empty())
      std::printf("%s %s: no verdict: %s\n", v.group.c_str(), v.variant.c_str(),
                  v.no_verdict_reason.c_str());
    for (const auto& run : v.nan_runs) std::printf("  stopped on NaN: %s\n", run.c_str());
    if (v.perturbed) std::printf("%s\n", perturbed_words(v).c_str());
    if (v.lopsided) std::printf("%s\n", lopsided_words(v).c_str());
  }
  for (const auto& u : ctx.unfinished) std::printf("not finished, left out: %s\n", u.c_str());
  std::printf("%s", dose_table(responses).c_str());
  if (!ctx.sources.empty())
    std::printf("%s %s\n", ctx.sources.size() > 1 ? "seeds pooled from" : "cells from",
                join(ctx.sources, ", ").c_str());
  std::printf("wrote %s/verdicts.csv, summary.h5, report.md (plots: %s)\n", ctx.dir.c_str(),
              ctx.plots.c_str());
}

}  // namespace divlab
