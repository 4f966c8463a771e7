// What `divlab analyze` writes from its verdicts: verdicts.csv (one column list drives its header
// and rows, one column per distinguishing grid key), seeds.csv, dose_response.csv, summary.h5
// (what analysis/plots.py draws), report.md and the terminal table.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "analysis/dose.h"
#include "analysis/verdicts.h"

namespace divlab {

struct ReportContext {
  std::string dir;                      // the analysis folder: everything is written there
  std::vector<std::string> sources;     // the sweep folders read, when not `dir` itself
  double alpha = 0.05;                  // the tests' level, stated in the report
  std::vector<std::string> unfinished;  // traces left out, with their status
  std::string plots;                    // "ok", or why there are none
  std::set<std::string> provenance;     // who wrote the traces: "divlab COMMIT on HOST (BACKEND)"
};

// verdicts.csv, seeds.csv, dose_response.csv and summary.h5 (written whole, then renamed).
void write_tables(const std::string& dir, const std::vector<Verdict>& verdicts,
                  const std::vector<DoseResponse>& responses);
// report.md: headline, provenance, the story figure, the table, rows without a verdict, the dose
// series and the plots.
void write_report(const ReportContext& ctx, const std::vector<Verdict>& verdicts,
                  const std::vector<DoseResponse>& responses);
// How far a candidate moved each seed's loss against the controls, in words ("each seed's final
// loss moved 15x as far as the controls (root mean square ...)"), and the sentence that explains
// a row marked perturbed.
std::string shift_words(const Verdict& v);
std::string perturbed_words(const Verdict& v);
// The sentence for a row marked lopsided: every seed on one side, no verdict from Welch's t.
std::string lopsided_words(const Verdict& v);
// The verdict table, rows without a verdict, the dose series, and where everything went.
void print_verdicts(const ReportContext& ctx, const std::vector<Verdict>& verdicts,
                    const std::vector<DoseResponse>& responses);

}  // namespace divlab
