#include "experiments/sanitizer_log.h"

#include <algorithm>
#include <string_view>

namespace divlab {

namespace {

// The kernel an access line names: "... access at <kernel>+0x<offset>[ in file:line][ [n
// hazards]]".
std::string_view accessed_kernel(std::string_view line) {
  const auto at = line.find(" access at ");
  if (at == std::string_view::npos) return {};
  std::string_view name = line.substr(at + 11);
  name = name.substr(0, name.find("+0x"));
  if (name.rfind("void ", 0) == 0) name.remove_prefix(5);
  return name;
}

// cuBLASLt's generated GEMMs for an architecture (nvjet_sm90_tss_64x64_64x13_1x2_h_badd_NTT on
// Hopper): a name no kernel of a plug-in is likely to take.
bool unmodelled(std::string_view kernel) {
  return kernel.rfind("nvjet_sm", 0) == 0;
}

}  // namespace

std::string SanitizerFindings::line(bool errors_exit) const {
  std::string s = summary.empty() ? "no summary line" : summary;
  if (races_unmodelled > 0)
    s += "; " + std::to_string(races_unmodelled) + " of " + std::to_string(races) +
         " race report(s) inside cuBLASLt's generated GEMMs (nvjet_sm*), whose TMA and mbarrier "
         "ordering racecheck does not model: not counted";
  if (fails(errors_exit) && !first.empty()) s += "; first: " + first;
  return s;
}

SanitizerFindings read_sanitizer_log(std::istream& log, const std::string& summary_key) {
  SanitizerFindings f;
  std::string line, first_other, pending_race;  // a race report's first access line
  // The finding quoted last, which the lines after it place: "at KERNEL+0x.. in FILE:LINE" and
  // "by thread (x,y,z) in block (x,y,z)".
  std::string* placed = nullptr;
  while (std::getline(log, line)) {
    const auto at = line.find(summary_key);
    if (at != std::string::npos) f.summary = line.substr(at);
    const auto text = line.find_first_not_of("= ");
    if (text == std::string::npos) {
      placed = nullptr;
      continue;
    }
    const std::string finding = line.substr(text);
    if (placed && (finding.rfind("at ", 0) == 0 || finding.rfind("by thread ", 0) == 0)) {
      *placed += " " + finding;
      continue;
    }
    placed = nullptr;
    if (!pending_race.empty()) {
      // A race report's second line names the other access ("and Write access at ...").
      ++f.races;
      const bool both_unmodelled =
          unmodelled(accessed_kernel(pending_race)) && unmodelled(accessed_kernel(finding));
      if (both_unmodelled)
        ++f.races_unmodelled;
      else if (f.first.empty())
        f.first = pending_race + " " + finding;
      pending_race.clear();
      continue;
    }
    if (finding.find("Race reported") != std::string::npos) {
      pending_race = finding;
    } else if (finding.rfind("Internal Sanitizer Error", 0) == 0) {
      f.internal_error = true;
      f.first = finding;
    } else if (f.first.empty() &&
               (finding.rfind("Invalid ", 0) == 0 || finding.rfind("Barrier error", 0) == 0)) {
      f.first = finding;  // memcheck's and synccheck's forms
      placed = &f.first;
    } else if (first_other.empty() && at == std::string::npos &&
               (finding.rfind("Error", 0) == 0 || finding.rfind("Warning", 0) == 0)) {
      // A finding the tool words otherwise ("Error: Potential RAW hazard ..."), quoted where
      // the summary counts one in neither form.
      first_other = finding;
      placed = &first_other;
    }
  }
  if (!pending_race.empty()) {  // a log cut after a report's first line
    ++f.races;
    if (f.first.empty()) f.first = pending_race;
  }
  if (f.first.empty()) f.first = first_other;
  return f;
}

std::string sanitizer_pass_skipped(const CheckReport& r) {
  for (const ConditionResult& c : r.conditions)
    if (c.crashed && c.why.rfind("hang:", 0) == 0)
      return "the kernel hung under '" + c.name +
             "', and the pass runs the conditions in one process, where nothing would stop it";
  return "";
}

double sanitizer_tool_seconds(double conditions_seconds) {
  return std::max(600.0, 100.0 * conditions_seconds);
}

}  // namespace divlab
