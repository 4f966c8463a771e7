// `divlab check`'s report: the table, the verdict and what a failure says (the fp32 grade's
// diagnosis, a leak's wording), from the conditions experiments/check.cpp ran.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"
#include "experiments/check.h"
#include "experiments/check_judge.h"
#include "kernels/op_cases.h"

namespace divlab {

namespace {
constexpr size_t kDetailedFailures = 4;  // failing conditions whose worst element is printed
const char* kCriteria =
    "criteria: in every draw of every condition, every output within normalised error "
    "max|v - r| / max|r| <= 1e-2 of the fp64 reference (plus twice what rounding the inputs "
    "to bf16 moves the exact result, where cancellation makes that more; every element counts: "
    "no 99 % "
    "exemption, so a hot embedding row cannot hide; outputs the op adds into are judged on the "
    "kernel's own contribution), within 1e-4 (fp32 grade) unless --grade bf16 or --precision "
    "bf16 (where the outputs the bf16 mode keeps in fp32 still are), finite where the "
    "reference is, every row the reference updates updated and no other, "
    "no writes outside the outputs, and no systematic bias (per output, |sum(|v| - |r|)| / "
    "sum|r| <= 1e-3 against the reference rounded to bf16 where the output holds bf16 values, "
    "judged where >= 4096 values carry the sum). 'row err' (worst row's relative L2) is judged "
    "against 1e-2 under 'rows scaled 1e-3..1e3', where rows differ in size by up to 1e6, and "
    "shown elsewhere";
}  // namespace

// Memory that kept growing after the first calls (check_conditions.h: "call 257"): a kernel that
// allocates at every call and never releases (a workspace of its own instead of its context's)
// ends a long run out of memory. Below the bars: allocator noise, a cache that settled. The
// device's reading counts every process on the GPU, so its growth must show in every quarter of
// the calls, net of what it grew in an equal wait after them (op_cases.h): another process's
// allocations are steps in one or two quarters, or go on while the probe waits.
constexpr int64_t kLeakHostBytes = 64 << 10, kLeakHostBytesPerCall = 256;
constexpr int64_t kLeakDeviceBytes = 16 << 20;        // the device's pages are 2 MiB
constexpr int64_t kLeakDeviceQuarterBytes = 2 << 20;  // at least a page in each quarter

std::string memory_leak_finding(const MemoryGrowth& g) {
  const auto mib = [](int64_t bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f MiB", double(bytes) / double(1 << 20));
    return std::string(b);
  };
  std::string where;
  if (g.host >= kLeakHostBytes && g.host >= kLeakHostBytesPerCall * g.calls)
    where = "host heap +" + mib(g.host);
  const auto quarters = g.device_quarters;
  const bool every_quarter = std::all_of(quarters.begin(), quarters.end(),
                                         [](int64_t b) { return b >= kLeakDeviceQuarterBytes; });
  if (g.device >= kLeakDeviceBytes && every_quarter) {
    where += (where.empty() ? "" : ", ") + std::string("device memory +") + mib(g.device) + " (";
    for (size_t q = 0; q < quarters.size(); ++q) where += (q ? ", +" : "+") + mib(quarters[q]);
    where += " a quarter, net of equal waits)";
  }
  if (where.empty()) return "";
  return "leaks memory: " + where + " over calls " + std::to_string(kLeakFrom + 1) + "-" +
         std::to_string(kLeakFrom + g.calls) +
         " (allocated at every call and never released? the context's workspace is reused)";
}

namespace {
// What the fp32 grade's failure says. Reduced-precision arithmetic moves every result, so it
// shows under most conditions; an error past 1e-4 under a few conditions only, while the others
// stay fp32-exact, is a part of the result lost or added where those conditions' sizes or values
// reach (a dropped last row past some size, a sum cut short), whatever its size.
std::string fp32_grade_diagnosis(const CheckReport& r) {
  if (r.failing.size() > 1)
    return "besides the failures named, outputs off by more than 1e-4 but within 1e-2 (the table's "
           "'bf16-grade' rows): reduced-precision arithmetic inside an fp32 kernel, or the same "
           "fault at a smaller size; --grade bf16 forgives only this";
  std::vector<std::string> coarse;
  int exact = 0;
  for (const ConditionResult& c : r.conditions) {
    if (!c.ran || c.failed) continue;
    if (c.grade_error() > kFp32Grade)
      coarse.push_back("'" + c.name + "'");
    else
      ++exact;
  }
  if (!coarse.empty() && coarse.size() <= 2 && exact >= 4 * int(coarse.size())) {
    std::string where = coarse[0] + (coarse.size() > 1 ? " and " + coarse[1] : "");
    return "some output is off by more than 1e-4 only under " + where + ", while " +
           std::to_string(exact) +
           " other conditions stay within it: reduced-precision arithmetic would show under "
           "most of them, so more likely a part of the result is lost or added where " +
           (coarse.size() > 1 ? "these conditions'" : "this condition's") +
           " sizes or values reach (a row dropped past some size, a sum cut short); "
           "--grade bf16 accepts it";
  }
  return "reduced-precision arithmetic inside an fp32 kernel: some output is off by more than "
         "1e-4 (the table's 'bf16-grade' rows); --grade bf16 accepts it";
}

// What the bf16 mode's fp32 outputs' failure says: the condition where they are furthest off.
std::string fp32_outputs_diagnosis(const CheckReport& r) {
  const ConditionResult* worst = nullptr;
  for (const ConditionResult& c : r.conditions)
    if (c.ran && !c.failed && (!worst || c.fp32_outputs_error > worst->fp32_outputs_error))
      worst = &c;
  if (!worst) return "";
  return "the bf16 mode keeps the residual stream, weights and gradients in fp32, and this "
         "op's fp32 outputs are off by " +
         format_e(worst->fp32_outputs_error) + " (more than 1e-4) under '" + worst->name +
         "' (worst element " + worst->fp32_outputs_worst +
         "): computed, summed or stored in bf16 on the way? --grade bf16 accepts it";
}

// The command that gives `r`'s table again; with `alone`, only that condition's row.
std::string replay_command(const CheckReport& r, const std::string& alone) {
  std::string c =
      "divlab check " + shell_word(r.op + "=" + r.variant) + " --seed " + std::to_string(r.seed);
  if (r.backend != Backend::Cpu) c += std::string(" --backend ") + name_of(r.backend);
  if (r.precision != Precision::Fp32) c += std::string(" --precision ") + name_of(r.precision);
  if (r.grade_asked != Grade::Fp32) c += std::string(" --grade ") + name_of(r.grade_asked);
  if (r.draws != CheckOptions{}.draws) c += " --draws " + std::to_string(r.draws);
  if (r.time_limit != CheckOptions{}.time_limit)
    c += " --time-limit " + std::to_string(r.time_limit);
  if (!r.trace.empty()) c += " --trace " + shell_word(r.trace);
  for (const std::string& p : r.plugins) c += " --plugins " + shell_word(p);
  if (!alone.empty()) return c + " --condition " + shell_word(alone);
  for (const std::string& name : r.selected) c += " --condition " + shell_word(name);
  return c;
}
}  // namespace

std::string format_check(const CheckReport& r) {
  std::ostringstream o;
  char line[640];
  o << "divlab check " << r.op << "=" << r.variant << " (" << name_of(r.backend) << ", "
    << name_of(r.precision) << ", seed " << r.seed << "): "
    << (r.selected.empty() ? "every condition"
                           : std::to_string(r.selected.size()) + " of " +
                                 std::to_string(r.conditions.size()) + " conditions (--condition)")
    << " against the op's reference in fp64\n";
  std::snprintf(line, sizeof line, "%-22s %-24s %5s %9s %9s %8s %10s  %s\n", "condition", "shape",
                "draws", "error", "row err", "verifier", "bias", "result");
  o << line;
  for (const auto& c : r.conditions) {
    if (!c.selected) continue;
    if (!c.ran || c.crashed) {
      if (c.crashed) {
        std::snprintf(line, sizeof line, "%-22s %-24s %5s %9s %9s %8s %10s  FAIL: %s\n",
                      c.name.c_str(), c.shape.c_str(), "-", "-", "-", "-", "-", c.why.c_str());
        o << line;
        continue;
      }
      std::snprintf(line, sizeof line, "%-22s %-24s %5s %9s %9s %8s %10s  skipped: %s\n",
                    c.name.c_str(), c.shape.c_str(), "-", "-", "-", "-", "-", c.note.c_str());
      o << line;
      continue;
    }
    std::string result = c.failed                       ? "FAIL: " + c.why
                         : c.grade_error() > kFp32Grade ? "ok (bf16-grade)"
                         : c.norm_error > kFp32Grade
                             ? "ok (fp32: within what fp32 moves on this input)"
                             : "ok";
    if (!c.failed && r.fp32_outputs_required && c.fp32_outputs_error > kFp32Grade)
      result += "; fp32 outputs off by " + format_e(c.fp32_outputs_error);
    std::snprintf(line, sizeof line, "%-22s %-24s %5d %9s %9s %8s %+10.2e  %s%s\n", c.name.c_str(),
                  c.shape.c_str(), c.draws, format_e(c.norm_error).c_str(),
                  format_e(c.row_error).c_str(),
                  c.verifier_pass >= 0.99 && c.finite ? "pass" : "FAIL", c.bias, result.c_str(),
                  c.note.empty() ? "" : ("; " + c.note).c_str());
    o << line;
  }
  o << "\n";
  if (r.pass) {
    o << "verdict: PASS (" << name_of(r.grade) << "-grade";
    if (r.grade == Grade::Bf16) o << ": within 1e-2 but not 1e-4; not an fp32-exact kernel";
    o << ")\n";
  } else {
    o << "verdict: FAIL under:";
    for (const auto& f : r.failing) o << " [" << f << "]";
    o << "\n";
    if (r.declared_control)
      o << "  " << r.op << "=" << r.variant
        << " is declared a benign control (the op's math, different only in rounding), and it "
           "fails: it is none. Analyses take a control's runs as the noise floor every candidate "
           "beside it is judged against (drop DIVLAB_CONTROL, or fix the kernel)\n";
    // The grade's failure alone is what --grade bf16 forgives; beside other failures the same
    // small error may be the named fault at a smaller size, and the grade would not pass it.
    if (std::find(r.failing.begin(), r.failing.end(), kFp32GradeCondition) != r.failing.end())
      o << "  [" << kFp32GradeCondition << "] " << fp32_grade_diagnosis(r) << "\n";
    if (std::find(r.failing.begin(), r.failing.end(), kFp32OutputsCondition) != r.failing.end())
      o << "  [" << kFp32OutputsCondition << "] " << fp32_outputs_diagnosis(r) << "\n";
    size_t detailed = 0;
    for (const auto& c : r.conditions) {
      if (!c.failed || detailed++ >= kDetailedFailures) continue;
      if (!c.worst.empty())
        o << "  [" << c.name << "] worst element at " << c.shape << ": " << c.worst << "\n";
      if (!c.smallest.empty())
        o << "  [" << c.name << "] smallest failing shape: " << c.smallest << "\n";
    }
    o << "replay: " << replay_command(r, "") << "\n";
    // A kernel's author fixing the first failure reruns its condition alone: seconds, not the
    // whole table's minutes, and the same draws.
    const auto first = std::find_if(r.conditions.begin(), r.conditions.end(),
                                    [](const ConditionResult& c) { return c.failed; });
    if (first != r.conditions.end() && r.selected.size() != 1)
      o << "its first failure alone: " << replay_command(r, first->name) << "\n";
    if (r.benchmark_verifier_passes)
      o << "note: the benchmark verifier (Gaussian inputs, one fixed seed, its shapes, |v - r| <= "
           "1e-2 + 1e-2 |r| for 99 % of elements), emulated, passes it: it would have accepted "
           "this kernel.\n";
  }
  for (const std::string& line : r.sanitizer) o << "compute-sanitizer " << line << "\n";
  o << kCriteria << "\n";
  return o.str();
}

}  // namespace divlab
