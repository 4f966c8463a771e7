#include "experiments/reproduce.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "analysis/analyze.h"
#include "experiments/sweep.h"

namespace divlab {

namespace {
// "data=brown train.optimizer=sgd" -> value of `key`, or "".
std::string label_value(const std::string& label, const std::string& key) {
  const auto at = label.find(key + "=");
  if (at == std::string::npos) return "";
  const auto start = at + key.size() + 1;
  return label.substr(start, label.find(' ', start) - start);
}
}  // namespace

int run_reproduce(const ReproduceOptions& in) {
  ReproduceOptions opt = in;
  if (opt.grid.empty()) opt.grid = DIVLAB_SOURCE_DIR "/configs/reproduce.toml";
  if (opt.out.empty()) opt.out = opt.quick ? "runs/reproduce-quick" : "runs/reproduce";
  const auto t0 = std::chrono::steady_clock::now();
  SweepOptions sw;
  sw.grid = opt.grid, sw.out = opt.out, sw.quick = opt.quick, sw.jobs = opt.jobs;
  const SweepSummary s = run_sweep(sw);
  std::printf("\nsweep: %d cells: %d completed, %d nan, %d failed, %d already finished\n\n",
              s.cells, s.completed, s.nan, s.failed, s.skipped);
  AnalyzeOptions an;
  an.dir = opt.out, an.plots = opt.plots, an.verbose = false;
  const auto verdicts = analyze(an);

  // The matrix: one row per (data, optimizer), one column per variant.
  std::map<std::string, std::map<std::string, const Verdict*>> matrix;
  std::map<std::string, bool> columns;
  for (const auto& v : verdicts) {
    const std::string row =
        label_value(v.group, "data") + " / " + label_value(v.group, "train.optimizer");
    matrix[row][v.variant] = &v;
    columns[v.variant] = v.control;
  }
  std::printf("%-22s %8s", "data / optimizer", "max-row");
  for (const auto& [c, control] : columns)
    std::printf("  %-34s", (c.substr(c.find('=') + 1) + (control ? " [control]" : "")).c_str());
  std::printf("\n");
  for (const auto& [row, cells] : matrix) {
    std::printf("%-22s %8.0f", row.c_str(), cells.begin()->second->max_row_contributions);
    for (const auto& [c, control] : columns) {
      const auto it = cells.find(c);
      if (it == cells.end()) {
        std::printf("  %-34s", "-");
        continue;
      }
      const Verdict& v = *it->second;
      char cell[64];
      std::snprintf(cell, sizeof cell, "%s gap %+.4f p=%.2g", v.verdict.c_str(), v.gap, v.p_welch);
      std::printf("  %-34s", cell);
    }
    std::printf("\n");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s/report.md has the method, every number and the plots (%.0f s)\n",
              opt.out.c_str(), secs);
  return 0;
}

}  // namespace divlab
