#include "analysis/analyze.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "analysis/dose.h"
#include "analysis/report.h"
#include "common/errors.h"
#include "common/lock.h"
#include "common/paths.h"
#include "common/process.h"
#include "common/sha256.h"
#include "common/utf8.h"
#include "io/sweep_folder.h"
#include "io/toml_reader.h"
#include "io/trace.h"

namespace divlab {

namespace {

std::vector<std::string> list_traces(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir((dir + "/cells").c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 3 && n.substr(n.size() - 3) == ".h5") out.push_back(dir + "/cells/" + n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// "2-8, 11, 14-15" for sorted cell numbers; past eight ranges, the first eight and "...".
std::string cell_ranges(const std::vector<size_t>& cells) {
  std::string out;
  int ranges = 0;
  for (size_t i = 0; i < cells.size();) {
    size_t j = i;
    while (j + 1 < cells.size() && cells[j + 1] == cells[j] + 1) ++j;
    if (++ranges > 8) return out + ", ...";
    out += (out.empty() ? "" : ", ") + std::to_string(cells[i]) +
           (j > i ? "-" + std::to_string(cells[j]) : "");
    i = j + 1;
  }
  return out;
}

// The identity of a run's plug-in libraries from its trace's /@plugins (`PATH sha256:HEX abi:N`
// a line): their contents alone, wherever they were loaded from. analysis/plots.py computes the
// same.
std::string plugins_build(const std::string& identity) {
  std::vector<std::string> digests;
  std::istringstream in(identity);
  for (std::string library, digest, abi; in >> library >> digest >> abi;) digests.push_back(digest);
  std::sort(digests.begin(), digests.end());
  std::string joined;
  for (const auto& d : digests) joined += (joined.empty() ? "" : "\n") + d;
  return sha256_hex(joined).substr(0, 12);
}

// A trace's losses as a run writes them, or the trace is refused (InputError): one for every
// step /metrics/step records, as many as a completed run's train.steps, and finite unless the run
// stopped on a NaN (such a run's status is "nan"). A trace edited or damaged by hand would
// otherwise give its group a gap of NaN and the verdict "no-divergence". /metrics/step is written
// last at every flush (experiments/run_trace.cpp): a writer killed mid-flush leaves the other
// series a step longer, and that step, never committed, is dropped here.
void check_losses(const std::string& path, Cell& c, int64_t steps_recorded) {
  const auto where = [&](const std::string& what) {
    return InputError("trace '" + path + "': /metrics/loss " + what);
  };
  if (steps_recorded >= 0) {
    if (int64_t(c.loss.size()) < steps_recorded)
      throw where("has " + std::to_string(c.loss.size()) + " values where /metrics/step has " +
                  std::to_string(steps_recorded));
    c.loss.resize(size_t(steps_recorded));
    if (int64_t(c.max_row.size()) > steps_recorded) c.max_row.resize(size_t(steps_recorded));
  }
  const int64_t n = int64_t(c.loss.size());
  const auto steps = c.config.find("train.steps");
  if (c.status == RunStatus::Completed && steps != c.config.end() &&
      std::to_string(n) != steps->second)
    throw where("has " + std::to_string(n) + " values where the completed run's train.steps is " +
                steps->second);
  if (c.status != RunStatus::Nan)
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(c.loss[size_t(i)]))
        throw where("is not finite at step " + std::to_string(i) + " in a run whose status is '" +
                    std::string(name_of(c.status)) + "' (a run that meets a NaN stops as 'nan')");
}

Cell load_cell(const std::string& path, const AnalyzeOptions& opt) {
  Cell c;
  c.path = path;
  const TraceReader r(path);  // InputError if not HDF5
  c.status = r.status();
  if (c.status == RunStatus::Nan) {
    auto attr = [&](const char* name) {
      try {
        return r.string_attr("/", name);
      } catch (const InputError&) {
        return std::string("?");
      }
    };
    c.nan_where = attr("nan_pass") + " " + attr("nan_op") + " layer " + attr("nan_layer") + " " +
                  attr("nan_tensor") + ", step " + attr("nan_step");
  }
  c.config =
      read_toml_texts(r.string_attr("/", "config_toml"), "trace '" + path + "': config_toml");
  // Another token stream (another corpus, or the same one under another sentencepiece version's
  // tokenizer) is another experiment: its identity groups cells as a config key does.
  if (r.exists("/dataset") && r.has_attr("/dataset", "tokens_sha256"))
    c.config["data.tokens"] = r.string_attr("/dataset", "tokens_sha256").substr(0, 12);
  // So is another build of its plug-in libraries (a sweep continued, or pooled with one, after a
  // rebuild): the same variant names, other kernels.
  if (r.has_attr("/", "plugins"))
    c.config["plugins.build"] = plugins_build(r.string_attr("/", "plugins"));
  {
    auto attr = [&](const char* name) {
      try {
        return r.string_attr("/", name);
      } catch (const InputError&) {
        return std::string("?");
      }
    };
    c.provenance =
        "divlab " + attr("git_commit") + " on " + attr("host") + " (" + attr("backend") + ")";
    if (c.status == RunStatus::Failed && r.has_attr("/", "failure"))
      c.failure = r.string_attr("/", "failure");
  }
  if (!r.exists("/metrics/loss")) throw InputError("trace '" + path + "': no /metrics/loss");
  c.loss = r.floats("/metrics/loss");
  if (r.exists("/eval/val_loss")) c.val_loss = r.floats("/eval/val_loss");
  if (r.exists("/metrics/max_row_contributions")) {
    for (int64_t v : r.ints("/metrics/max_row_contributions")) c.max_row.push_back(double(v));
  }
  check_losses(path, c, r.exists("/metrics/step") ? int64_t(r.ints("/metrics/step").size()) : -1);
  c.seed = std::stoll(c.config.count("train.seed") ? c.config["train.seed"] : "0");
  // Roles as the run recorded them (its own catalogue, plug-ins and GPU-only variants
  // included); older traces ask the caller. A run records one line per swapped kernel, so roles
  // that miss one or name another role were edited: guessing from this binary's catalogue would
  // judge a GPU-only or plug-in control as a candidate.
  std::map<std::string, bool> recorded_benign;  // "op=variant" -> control
  const bool roles_recorded = r.has_attr("/", "kernel_roles");
  if (roles_recorded) {
    std::istringstream lines(r.string_attr("/", "kernel_roles"));
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string kernel, role, extra;
      if (!(words >> kernel)) continue;
      if (!(words >> role) || (role != "control" && role != "candidate") || (words >> extra))
        throw InputError("trace '" + path + "': kernel_roles line '" + one_line(line) +
                         "' is not 'op=variant control' or 'op=variant candidate' (edited?)");
      recorded_benign[kernel] = role == "control";
    }
  }
  std::vector<std::string> swapped;
  bool all_benign = true;
  for (const auto& [key, value] : c.config) {
    if (key.rfind("kernels.", 0) != 0 || value == "reference") continue;
    const std::string op = key.substr(8), kernel = op + "=" + value;
    swapped.push_back(kernel);
    const auto it = recorded_benign.find(kernel);
    if (roles_recorded && it == recorded_benign.end())
      throw InputError("trace '" + path + "': kernel_roles does not name " + kernel +
                       ", which its config swaps in (edited?)");
    const bool benign = it != recorded_benign.end() ? it->second
                        : opt.is_benign             ? opt.is_benign(op, value)
                                                    : false;
    all_benign = all_benign && benign;
  }
  std::sort(swapped.begin(), swapped.end());
  for (const auto& s : swapped) c.variant += (c.variant.empty() ? "" : "+") + s;
  if (c.variant.empty()) c.variant = "reference";
  c.control = !swapped.empty() && all_benign;
  return c;
}

// analysis/plots.py draws the PNGs into `out` from its summary.h5 and the cells of `dirs`;
// returns "ok" or why not.
std::string run_plots(const std::string& out, const std::vector<std::string>& dirs) {
  const char* py = std::getenv("DIVLAB_PYTHON");
  SpawnOptions so;
  so.log = out + "/plots.log";
  std::vector<std::string> argv = {py && *py ? py : DIVLAB_DEFAULT_PYTHON,
                                   resource_path("analysis/plots.py"), out};
  argv.insert(argv.end(), dirs.begin(), dirs.end());
  const int status = run_process(argv, so);
  return status == 0 ? "ok" : "failed, see " + out + "/plots.log";
}

// How the sweep saw each cell's process end (manifest.tsv: trace path relative to the folder ->
// status), or nothing for a folder no sweep wrote.
std::map<std::string, std::string> sweep_statuses(const std::string& dir) {
  std::map<std::string, std::string> out;
  std::ifstream in(dir + "/manifest.tsv");
  std::string line;
  std::getline(in, line);  // header: cell, status, exit_code, seconds, trace, ...
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
    if (f.size() < 5) continue;
    const std::string& trace = f[4];
    const auto slash = trace.rfind("/cells/");
    out[slash == std::string::npos ? trace : trace.substr(slash + 1)] = f[1];
  }
  return out;
}

// Where the analysis goes, decided before anything is read or written: the one sweep folder, or
// --out, which pooled folders need and which may not be a sweep folder of its own.
std::string output_folder(const AnalyzeOptions& opt) {
  namespace fs = std::filesystem;
  if (opt.dirs.empty()) throw InputError("analyze: name a sweep folder");
  std::set<fs::path> seen;
  for (const auto& d : opt.dirs) {
    std::error_code ec;
    if (fs::exists(d, ec) && !fs::is_directory(d, ec))
      throw InputError("analyze '" + d +
                       "': not a folder (analyze takes sweep folders, the --out of divlab sweep)");
    if (!fs::is_directory(d, ec) || access(d.c_str(), R_OK) != 0)
      throw InputError("analyze '" + d + "': no such folder");
    if (!seen.insert(fs::canonical(d, ec)).second)
      throw InputError("analyze '" + d + "': named twice (each folder's seeds count once)");
  }
  if (opt.out.empty()) {
    if (opt.dirs.size() > 1)
      throw InputError("--out: pooling " + std::to_string(opt.dirs.size()) +
                       " sweep folders needs a folder of its own for the analysis");
    return opt.dirs[0];
  }
  std::error_code ec;
  // Inside a sweep's cells/, the analysis's summary.h5 would be read as a trace from then on.
  const fs::path out_path = fs::weakly_canonical(opt.out, ec);
  for (const fs::path& d : seen) {
    const fs::path cells = d / "cells";
    if (std::mismatch(cells.begin(), cells.end(), out_path.begin(), out_path.end()).first ==
        cells.end())
      throw InputError("--out '" + opt.out +
                       "': inside a sweep's cells/ folder, where every .h5 is read as a trace; "
                       "name a folder of its own");
  }
  const bool the_sweeps_own = opt.dirs.size() == 1 && seen.count(fs::weakly_canonical(opt.out, ec));
  if (the_sweeps_own) return opt.out;
  if (seen.count(fs::weakly_canonical(opt.out, ec)) || fs::exists(fs::path(opt.out) / "cells", ec))
    throw InputError("--out '" + opt.out +
                     "': a sweep folder (it holds cells/), whose own cells would disagree with "
                     "these verdicts; name a folder of its own");
  if (fs::exists(opt.out, ec) && !fs::is_directory(opt.out, ec))
    throw InputError("--out '" + opt.out + "': exists and is not a folder");
  return opt.out;
}

}  // namespace

std::vector<Verdict> analyze(const AnalyzeOptions& opt) {
  const std::string out = output_folder(opt);
  std::vector<Cell> cells;
  std::vector<std::string> unfinished;
  for (const auto& dir : opt.dirs) {
    const auto paths = list_traces(dir);
    const std::map<std::string, std::string> ended = sweep_statuses(dir);
    if (paths.empty()) {
      // A sweep whose every cell ended before writing a trace (a --timeout shorter than a
      // start-up, say): how the sweep saw them end, from its manifest.
      std::map<std::string, int> by_status;
      for (const auto& [trace, status] : ended) ++by_status[status];
      std::string seen;
      for (const auto& [status, n] : by_status)
        seen += (seen.empty() ? "" : ", ") + std::to_string(n) + " " + status;
      throw InputError("analyze '" + dir + "': no traces (expected " + dir + "/cells/*.h5)" +
                       (seen.empty() ? "" : "; its manifest.tsv lists " + seen));
    }
    for (const auto& p : paths) {
      Cell c = load_cell(p, opt);
      // A run whose process the sweep saw die (a signal, or an exit other than a result) is a
      // finding about its kernels, not an unfinished run: it gets a verdict.
      const auto it = ended.find(p.substr(dir.size() + 1));
      const bool crashed = it != ended.end() && (it->second.rfind("crashed", 0) == 0 ||
                                                 it->second.rfind("failed (exit", 0) == 0);
      const bool ended = c.status == RunStatus::Completed || c.status == RunStatus::Nan;
      if (!ended && crashed) c.crash = it->second;
      if (ended || c.crashed())
        cells.push_back(std::move(c));
      else
        unfinished.push_back(p + " (" + name_of(c.status) +
                             (c.failure.empty() ? "" : ": " + c.failure) + ")");
    }
    // The grid's cells that left no trace (a sweep stopped before it started them, or a cell
    // that ended before writing one): their seeds are missing from the verdicts, which says so.
    const std::set<std::string> traced(paths.begin(), paths.end());
    std::vector<size_t> waiting;
    for (const size_t cell : listed_cells(dir)) {
      const std::string p = cell_trace_path(dir, cell);
      if (traced.count(p) > 0) continue;
      const auto it = ended.find(p.substr(dir.size() + 1));
      if (it == ended.end() || it->second == "pending")
        waiting.push_back(cell);
      else
        unfinished.push_back(p + " (no trace; manifest.tsv: " + it->second + ")");
    }
    if (!waiting.empty())
      unfinished.push_back(std::to_string(waiting.size()) +
                           (waiting.size() == 1 ? " cell of " : " cells of ") + dir +
                           " not started (" + cell_ranges(waiting) + "): `divlab sweep --out " +
                           dir + "` runs them");
  }
  if (cells.empty()) {
    std::string dirs;
    for (const auto& d : opt.dirs) dirs += (dirs.empty() ? "'" : ", '") + d + "'";
    const size_t more = unfinished.size() - 1;
    throw InputError("analyze " + dirs + ": no run has finished yet; left out: " + unfinished[0] +
                     (more > 0 ? " and " + std::to_string(more) + " more" : ""));
  }
  ReportContext ctx;
  ctx.dir = out, ctx.alpha = opt.alpha, ctx.unfinished = unfinished;
  if (opt.dirs.size() > 1 || opt.dirs[0] != out) ctx.sources = opt.dirs;
  for (const auto& c : cells) ctx.provenance.insert(c.provenance);
  std::vector<Verdict> verdicts = compute_verdicts(std::move(cells), opt.alpha);  // may refuse
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) throw InputError("--out '" + out + "': cannot create it: " + ec.message());
  WriterLock lock(out + "/analyze.lock", "the analysis in '" + out + "'");
  const auto responses = dose_responses(verdicts);
  write_tables(out, verdicts, responses);  // summary.h5 first: the plots read it
  ctx.plots = opt.plots ? run_plots(out, opt.dirs) : "not requested (--no-plots)";
  write_report(ctx, verdicts, responses);
  lock.done();
  if (opt.verbose) print_verdicts(ctx, verdicts, responses);
  return verdicts;
}

}  // namespace divlab
