// What a training run writes into its trace (docs/trace-format.md): the layout before its first
// step, a row of metrics per step, the shadow metrics as they finish; and what it tells its user
// on stderr meanwhile (progress, the profile table).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/data_parallel.h"
#include "io/trace.h"
#include "kernels/profile.h"
#include "kernels/shadow.h"
#include "model/optimizer.h"

namespace divlab {

// Shadow specs named in the run's own backend catalogue (plug-in and GPU-only variants included).
std::vector<ShadowSpec> shadow_specs_of(const RunConfig& cfg);

// Root attributes, the resolved config, the kernels' roles, the dataset description, and every
// series. `rank_series`: each rank's time per step (/ranks), for a run over ranks or one resumed
// from a trace that has them.
void lay_out_trace(TraceWriter& w, const RunConfig& cfg, const DatasetInfo& data,
                   const std::vector<ParamInfo>& layout, int threads, const std::string& device,
                   bool rank_series);

// One step's row of /metrics (and /ranks where the step ran over ranks).
struct StepRow {
  int64_t step = 0;
  double loss = 0, wall_s = 0;
  int64_t tokens = 0;  // seen so far, this step's included
  const StepStats* optimizer = nullptr;
  const BatchStats* batch = nullptr;
  const std::vector<RankReport>* ranks = nullptr;
};
void record_step(TraceWriter& w, const StepRow& row, const std::vector<ParamInfo>& layout);

void record_shadow(TraceWriter& w, const std::vector<ShadowSpec>& specs,
                   const std::vector<ShadowMetrics>& metrics, int64_t step);

class Progress {
 public:
  // On a terminal one line rewritten every step; in a pipe or log a line at every tenth of the
  // run (and at its end), so a log shows progress without a line per step.
  explicit Progress(bool enabled);
  void update(int64_t step, int64_t steps, double loss, double tokens_per_s, double elapsed);
  void done();

 private:
  bool enabled_, terminal_;
  int64_t last_tenth_ = 0;
};

// Where the steps' time went, op by op (stderr), beside the steps' wall time: what the ops' sum
// leaves of it is the step outside any op (the host's waits, gaps between launches).
void print_profile(const std::map<std::string, OpTime>& times, int64_t steps, double wall_s);

// Where shadow mode's time went, per evaluation (stdout, with --profile).
template <class Timing>
void print_shadow_timing(const Timing& t, bool background) {
  if (t.evaluations == 0) return;
  const double per = 1e3 / double(t.evaluations);
  std::printf(
      "shadow mode, %lld evaluations, ms each: recording %.2f, candidates %.2f, waiting for the "
      "worker %.2f (training thread); reference + comparison %.2f (%s)\n",
      (long long)t.evaluations, t.capture_s * per, t.candidates_s * per, t.waited_s * per,
      t.reference_s * per, background ? "worker thread" : "training thread");
}

}  // namespace divlab
