// `divlab check OP=VARIANT`: a kernel-level stress report in one command.
//
// The variant and the op's reference in fp64 (CPU) run on the same inputs under a set of
// conditions: token distributions (uniform, Zipf, real text), shapes (tiny, not multiples of
// 8/32/128, aligned, large), value scales (tiny, large, rows of zeros) and a repeated run (bitwise
// determinism). Each condition reports the worst per-row relative error, the normalised error,
// whether the benchmark verifier that passed the seed bug would pass it, a systematic bias, and
// stray writes. The verdict states its criteria (see kCriteria in check.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace divlab {

struct CheckOptions {
  std::string target;                // "op=variant"
  Backend backend = Backend::Cpu;    // where the variant runs
  std::vector<std::string> plugins;  // libraries to load first
  bool train = false;                // then run the short reproduce grid for the candidate
  std::string out;                   // --train: grid output folder
  int jobs = 0;
  bool plots = true;
  uint64_t seed = 0;
  bool sanitizer = true;  // cuda: also run the conditions under compute-sanitizer memcheck
};

struct ConditionResult {
  std::string name;   // e.g. "tokens zipf:1.1"
  std::string shape;  // e.g. "B16 T128 C64 V512"
  bool ran = true;    // false: skipped (note says why)
  std::string note;
  double row_error = 0;       // max over rows of ||v - r|| / ||r||
  double norm_error = 0;      // max |v - r| / max |r|
  double verifier_pass = 1;   // fraction with |v - r| <= 1e-2 + 1e-2 |r|
  double bias = 0;            // sum(|v| - |r|) / sum |r|: systematic shrinking (<0) or growth (>0)
  bool finite = true;         // no NaN/inf where the reference is finite
  bool deterministic = true;  // the repeat condition: bitwise equal across two calls
  std::vector<std::string> stray_writes;
  bool failed = false;
  std::string why;  // what failed
};

struct CheckReport {
  std::string op, variant, backend;
  std::vector<ConditionResult> conditions;
  bool pass = true;
  std::string grade;                 // "fp32" (every row within 1e-4) or "bf16" (within 1e-2)
  std::vector<std::string> failing;  // names of the conditions that break it
  bool verifier_passes_all = true;
  uint64_t seed = 0;
  std::string sanitizer;  // cuda: compute-sanitizer's summary line, or why it did not run
};

// Throws InputError for an unknown op/variant, an op check does not cover, or a bad backend.
CheckReport run_check(const CheckOptions& opt);
// The table and verdict as printed by `divlab check`.
std::string format_check(const CheckReport& r);
// `divlab check`: prints the report, then with --train runs the short grid. Exit code: 0 pass,
// 1 fail.
int cmd_check(const CheckOptions& opt);

}  // namespace divlab
