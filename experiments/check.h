// `divlab check OP=VARIANT`: a kernel-level stress report in one command.
//
// The variant and the op's reference in fp64 (CPU) run on the same inputs under a set of
// conditions: token distributions (uniform, Zipf, real text), every id but a few, shapes (fixed
// ones and shapes drawn at random on every run), value scales and outlier channels, outputs the
// op adds into pre-filled, and a repeated run (bitwise determinism). Every condition takes
// several independent draws from a fresh seed (printed; --seed replays). Each reports the worst
// per-row relative error, the normalised error (on the kernel's own contribution for outputs it
// adds into), whether the benchmark verifier that passed the seed bug would pass it, a
// systematic bias, rows left unwritten or written that should not be, and stray writes. A
// failing draw is shrunk to the smallest shape that still fails. The verdict states its criteria
// (see kCriteria in check_report.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/named_enum.h"
#include "kernels/backend.h"

namespace divlab {

// The grade a kernel must reach: fp32 (every output within 1e-4 of fp64) or bf16 (within 1e-2).
// Reduced-precision arithmetic inside an fp32 kernel fails unless the user asks for bf16.
enum class Grade { Fp32, Bf16 };
template <>
struct EnumNames<Grade> {
  static constexpr std::pair<Grade, const char*> table[] = {{Grade::Fp32, "fp32"},
                                                            {Grade::Bf16, "bf16"}};
};

struct CheckOptions {
  std::string target;              // "op=variant"
  Backend backend = Backend::Cpu;  // where the variant runs
  // fp32: the fp32 catalogue; bf16: the bf16-mode catalogue (activations stored in bf16), whose
  // activation inputs are bf16 values (its other inputs fp32 values), for the reference too.
  Precision precision = Precision::Fp32;
  Grade grade = Grade::Fp32;  // bf16 precision judges ops with activations at the bf16 grade
  int draws = 3;              // independent draws per condition (random shapes: 3x)
  // --condition: run only these (names as the table prints them, any case); empty: every one.
  // A condition's draws do not depend on which others run, so the same seed gives its same rows.
  std::vector<std::string> conditions;
  std::vector<std::string> plugins;  // libraries to load first
  // A run's trace: its op's recorded inputs become one more condition (check_capture.h).
  std::string trace;
  bool train = false;  // then train with it: a short grid chosen for the op (check_train.h)
  std::string out;     // --train: grid output folder
  int jobs = 0;
  bool plots = true;
  uint64_t seed = 0;
  bool sanitizer = true;  // cuda: also run the conditions under compute-sanitizer (memcheck,
                          // racecheck, synccheck)
  // `divlab check` runs the conditions in a worker process, so that a kernel that crashes or
  // hangs gets a verdict for the condition it was in instead of taking the check down.
  bool isolated = true;
  int time_limit = 120;  // seconds a kernel's calls in one draw may take before they are a hang
  // Internal: the racecheck pass's run (cmd_check): only the shape conditions, one draw each.
  bool shape_conditions_only = false;
  // Internal: this process is such a worker, starting at this condition, reporting to this file.
  int worker_from = -1;
  std::string worker_report;
};

struct ConditionResult {
  std::string name;      // e.g. "tokens zipf:1.1"
  std::string shape;     // e.g. "B16 T128 C64 NH4 V512": the failing (or worst) draw's
  bool ran = true;       // false: skipped (note says why)
  bool selected = true;  // false: left out by --condition (neither run, printed nor judged)
  std::string note;
  double row_error = 0;   // max over rows of ||v - r|| / ||r||
  double norm_error = 0;  // max |v - r| / max |r|
  // Error accepted beyond 1e-2: twice what rounding the inputs to bf16 moves the exact result
  // (normalised; computed only for a draw past 1e-2), and the error left beyond it.
  double rounding_allowance = 0, beyond_allowance = 0;
  // The error the fp32 grade judges, where a draw is past 1e-4: what exceeds twice the larger of
  // the change rounding the inputs to fp32 makes to the exact result and the backend's fp32
  // reference's distance from it on the same inputs (an ill-conditioned input, such as attention
  // at x1e3 values, moves it even for an exact fp32 kernel); -1: the plain error.
  double fp32_grade_error = -1;
  double grade_error() const { return fp32_grade_error >= 0 ? fp32_grade_error : norm_error; }
  // The bf16 mode: the error of the op's fp32 outputs alone, judged as the fp32 grade judges
  // (-1: not measured), and their worst element.
  double fp32_outputs_error = -1;
  std::string fp32_outputs_worst;
  double verifier_pass = 1;   // fraction with |v - r| <= 1e-2 + 1e-2 |r|
  double bias = 0;            // sum(|v| - |r|) / sum |r|: systematic shrinking (<0) or growth (>0)
  bool finite = true;         // no NaN/inf where the reference is finite
  bool deterministic = true;  // the repeat condition: bitwise equal across two calls
  std::vector<std::string> stray_writes;
  int64_t rows_not_updated = 0;      // rows the reference adds to that the kernel left untouched
  int64_t rows_wrongly_updated = 0;  // rows the reference leaves alone that the kernel changed
  std::string row_example;           // e.g. "token id 210"
  // "values NaN": output values the kernel left finite where the reference, fed the NaNs,
  // gives NaN or inf (a kernel that drops NaNs hides a blown-up step), and the first of them.
  int64_t nans_hidden = 0;
  std::string nan_example;
  std::string worst;      // the worst element: "output 0 (position 3, col 7): 1.2 vs 1.25"
  std::string worst_row;  // the row of row_error: "output 0 (position 3; its largest 1.2e-03)"
  int draws = 0;          // draws run
  std::string smallest;   // a failing draw shrunk: the smallest shape that still fails, and how
  bool crashed = false;   // the worker died or hung in this condition (why says how)
  bool failed = false;
  std::string why;  // what failed
};

struct CheckReport {
  std::string op, variant;
  Backend backend = Backend::Cpu;
  Precision precision = Precision::Fp32;
  Grade required = Grade::Fp32;
  // The bf16 mode, an op with bf16 arrays: its fp32 outputs (the residual stream, weight
  // gradients, a norm's statistics: fp32 in that mode) must still be fp32-grade (unless --grade
  // bf16), whatever grade its bf16 outputs reach.
  bool fp32_outputs_required = false;
  std::vector<ConditionResult> conditions;
  bool pass = true;
  Grade grade = Grade::Fp32;         // reached: fp32 (every row within 1e-4) or bf16 (within 1e-2)
  std::vector<std::string> failing;  // names of the conditions that break it
  // The benchmark's verifier emulated: Gaussian inputs, one fixed seed, its shapes (aligned and
  // large), |v - r| <= 1e-2 + 1e-2 |r| on 99 % of elements. What the kernel passed before.
  bool benchmark_verifier_passes = true;
  uint64_t seed = 0;
  // What else the replay line must repeat to give the same table: --trace (the run whose
  // recorded values were one condition), --plugins, --draws, --grade as asked, --time-limit (a
  // hang's row names it), --condition's names as the table prints them (empty: every condition).
  std::string trace;
  std::vector<std::string> plugins;
  int draws = 3, time_limit = 120;
  Grade grade_asked = Grade::Fp32;
  std::vector<std::string> selected;
  // The variant is a benign control (documented so, or a plug-in's DIVLAB_CONTROL): analyses
  // take its runs as the noise floor, so failing here says it is none.
  bool declared_control = false;
  // cuda: a line per compute-sanitizer tool ("memcheck: ERROR SUMMARY: 0 errors"), or why none ran
  std::vector<std::string> sanitizer;
};

// Throws InputError for an unknown op/variant, an op check does not cover, or a bad backend.
// In this process: a kernel that crashes takes the caller with it (cmd_check isolates).
CheckReport run_check(const CheckOptions& opt);

// The pieces run_check is made of, for the worker process and its parent (check_isolated.cpp).
struct ConditionInfo {
  std::string name, shape;  // shape "random" for the random shapes
};
std::vector<ConditionInfo> check_conditions(const CheckOptions& opt);
struct CheckProgress {
  std::function<void(size_t)> begin;  // condition i starts; i == count: the verifier emulation
  // The kernel's calls of a draw come next (its inputs and, but under concurrent load, its
  // reference are ready): --time-limit times them. Then they have returned: divlab's own work
  // follows (judging, the next draw's inputs and fp64 reference), which on a busy machine can
  // take longer than a kernel is given at 16 M values, so it is bounded apart (kOwnWorkLimit).
  std::function<void()> kernel_calls, own_work;
  std::function<void(size_t, const ConditionResult&)> result;
  std::function<void(bool)> verifier;  // the benchmark verifier emulation's outcome
  std::function<void(bool)> control;   // CheckReport::declared_control, once the variant is known
};
// The report's header from the options (op, variant, seed: fresh unless given); throws
// InputError for what can be told without loading anything.
CheckReport new_check_report(const CheckOptions& opt);
// Loads plug-ins, opens the backend and runs conditions `from`.. into rep.conditions, then the
// benchmark verifier emulation.
void run_check_conditions(const CheckOptions& opt, CheckReport& rep, size_t from,
                          const CheckProgress& progress);
// The verdict from the conditions: pass, the failing conditions, the grade.
void finish_check_report(CheckReport& rep);
// run_check with every condition in a worker process (a fresh one after a crash or a hang).
CheckReport run_check_isolated(const CheckOptions& opt);
// The worker's side: runs the conditions and reports each to opt.worker_report. Exit code.
int run_check_worker(const CheckOptions& opt);
// The table and verdict as printed by `divlab check`.
std::string format_check(const CheckReport& r);

struct MemoryGrowth;  // kernels/op_cases.h

// What the "call 257 (warmed up)" condition says of memory that grew over its earlier calls:
// "leaks memory: ..." past the bars (host heap: 64 KiB and 256 bytes a call; device: 16 MiB, at
// least a 2 MiB page in each quarter of the calls), else empty.
std::string memory_leak_finding(const MemoryGrowth& growth);
// `divlab check`: prints the report, then with --train runs the short grid. Exit code: 0 pass,
// 1 fail.
int cmd_check(const CheckOptions& opt);

}  // namespace divlab
