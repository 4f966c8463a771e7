// Named weights kept in a trace (trace.initial_weights, trace.final_weights) and exported by
// `divlab export`: /weights/initial/<name> and /weights/final/<name>, one float64 dataset per
// parameter, shaped as PyTorch shapes it ([out, in] for linear layers), in the model's
// parameter order (model/transformer.h: param_layout; docs/trace-format.md lists it).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/named_enum.h"
#include "io/trace.h"
#include "model/transformer.h"

namespace divlab {

// Which of a trace's weights: those kept at the end or at the start of the run
// (trace.final_weights, trace.initial_weights), or its newest checkpoint.
enum class WhichWeights { Final, Initial, Checkpoint };
template <>
struct EnumNames<WhichWeights> {
  static constexpr std::pair<WhichWeights, const char*> table[] = {
      {WhichWeights::Final, "final"},
      {WhichWeights::Initial, "initial"},
      {WhichWeights::Checkpoint, "checkpoint"}};
};

// Creates /weights/WHICH/<name> for every parameter (before SWMR starts; WHICH final or
// initial); final also gets /weights/final_step (int64[1]: the steps taken before the weights
// were kept).
void lay_out_weights(TraceWriter& w, WhichWeights which, const std::vector<ParamInfo>& layout);
// Writes the flat parameter buffer `params` (layout order) into /weights/WHICH.
void write_weights(TraceWriter& w, WhichWeights which, const std::vector<ParamInfo>& layout,
                   const std::vector<double>& params, int64_t step = 0);
// The flat parameter buffer from /weights/WHICH; none if the trace does not hold them.
std::optional<std::vector<double>> read_weights(const TraceReader& r, WhichWeights which,
                                                const std::vector<ParamInfo>& layout);

// A trace's weights, with the steps taken before them; none if the trace does not hold them.
struct TraceWeights {
  std::vector<double> params;  // flat, in parameter order
  int64_t step = 0;
};
std::optional<TraceWeights> trace_weights(const TraceReader& r, WhichWeights which,
                                          const std::vector<ParamInfo>& layout);
// "trace 'PATH': holds no checkpoint (why, and where the last step's weights are)": a run writes
// none at its last step, so a finished run's newest checkpoint is an earlier one, or none.
std::string no_checkpoint_message(const TraceReader& r, const std::string& path);

}  // namespace divlab
