// check's compute-sanitizer pass: whether it runs, how long it may take, and what one run
// found, read from its log.
#pragma once
#include <istream>
#include <string>

#include "experiments/check.h"

namespace divlab {

struct SanitizerFindings {
  std::string summary;       // the tool's counting line ("RACECHECK SUMMARY: ..."); "" if none came
  std::string first;         // the first finding that counts, quoted
  int races = 0;             // race reports, each for one pair of accesses
  int races_unmodelled = 0;  // of them, inside kernels the tool cannot judge
  bool internal_error = false;  // the sanitizer itself failed ("Internal Sanitizer Error")
  // Whether the run found something that fails the check, given that the tool exited with its
  // error code (`errors_exit`): a race outside the unmodelled kernels, the sanitizer's own
  // failure, or any other finding (an out-of-bounds access, a barrier some threads of a warp
  // passed by, or a form this reader does not know).
  bool fails(bool errors_exit) const {
    if (internal_error) return true;
    if (races > 0) return races > races_unmodelled;
    return errors_exit;
  }
  // summary, with what was not counted and the first finding that was.
  std::string line(bool errors_exit) const;
};

// Reads a compute-sanitizer log; `summary_key` names the tool's counting line. Race reports
// whose two accesses both lie in cuBLASLt's generated GEMMs (`nvjet_sm*`, Hopper kernels that
// order shared memory with TMA and mbarriers, which racecheck does not model) are counted apart.
// They cannot be left out with --kernel-name-exclude instead: uninstrumented, they stopped the
// sanitizer with "failed to handle a hardware exception" on an H200 (docs/cuda.md).
SanitizerFindings read_sanitizer_log(std::istream& log, const std::string& summary_key);

// Why the pass does not run after `r`'s conditions, or "": the kernel hung under one of them.
// The pass runs every condition in one process under the tool, where no watchdog stops a hang
// (the conditions themselves ran in a worker that was killed for it), so it would never return.
std::string sanitizer_pass_skipped(const CheckReport& r);

// How long one tool may run, given the conditions' own wall time: a kernel that hangs only under
// the sanitizer is killed then. The tools slow kernels by up to ~50x (racecheck's shape
// conditions: 49 s where they take ~1 s alone, linear_backward fp32, H200), so 100x, and at
// least 10 minutes.
double sanitizer_tool_seconds(double conditions_seconds);

}  // namespace divlab
