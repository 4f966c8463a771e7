// Dose-response: how a candidate's gap grows with the dose it received.
//
// The dose is the most additions one embedding-gradient row receives in a step (the hottest
// token's count in the step's batch, micro-batches together, one rank's shard with several:
// /metrics/max_row_contributions). A grid raises it
// with the tokens per step (train.batch, model.seq_len); the same data spec also gives each seed
// its own dose (a Markov chain's hot ids are drawn per seed). Groups that differ only in tokens
// per step form a series; each of its points is one group's verdict.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "analysis/verdicts.h"

namespace divlab {

struct DosePoint {
  double tokens_per_step = 0;
  double dose = 0, dose_min = 0, dose_max = 0;  // over the group's seeds
  int seeds = 0;
  double gap = 0, ci_low = 0, ci_high = 0;  // mean gap and its 95 % t-interval over seeds
  double band = 0;                          // the control band at the end (0: no controls)
  double p_welch = 1;
  Outcome verdict = Outcome::NoReference;
};

struct DoseResponse {
  std::string series;  // what the points share (their group label without the dose keys)
  std::string variant;
  bool control = false;
  std::vector<DosePoint> points;  // ascending dose
  // Where the verdicts cross from no divergence to `diverged` and stay there: the lowest dose
  // of that diverged run of points, and the highest dose below it that was not (NaN if every
  // point diverged). Both NaN when the highest dose did not diverge.
  double diverged_from = std::numeric_limits<double>::quiet_NaN();
  double quiet_up_to = std::numeric_limits<double>::quiet_NaN();
  std::string summary;  // one sentence for the report and the terminal
};

// Keys that set the tokens per step; a series is a group minus these.
bool is_dose_key(const std::string& key);

// Every series with at least two distinct tokens-per-step values, for every variant in it.
std::vector<DoseResponse> dose_responses(const std::vector<Verdict>& verdicts);

// The series' points and summaries as a Markdown section (empty when there is no series).
std::string dose_markdown(const std::vector<DoseResponse>& responses);
// The same as a terminal table.
std::string dose_table(const std::vector<DoseResponse>& responses);

}  // namespace divlab
