// The analysis's pure core: cells in, verdicts out. No files, no printing: tests feed it
// synthetic cells (tests/test_analysis.cpp); analyze.h reads the cells from traces and
// report.h writes what it decides.
//
// Cells are grouped by everything in their config except the kernel variants and the seed.
// Within a group every non-reference variant is paired with the reference run of the same seed;
// its gaps (variant - reference) are tested against the gaps of the group's benign controls
// (variants documented as benign: same math up to rounding). See docs/analysis.md.
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/named_enum.h"
#include "io/trace.h"

namespace divlab {

// What a row's test decided, or why it decided nothing: a result (diverged, lower-loss,
// no-divergence); crashed (the candidate's process died or failed in some seed: a finding of its
// own); nan (the candidate stopped on NaN); reference-nan (every seed's reference did);
// too-few-seeds; no-reference (the group has no reference run). Only the results come from the
// test; the rest leave `no_verdict_reason` set.
enum class Outcome {
  Diverged,
  LowerLoss,
  NoDivergence,
  Crashed,
  Nan,
  ReferenceNan,
  TooFewSeeds,
  NoReference
};
// The names every output writes (verdicts.csv, summary.h5, report.md, the terminal).
template <>
struct EnumNames<Outcome> {
  static constexpr std::pair<Outcome, const char*> table[] = {
      {Outcome::Diverged, "diverged"},
      {Outcome::LowerLoss, "lower-loss"},
      {Outcome::NoDivergence, "no-divergence"},
      {Outcome::Crashed, "crashed"},
      {Outcome::Nan, "nan"},
      {Outcome::ReferenceNan, "reference-nan"},
      {Outcome::TooFewSeeds, "too-few-seeds"},
      {Outcome::NoReference, "no-reference"}};
};
std::ostream& operator<<(std::ostream& out, Outcome o);  // its name (test failures print it)

// One run as the analysis needs it (analyze.cpp reads it from a trace).
struct Cell {
  std::string path;
  RunStatus status = RunStatus::Completed;
  std::map<std::string, std::string> config;  // resolved key -> value text
  std::vector<double> loss, val_loss, max_row;
  std::string variant;    // "op=variant[+op=variant]" or "reference"
  std::string nan_where;  // "backward linear_backward layer 1 grad mlp.fc.weight, step 17"
  // How its process ended where the sweep saw it die before the run recorded an outcome (a
  // signal, or an exit other than a result; from the sweep's manifest): a finding about its
  // kernels, not an unfinished run. Empty otherwise.
  std::string crash;
  std::string failure;  // a run recorded "failed": why (the trace's "failure")
  bool control = false;
  long long seed = 0;
  std::string provenance;  // "divlab COMMIT on HOST (BACKEND)": who wrote the trace
  bool crashed() const { return !crash.empty(); }
};

struct Verdict {
  std::string group;  // the config keys that distinguish this group from the others
  std::map<std::string, std::string> settings;  // the same, key by key
  std::string variant;                          // "op=variant[+op=variant]" or "reference"
  bool control = false;  // every swapped kernel is a documented benign control
  Outcome verdict = Outcome::NoReference;
  int seeds = 0;
  double final_loss_ref = 0;  // mean over seeds, last 10 % of steps
  double gap = 0;             // mean over seeds of (variant - reference), last 10 % of steps
  double area = 0;            // mean over seeds and steps of (variant - reference)
  double val_gap = 0;         // same for /eval/val_loss (reference kernels), NaN if absent
  double p_welch = 1, p_permutation = 1, hedges_g = 0;
  std::string compared_with;  // "controls" or "zero" (no controls in the group)
  long long onset = -1;       // step from which the gap stays outside the control band
  double dose = 0;  // max additions to one embedding row per step: mean over the seeds' reference
                    // runs and steps
  double dose_min = 0, dose_max = 0;  // the seeds' doses range: the same data spec can give
                                      // each seed its own (a chain's hot ids are drawn per seed)
  double tokens_per_step = 0;         // train.batch x model.seq_len
  std::string series;                 // the group label without the dose keys (analysis/dose.h)
  int first_cell = -1;  // the lowest cell number (cells/NNNN.h5) in the group: grid order
  double gap_ci_low = 0, gap_ci_high = 0;  // 95 % t-interval of the mean gap over seeds
  double control_band = 0;  // the band at the last step (0 without controls): the noise floor
  // How far the variant moves a seed's final loss, either way: the root mean square of its
  // per-seed gaps, beside the controls'; p_shift tests its |gaps| against the controls' (shift_p
  // below). `perturbed`: no consistent gap, yet the seeds moved materially further than the
  // controls move theirs. An optimizer can absorb a kernel's bias (AdamW's per-parameter
  // normalisation) and still carry the kernel's noise into every run.
  double shift = 0, control_shift = 0, p_shift = 1;
  bool perturbed = false;
  // `lopsided`: no verdict, yet the seeds' gaps lie on one side (lopsided_gaps below): seeds
  // far beyond the rest inflate the t-test's variance (its power on such gaps:
  // docs/analysis.md); Welch stays the test because the permutation test's errors grow on a
  // noisy candidate beside more control gaps than its own. More seeds settle it.
  bool lopsided = false;
  // The per-seed gaps' median, how many lie on its side of zero, and the two-sided exact sign
  // test of the gaps against zero (stats::sign_test): what `lopsided` reads besides the tests.
  double median_gap = 0;
  int seeds_one_way = 0;
  double p_sign = 1;
  // Per paired seed: the seed, its gap and the dose its reference run received.
  std::vector<long long> seed_ids;
  std::vector<double> seed_gaps, seed_doses;
  std::vector<std::pair<std::string, std::string>> seed_traces;  // reference, variant trace paths
  std::string nan_where;  // verdict nan: pass, op, layer, tensor and step of the first NaN/Inf
  // Every run behind this row that stopped on NaN, candidate or reference: "cell 0003 (seed 1,
  // reference): backward ... step 17". A seed whose reference stopped is not paired.
  std::vector<std::string> nan_runs;
  std::string no_verdict_reason;  // empty when the verdict is a result
  // Per step, means over seeds: smoothed reference and variant loss, their gap, and the control
  // band (a t quantile of standard errors of a seed-mean control gap); the seeds' spread is the
  // standard deviation of the per-seed gaps, drawn whether or not the group has a control; what the
  // plots draw.
  std::vector<double> ref_curve, variant_curve, gap_curve, band_curve, spread_curve;
};

// p_shift: whether the seeds moved further than the controls, either way: one-sided tests of the
// |gaps| against the controls' |gaps|, Welch's t (a broad shift) and the rank-sum test (every
// seed beyond the controls, one of them far beyond the rest, which inflates the t-test's
// variance: docs/analysis.md), the smaller p doubled (Bonferroni: the pair keeps its level at
// `alpha`); Welch's alone where the rank-sum test cannot reach alpha / 2 (3 seeds, 3 control gaps).
double shift_p(const std::vector<double>& gaps, const std::vector<double>& control_gaps,
               double alpha);

// Whether the per-seed `gaps` of a row Welch's t did not call lie on one side: every gap on
// the mean's side with the permutation test (`p_permutation`, one-sided that way) below alpha and
// the mean at least `min_gap` (one seed far beyond the rest: a run that blew up), or most of
// them, by the two-sided sign test below alpha with the median at least `min_gap` on the side
// most take (a few seeds far out either way: chaotic runs, which any rounding change flips).
bool lopsided_gaps(const std::vector<double>& gaps, double p_permutation, double min_gap,
                   double alpha);
// What the "most seeds" rule reads: the gaps' median, how many lie above and below zero, and
// the two-sided exact sign test's p (a verdict row carries them: median_gap, seeds_one_way,
// p_sign).
struct SeedSides {
  double median = 0;
  int positive = 0, negative = 0;
  double p_sign = 1;
};
SeedSides seed_sides(const std::vector<double>& gaps);

// The verdict of every variant in every group, groups in key order; `alpha` is the test's level.
// Throws InputError when a group holds one variant's seed twice (pooled sweeps that share seeds).
std::vector<Verdict> compute_verdicts(std::vector<Cell> cells, double alpha);

}  // namespace divlab
