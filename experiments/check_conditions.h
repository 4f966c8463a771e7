// divlab check's conditions: the shapes, values, token streams and call patterns under which
// experiments/check.cpp judges a kernel against its op's fp64 reference, each with the ops it
// applies to (docs/kernel-authors.md describes them for kernel authors).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/op_cases.h"
#include "kernels/op_list.h"

namespace divlab {

// One condition: a shape (or random shapes, or a trace's recorded calls), the values and token
// stream its inputs are drawn from, how the kernel is called, and how many draws it takes.
struct Condition {
  std::string name;
  OpShape shape;
  std::string tokens = "uniform";  // uniform | zipf:1.1 | brown | rows | hot
  Values values = Values::Normal;
  // The ops it applies to (empty: every op), and what it says for the others.
  std::vector<Op> only;
  const char* not_for = "";
  bool random_shapes = false;  // every draw its own random shape
  bool prefill = false;        // outputs the op adds into start from a pre-fill
  bool repeat = false;         // the variant twice: bitwise equal?
  bool shrink = false;         // a failing draw is shrunk to the smallest failing shape
  bool from_trace = false;     // the draws are calls recorded from --trace's run, one each
  bool concurrent = false;     // on a device: copies at once on several streams, under load
  bool fixed_scalars = false;  // the default scalars (OpScalars) instead of drawn ones
  int earlier_calls = 0;     // judged on the call after this many on other values, arrays refilled
  bool shapes_only = false;  // plain normal values at a shape: what check's racecheck pass runs
  bool misaligned = false;   // every array one value past a 16-byte boundary (OpInputs)
  bool loss_only = false;    // cross_entropy without dlogits, as evaluation calls it (OpScalars)
  // Every row's own error judged too (ConditionResult::row_error against the same bar), not only
  // the output's largest error against its largest value.
  bool judge_rows = false;
  // The GPU's side it tests ("streams"); set, it is skipped on the host backend.
  const char* device_only = nullptr;
  // The OpenMP team the kernel's calls run in (0: the process's, OMP_NUM_THREADS or every core),
  // as `train.threads` sets it in a run. A host condition: skipped for a kernel on the device.
  int threads = 0;
  // The most host memory a check of any op took at this condition (measured, the process's peak;
  // 0: small), asked of the host before it runs: a worker killed for memory would read as a
  // kernel's crash.
  size_t host_bytes = 0;
  int draws = 1;  // x CheckOptions::draws; 0: one draw (the costly shapes)
  // The shape's rows repeated this many times in one call (call_op_tiled): arrays past what the
  // host holds as doubles, judged copy by copy against the shape's fp64 reference. 0: not tiled.
  int copies = 0;

  bool applies_to(Op op) const {
    return only.empty() || std::find(only.begin(), only.end(), op) != only.end();
  }
};

// Every condition in report order; with a trace, "values from trace" last. A draw's seed derives
// from its condition's index, so a new condition goes after the others: a seed then still
// replays every older condition's draws.
std::vector<Condition> check_condition_list(bool with_trace);

// --condition's names (any case) as the list `list` spells them, each once, in the list's order;
// InputError for a name it lacks (the nearest one suggested; "values from trace" needs --trace).
std::vector<std::string> select_conditions(const std::vector<std::string>& asked,
                                           const std::vector<Condition>& list);

// Why `cond` is not run on a host with `available` bytes of memory left ("" when it fits, or
// when nothing is known: available 0).
std::string host_memory_shortfall(const Condition& cond, size_t available);

// The shapes the benchmark's verifier was written for (its emulation in check.cpp).
std::vector<OpShape> verifier_shapes();

}  // namespace divlab
