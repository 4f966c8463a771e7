#include "experiments/reproduce.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "analysis/analyze.h"
#include "analysis/dose.h"
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
  const bool gpu = opt.backend == "cuda";
  if (opt.grid.empty())
    opt.grid = gpu ? DIVLAB_SOURCE_DIR "/configs/reproduce-gpu.toml"
                   : DIVLAB_SOURCE_DIR "/configs/reproduce.toml";
  if (opt.out.empty())
    opt.out = std::string("runs/reproduce") + (gpu ? "-gpu" : "") + (opt.quick ? "-quick" : "");
  const auto t0 = std::chrono::steady_clock::now();
  SweepOptions sw;
  sw.grid = opt.grid, sw.out = opt.out, sw.quick = opt.quick, sw.jobs = opt.jobs;
  sw.seed_offset = opt.seed_offset;
  const SweepSummary s = run_sweep(sw);
  std::printf("\nsweep: %d cells: %d completed, %d nan, %d failed, %d already finished\n\n",
              s.cells, s.completed, s.nan, s.failed, s.skipped);
  AnalyzeOptions an;
  an.dir = opt.out, an.plots = opt.plots, an.verbose = false;
  const auto verdicts = analyze(an);

  // The masking matrix: one row per group (data, optimizer, tokens per step) in grid order, one
  // column per variant; then how the gap grows with the dose.
  struct Row {
    int order = 0;
    std::string label;
    const Verdict* any = nullptr;
    std::map<std::string, const Verdict*> cells;
  };
  std::map<std::string, Row> rows;
  std::map<std::string, bool> columns;
  for (const auto& v : verdicts) {
    Row& row = rows[v.group];
    if (!row.any || v.first_cell < row.order) row.order = v.first_cell;
    row.any = &v;
    row.label = label_value(v.group, "data") + " / " + label_value(v.group, "train.optimizer");
    row.cells[v.variant] = &v;
    columns[v.variant] = v.control;
  }
  std::vector<const Row*> ordered;
  for (const auto& [group, row] : rows) ordered.push_back(&row);
  std::sort(ordered.begin(), ordered.end(),
            [](const Row* a, const Row* b) { return a->order < b->order; });
  std::printf("%-24s %8s %17s", "data / optimizer", "tokens", "dose (seeds)");
  for (const auto& [c, control] : columns)
    std::printf("  %-36s", (c.substr(c.find('=') + 1) + (control ? " [control]" : "")).c_str());
  std::printf("\n");
  for (const Row* row : ordered) {
    char dose[40];
    std::snprintf(dose, sizeof dose, "%.0f (%.0f-%.0f)", row->any->dose, row->any->dose_min,
                  row->any->dose_max);
    std::printf("%-24s %8.0f %17s", row->label.c_str(), row->any->tokens_per_step, dose);
    for (const auto& [c, control] : columns) {
      const auto it = row->cells.find(c);
      if (it == row->cells.end()) {
        std::printf("  %-36s", "-");
        continue;
      }
      const Verdict& v = *it->second;
      char cell[64];
      std::snprintf(cell, sizeof cell, "%s %+.4f p=%.2g", v.verdict.c_str(), v.gap, v.p_welch);
      std::printf("  %-36s", cell);
    }
    std::printf("\n");
  }
  const auto responses = dose_responses(verdicts);
  if (!responses.empty()) std::printf("\n%s", dose_table(responses).c_str());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s/report.md has the method, every number and the plots (%.0f s)\n",
              opt.out.c_str(), secs);
  return 0;
}

}  // namespace divlab
