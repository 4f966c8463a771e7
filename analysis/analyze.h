// `divlab analyze DIR [DIR...] [--out OUT]`: did a kernel make training diverge, against the noise
// floor? Reads the cells (DIR/cells/*.h5), decides (verdicts.h), writes the tables, report and
// plots (report.h). Several folders pool their seeds: a grid re-run with fresh seeds
// (`--seed-offset`) adds to the first run's evidence instead of standing beside it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "analysis/verdicts.h"

namespace divlab {

struct AnalyzeOptions {
  // The sweep folders whose cells are analysed together. A group's seeds may come from any of
  // them; the same seed of the same variant in two of them is refused (it would count one run's
  // evidence twice).
  std::vector<std::string> dirs;
  // Where the tables, report and plots go. Empty: the sweep folder itself, when there is one.
  // Several folders need a folder of their own (created), never one of theirs, whose cells
  // would then disagree with its verdicts.
  std::string out;
  // Whether `variant` of `op` is a documented benign control, for traces that do not record their
  // kernels' roles (/kernel_roles, written since divlab 0.1 at 2026-11-24); the CLI passes the
  // catalogue's answer. Unset: such a trace's swapped kernels count as candidates.
  std::function<bool(const std::string& op, const std::string& variant)> is_benign;
  bool plots = true;    // run analysis/plots.py (matplotlib)
  bool verbose = true;  // print the verdict table
  double alpha = 0.05;
};

// Throws InputError for a folder with no traces or a corrupt one, a seed found twice, or a
// missing or clashing --out; nothing is written then.
std::vector<Verdict> analyze(const AnalyzeOptions& opt);

}  // namespace divlab
