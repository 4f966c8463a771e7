#include "experiments/reproduce.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "analysis/analyze.h"
#include "analysis/dose.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/paths.h"
#include "experiments/sample.h"
#include "experiments/sweep.h"
#include "kernels/backend.h"
#include "kernels/registry.h"

namespace divlab {

namespace {
// "data=brown train.optimizer=sgd" -> value of `key`, or "".
std::string label_value(const std::string& label, const std::string& key) {
  const auto at = label.find(key + "=");
  if (at == std::string::npos) return "";
  const auto start = at + key.size() + 1;
  return label.substr(start, label.find(' ', start) - start);
}

std::string table_cell(const std::string& text) {  // one markdown table cell
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

// At most `bytes` bytes of UTF-8 text, never cutting a character, on one line.
std::string clip(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return table_cell(text);
  while (bytes > 0 && (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) --bytes;
  return table_cell(text.substr(0, bytes)) + "...";
}

// What the models write, the punchline a reader remembers: for every row where a candidate
// diverged, its model and the reference model of the same seed continue the same prompt with
// the same sampling seed. Markdown for report.md; a line each on stdout.
std::string model_samples(const std::vector<Verdict>& verdicts) {
  std::string md;
  for (const auto& v : verdicts) {
    if (v.verdict != Outcome::Diverged || v.seed_traces.empty()) continue;
    SampleOptions opt;
    opt.tokens = 64, opt.temperature = 0.8, opt.seed = 1;
    const std::string bug = v.variant.substr(v.variant.find('=') + 1);
    Sample reference, candidate;
    try {
      opt.trace = v.seed_traces[0].first;
      reference = sample(opt);
      opt.trace = v.seed_traces[0].second;
      candidate = sample(opt);
    } catch (const InputError& e) {
      md += "\n" + v.group + ", `" + v.variant + "`: no text (" + e.what() + ")\n";
      continue;
    }
    char losses[160];
    std::snprintf(losses, sizeof losses,
                  "training loss at the end, mean over seeds: %.3f (reference), %.3f (%s)",
                  v.final_loss_ref, v.final_loss_ref + v.gap, bug.c_str());
    md += "\n" + v.group + ", seed " + std::to_string(v.seed_ids[0]) + "; " + losses +
          ". Both models start from the same prompt (none: token 0) and sample at temperature " +
          "0.8 with the same seed; inference uses the reference kernels.\n\n| reference | " + bug +
          " |\n| --- | --- |\n| " + table_cell(reference.text) + " | " +
          table_cell(candidate.text) + " |\n";
    std::string chain;  // on a Markov chain, how much of it each model learned
    if (reference.follows_chain >= 0) {
      char line[240];
      std::snprintf(line, sizeof line,
                    "| follows the chain: %.0f %% | follows the chain: %.0f %% |\n",
                    100 * reference.follows_chain, 100 * candidate.follows_chain);
      md += line;
      std::snprintf(line, sizeof line,
                    "\nA token follows the chain when it is its predecessor's successor in the "
                    "run's Markov chain; the data's tokens do %.0f %% of the time, plus chance.\n",
                    100 * reference.chain_follow_p);
      md += line;
      std::snprintf(line, sizeof line,
                    "follows the chain: reference %.0f %%, %s %.0f %% (the data: %.0f %%, plus "
                    "chance)",
                    100 * reference.follows_chain, bug.c_str(), 100 * candidate.follows_chain,
                    100 * reference.chain_follow_p);
      chain = line;
    }
    std::printf("\nwhat the models write (%s, seed %lld):\n  %-14s %s\n  %-14s %s\n",
                v.group.c_str(), v.seed_ids[0], "reference:", clip(reference.text, 100).c_str(),
                (bug + ":").c_str(), clip(candidate.text, 100).c_str());
    if (!chain.empty()) std::printf("  %s\n", chain.c_str());
  }
  return md.empty() ? md
                    : "\n## What the models write\n\nThe divergence as text: `divlab sample "
                      "TRACE` prints more (`--help` for prompt, temperature, kernels).\n" +
                          md;
}
}  // namespace

std::vector<Verdict> run_reproduce(const ReproduceOptions& in) {
  ReproduceOptions opt = in;
  const bool gpu = opt.backend == Backend::Cuda;
  // Refused before anything is created: without either, every cell would fail the same way.
  if (gpu)
    if (const std::string why = cuda_unavailable(); !why.empty())
      throw InputError("reproduce --backend cuda: " + why +
                       "; the CPU reproduction is `divlab reproduce`");
  // The cells share one GPU: four at a time, as measured (docs/performance.md); a cell that finds
  // its memory held by the others waits for one to end.
  if (gpu && opt.jobs == 0) opt.jobs = 4;
  if (opt.grid.empty())
    opt.grid = resource_path(gpu ? "configs/reproduce-gpu.toml" : "configs/reproduce.toml");
  if (opt.out.empty())
    opt.out = std::string("runs/reproduce") + (gpu ? "-gpu" : "") + (opt.quick ? "-quick" : "");
  const auto t0 = std::chrono::steady_clock::now();
  SweepOptions sw;
  sw.grid = opt.grid, sw.out = opt.out, sw.quick = opt.quick, sw.jobs = opt.jobs;
  sw.seed_offset = opt.seed_offset;
  const SweepSummary s = run_sweep(sw);
  std::printf("\nsweep: %d cells: %d completed, %d nan, %d failed, %d already finished\n\n",
              s.cells, s.completed, s.nan, s.failed, s.skipped);
  AnalyzeOptions an = analyze_options(opt.out);
  an.plots = opt.plots, an.verbose = false;
  auto verdicts = analyze(an);

  // The masking matrix: one row per group (data, optimizer, tokens per step) in grid order, one
  // column per variant; then how the gap grows with the dose.
  struct Row {
    int order = 0;
    std::string label;
    const Verdict* any = nullptr;
    std::map<std::string, const Verdict*> cells;
  };
  std::map<std::string, Row> rows;
  std::map<std::string, bool> columns;
  for (const auto& v : verdicts) {
    Row& row = rows[v.group];
    if (!row.any || v.first_cell < row.order) row.order = v.first_cell;
    row.any = &v;
    const std::string data = label_value(v.group, "data");
    row.label = (data.empty() ? "" : data + " / ") + label_value(v.group, "train.optimizer");
    row.cells[v.variant] = &v;
    columns[v.variant] = v.control;
  }
  std::vector<const Row*> ordered;
  ordered.reserve(rows.size());
  for (const auto& [group, row] : rows) ordered.push_back(&row);
  std::sort(ordered.begin(), ordered.end(),
            [](const Row* a, const Row* b) { return a->order < b->order; });
  std::printf("%-24s %8s %17s", "data / optimizer", "tokens", "dose (seeds)");
  for (const auto& [c, control] : columns)
    std::printf("  %-36s", (c.substr(c.find('=') + 1) + (control ? " [control]" : "")).c_str());
  std::printf("\n");
  for (const Row* row : ordered) {
    char dose[40];
    std::snprintf(dose, sizeof dose, "%.0f (%.0f-%.0f)", row->any->dose, row->any->dose_min,
                  row->any->dose_max);
    std::printf("%-24s %8.0f %17s", row->label.c_str(), row->any->tokens_per_step, dose);
    for (const auto& [c, control] : columns) {
      const auto it = row->cells.find(c);
      if (it == row->cells.end()) {
        std::printf("  %-36s", "-");
        continue;
      }
      const Verdict& v = *it->second;
      char cell[64];
      std::snprintf(cell, sizeof cell, "%s %+.4f p=%.2g",
                    v.perturbed  ? "perturbed"
                    : v.lopsided ? "lopsided"
                                 : name_of(v.verdict),
                    v.gap, v.p_welch);
      std::printf("  %-36s", cell);
    }
    std::printf("\n");
  }
  if (std::any_of(verdicts.begin(), verdicts.end(), [](const Verdict& v) { return v.perturbed; }))
    std::printf(
        "perturbed: no divergence (no consistent gap), yet every seed's loss moved "
        "further than the controls move theirs (report.md, docs/analysis.md)\n");
  if (std::any_of(verdicts.begin(), verdicts.end(), [](const Verdict& v) { return v.lopsided; }))
    std::printf(
        "lopsided: no verdict, yet the seeds' gaps are on one side (all, or most by a sign "
        "test); seeds far beyond the rest weaken Welch's t: more seeds settle it (report.md, "
        "docs/analysis.md)\n");
  const auto responses = dose_responses(verdicts);
  if (!responses.empty()) std::printf("\n%s", dose_table(responses).c_str());
  if (const std::string samples = model_samples(verdicts); !samples.empty()) {
    std::string report;
    read_file(opt.out + "/report.md", report);
    write_output_file(opt.out + "/report.md", report + samples, "reproduce: file");
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%s/report.md has the method, every number and the plots (%.0f s)\n",
              opt.out.c_str(), secs);
  return verdicts;
}

}  // namespace divlab
