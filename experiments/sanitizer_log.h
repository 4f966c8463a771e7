// What one compute-sanitizer run found, read from its log (check's sanitizer pass).
#pragma once
#include <istream>
#include <string>

namespace divlab {

struct SanitizerFindings {
  std::string summary = "no summary";  // the tool's counting line ("RACECHECK SUMMARY: ...")
  std::string first;                   // the first finding that counts, quoted
  int races = 0;                       // race reports, each for one pair of accesses
  int races_unmodelled = 0;            // of them, inside kernels the tool cannot judge
  bool internal_error = false;         // the sanitizer itself failed ("Internal Sanitizer Error")
  // Whether the run found something that fails the check, given that the tool exited with its
  // error code (`errors_exit`): a race outside the unmodelled kernels, the sanitizer's own
  // failure, or any other finding (an out-of-bounds access, or a form this reader does not know).
  bool fails(bool errors_exit) const {
    if (internal_error) return true;
    if (races > 0) return races > races_unmodelled;
    return errors_exit;
  }
  // summary, with what was not counted and the first finding that was.
  std::string line(bool errors_exit) const;
};

// Reads a compute-sanitizer log; `summary_key` names the tool's counting line. Race reports
// whose two accesses both lie in cuBLASLt's generated GEMMs (`nvjet_*`, Hopper kernels that
// order shared memory with TMA and mbarriers, which racecheck does not model) are counted apart.
// They cannot be left out with --kernel-name-exclude instead: uninstrumented, they stopped the
// sanitizer with "failed to handle a hardware exception" on an H200 (docs/cuda.md).
SanitizerFindings read_sanitizer_log(std::istream& log, const std::string& summary_key);

}  // namespace divlab
