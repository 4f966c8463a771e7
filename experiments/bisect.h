// `divlab bisect RUN_OR_CONFIG`: which of a diverging run's swapped kernels are responsible?
//
// Delta debugging (Zeller's ddmin) over the set of non-reference kernels: each decision runs the
// subset under test over a few seeds with short runs, beside the reference and the benign
// controls of the swapped ops (run once, into OUT/baseline, and shared by every decision), and
// asks `divlab analyze` whether the subset's gap leaves the control band: the same decision the
// analysis makes for any grid. Reports the minimal subset that still diverges, its onset step,
// and how many runs it took.
#pragma once

#include <string>
#include <vector>

#include "analysis/verdicts.h"

namespace divlab {

struct BisectOptions {
  std::string source;                  // a trace (its config) or a config file
  std::vector<std::string> overrides;  // --set key=value
  int seeds = 3;
  long long steps = 0;  // 0: the config's train.steps
  std::string out = "runs/bisect";
  int jobs = 0;
};

struct BisectDecision {
  std::vector<std::string> subset;         // "op=variant"
  Outcome verdict = Outcome::NoReference;  // analyze's verdict for the subset (none: no row)
  double gap = 0, p = 1;
  long long onset = -1;
  bool fails = false;
  // Where there is no verdict but the seeds moved (analyze's lopsided or perturbed annotation):
  // its sentence, so "nothing to blame" is not said of a run that more seeds may convict.
  std::string moved;
  bool perturbs = false;  // analyze's perturbed: every run moved, in no consistent direction
};

struct BisectResult {
  std::vector<std::string> swapped;        // every non-reference kernel of the source
  std::vector<std::string> culprits;       // the minimal failing subset (empty: nothing diverged)
  Outcome verdict = Outcome::NoReference;  // the culprits' (diverged, lower-loss, nan, crashed)
  // No subset diverged but every swapped kernel together perturbed the runs: culprits is then
  // the minimal perturbing subset (its verdict no-divergence).
  bool perturbed = false;
  long long onset = -1;
  int runs = 0;  // training runs executed
  std::vector<BisectDecision> decisions;
};

// Throws InputError for an unreadable source or one without non-reference kernels.
BisectResult run_bisect(const BisectOptions& opt);
// The closing lines: the culprits (or the kernels that perturb every run, where nothing diverged),
// or why there are none (nothing moved, or the seeds moved one way with no verdict at `seeds`:
// more seeds, not innocence).
std::string bisect_conclusion(const BisectResult& r, int seeds);
int cmd_bisect(const BisectOptions& opt);

}  // namespace divlab
