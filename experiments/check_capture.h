// `divlab check OP=VARIANT --trace RUN.h5`: the values a real run's op saw, as check inputs.
//
// Synthetic inputs miss what training makes: a trained head's peaked logits, activations with
// outlier channels, the ids real text repeats. Given a trace, check rebuilds the run's model from
// its recorded config at the newest weights the trace holds (final, else the newest checkpoint,
// else the initial ones; at initialisation from the run's seed when it holds none), runs one
// forward and backward (and the optimizer's step, for its ops) on the first sequence of the
// batch of that step with the reference kernels on the CPU in the run's precision, and records
// every call of the op. A few of those calls (the first, the middle, the last) become one check
// condition, judged like every other against the fp64 reference.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/op_cases.h"

namespace divlab {

struct CapturedCall {
  OpShape shape;
  OpInputs inputs;    // the call's arrays as doubles (exact), outputs zeroed (updates: as found)
  std::string where;  // "call 3 of 49"
};

struct TraceCapture {
  std::string source;  // the weights: "final (step 400)", "its newest checkpoint (step 300)", ...
  std::vector<CapturedCall> calls;
};

// Throws InputError naming the trace when it is no readable divlab trace, or naming the op when
// the trace's run never calls it (its model, precision and optimizer decide). Reads the config
// only: cheap enough to run before anything else.
void check_capture_source(const std::string& trace, const std::string& op);

// The recorded calls of `op`, at most `max_calls` of them, spread over the step.
TraceCapture capture_op_calls(const std::string& trace, const std::string& op, size_t max_calls);

}  // namespace divlab
