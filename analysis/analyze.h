// `divlab analyze DIR`: did a kernel make training diverge, against the noise floor? Reads the
// cells (DIR/cells/*.h5), decides (verdicts.h), writes the tables, report and plots (report.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "analysis/verdicts.h"

namespace divlab {

struct AnalyzeOptions {
  std::string dir;
  // Whether `variant` of `op` is a documented benign control, for traces that do not record their
  // kernels' roles (/kernel_roles, written since divlab 0.1 at 2026-11-24); the CLI passes the
  // catalogue's answer. Unset: such a trace's swapped kernels count as candidates.
  std::function<bool(const std::string& op, const std::string& variant)> is_benign;
  bool plots = true;    // run analysis/plots.py (matplotlib)
  bool verbose = true;  // print the verdict table
  double alpha = 0.05;
};

// Throws InputError for a folder with no traces or a corrupt one.
std::vector<Verdict> analyze(const AnalyzeOptions& opt);

}  // namespace divlab
