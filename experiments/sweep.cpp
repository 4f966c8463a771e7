#include "experiments/sweep.h"

#include <fcntl.h>
#include <omp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/lock.h"
#include "common/paths.h"
#include "common/process.h"
#include "common/signals.h"
#include "experiments/config.h"
#include "experiments/crash_report.h"
#include "experiments/grid.h"
#include "experiments/train.h"
#include "io/sweep_folder.h"
#include "io/trace.h"
#include "kernels/backend.h"
#include "kernels/plugins.h"
#include "kernels/registry.h"

namespace divlab {

namespace {

using Clock = std::chrono::steady_clock;

// What a cell that ended badly said last, one line for the manifest: a crash report (naming the
// op, its variant and the step) for a cell a signal or a kernel's exit() ended; for one that
// exited with an error, its log's last line when that is divlab's error line (an earlier warning
// must not pass for it).
std::string last_words(const std::string& log, bool signalled) {
  std::ifstream in(log);
  std::string line, last, crash;
  while (std::getline(in, line)) {
    if (line.rfind(CrashReport::kPrefix, 0) == 0)
      crash = line.substr(std::string(CrashReport::kPrefix).size());
    if (!line.empty()) last = line;
  }
  std::string said = signalled || !crash.empty()      ? crash
                     : last.rfind("divlab: ", 0) == 0 ? last.substr(8)
                                                      : "";
  for (char& c : said)
    if (c == '\t' || c == '\r') c = ' ';
  return said;
}

std::string read_all(const std::string& path) {
  std::string text;
  read_file(path, text);
  return text;
}

void write_atomically(const std::string& path, const std::string& text) {
  write_output_file(path, text, "sweep: file");
}

// How a trace finished (completed with every step it was asked for, or stopped on NaN: a
// finding, not a failure) that no live process is still writing; nothing for any other.
std::optional<RunStatus> finished_status(const std::string& trace) {
  if (access(trace.c_str(), R_OK) != 0 || lock_holder(trace + ".lock") != 0) return std::nullopt;
  try {
    const TraceReader r(trace);
    const RunStatus s = r.status();
    if (s == RunStatus::Nan) return s;
    if (s != RunStatus::Completed) return std::nullopt;
    const auto steps = r.ints("/metrics/step").size();
    if (double(steps) >= r.number_attr("/config", "train.steps")) return s;
  } catch (const InputError&) {
  }
  return std::nullopt;
}

// The copy of the grid's base config that cells run from.
std::string frozen_base_config(const std::string& dir) {
  return dir + "/base.toml";
}

// Creates DIR and DIR/cells, or checks that an existing DIR belongs to this grid; with `lock`,
// takes the folder's writer lock (into `held`) before writing anything into it.

void prepare_dir(const std::string& dir, const Grid& g, bool lock,
                 std::unique_ptr<WriterLock>& held, const std::string& other_grid_hint) {
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw InputError("--out '" + dir + "': exists and is not a folder");
    const std::string id_file = dir + "/grid.id";
    if (access(id_file.c_str(), F_OK) == 0) {
      std::string id = read_all(id_file);
      while (!id.empty() && (id.back() == '\n')) id.pop_back();
      if (id != g.id)
        throw InputError("--out '" + dir + "' holds the cells of another grid (grid.id differs); " +
                         (other_grid_hint.empty() ? "choose another folder" : other_grid_hint));
    } else if (access((dir + "/cells").c_str(), F_OK) == 0) {
      throw InputError("--out '" + dir + "' holds cells but no grid.id; choose another folder");
    }
    if (access(dir.c_str(), W_OK) != 0) throw InputError("--out '" + dir + "': not writable");
  } else {
    // Parents too (runs/ in a fresh checkout), as `mkdir -p` would.
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
      throw InputError("--out '" + dir + "': cannot create the folder (" + ec.message() + ")");
  }
  // One sweep per folder (job-array tasks, which share it, pass lock = false).
  if (lock) held = std::make_unique<WriterLock>(dir + "/sweep.lock", "--out '" + dir + "'");
  mkdir((dir + "/cells").c_str(), 0755);
  write_atomically(dir + "/grid.id", g.id + "\n");
  // The grid and its base config are frozen here, and every cell runs from these copies: an
  // edit to the originals during a sweep changes nothing (a re-run with an edited one is refused
  // above, by grid.id, which hashes both).
  write_atomically(dir + "/grid.toml", read_all(g.path));
  if (!g.base_config.empty()) write_atomically(frozen_base_config(dir), g.base_config_text);
  std::ostringstream cells;
  cells << "cell\toverrides\n";
  for (size_t i = 0; i < g.size(); ++i) {
    cells << i << "\t";
    for (const auto& o : g.cells[i]) cells << o << " ";
    cells << "\n";
  }
  write_atomically(dir + "/cells.tsv", cells.str());
}

struct Running {
  size_t cell;
  pid_t pid;
  Clock::time_point start;
};

struct Record {
  std::string status = "pending";
  int exit_code = 0;
  double seconds = 0;
};

std::string clock_text(double seconds) {
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// A sweep's progress: on a terminal one status line rewritten in place (cells done, running and
// in all, elapsed, ETA, the last cell's outcome), with failures kept above it; in a pipe or log
// one line per finished cell with the same counts.
class SweepProgress {
 public:
  SweepProgress(bool enabled, size_t to_run)
      : enabled_(enabled),
        terminal_(isatty(STDOUT_FILENO)),
        to_run_(to_run),
        start_(Clock::now()) {}
  void cell_ended(size_t done, size_t running, size_t cell, const std::string& status,
                  double seconds, const std::string& label) {
    if (!enabled_) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const std::string eta =
        done < to_run_ ? clock_text(elapsed / double(done) * double(to_run_ - done)) : "0:00";
    char counts[160];
    std::snprintf(counts, sizeof counts, "[%zu/%zu] %zu running, %s elapsed, ETA %s", done, to_run_,
                  running, clock_text(elapsed).c_str(), eta.c_str());
    const std::string event = "cell " + std::to_string(cell) + " " + status + " in " +
                              std::to_string(int(seconds)) + " s: " + label;
    const bool bad = status.rfind("completed", 0) != 0 && status != "nan";
    if (!terminal_) {
      std::cout << counts << " | " << event << std::endl;
    } else {
      if (bad) std::cout << "\r\033[K" << event << "\n";
      std::string line = std::string(counts) + " | last: " + event;
      if (line.size() > 150) line = line.substr(0, 147) + "...";
      std::cout << "\r\033[K" << line << (done == to_run_ ? "\n" : "") << std::flush;
    }
  }
  // Before any other line while the status line is showing.
  void interrupt() {
    if (enabled_ && terminal_) std::cout << "\r\033[K" << std::flush;
  }

 private:
  bool enabled_, terminal_;
  size_t to_run_;
  Clock::time_point start_;
};

// Asked to stop: each running cell gets SIGTERM, finishes its step and records "interrupted"
// (a re-run of the sweep runs it again); one that has not ended within --stop-grace is killed.
// No cell outlives the sweep.
void stop_cells(std::vector<Running>& running, std::vector<Record>& rec, const SweepOptions& opt) {
  if (opt.verbose && !running.empty())
    std::cout << "stopping " << running.size() << " running cell(s)" << std::endl;
  for (const Running& r : running) kill(r.pid, SIGTERM);
  const auto asked = Clock::now();
  bool killed = false;
  while (!running.empty()) {
    for (size_t i = 0; i < running.size();) {
      int status = 0;
      if (waitpid(running[i].pid, &status, WNOHANG) == 0) {
        ++i;
        continue;
      }
      const size_t cell = running[i].cell;
      rec[cell].status = "interrupted";
      rec[cell].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      // A cell stuck past the grace (in a kernel that never returns, say) could not record
      // "interrupted": its killed writer left the trace "running". A re-run runs it again.
      if (killed) {
        std::ostringstream why;
        why << "interrupted: killed " << opt.stop_grace_s
            << " s after the sweep asked it to stop (its step did not end)";
        record_crash_after_writer(cell_trace_path(opt.out, cell), why.str(), 10);
      }
      running.erase(running.begin() + long(i));
    }
    if (running.empty()) break;
    if (!killed && std::chrono::duration<double>(Clock::now() - asked).count() > opt.stop_grace_s) {
      for (const Running& r : running) kill(r.pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void write_manifest(const std::string& dir, const Grid& g, const std::vector<Record>& rec) {
  std::ostringstream m;
  m << "cell\tstatus\texit_code\tseconds\ttrace\tlog\tsettings\n";  // no pandas-reserved names
  for (size_t i = 0; i < g.size(); ++i)
    m << i << "\t" << rec[i].status << "\t" << rec[i].exit_code << "\t" << rec[i].seconds << "\t"
      << cell_trace_path(dir, i) << "\t" << cell_log_path(dir, i) << "\t" << g.describe(i) << "\n";
  write_atomically(dir + "/manifest.tsv", m.str());
}

pid_t spawn_cell(const Grid& g, size_t cell, const std::string& dir, int threads) {
  std::vector<std::string> args = {self_exe(), "train", "--quiet", "--force"};
  if (!g.base_config.empty()) args.insert(args.end(), {"--config", frozen_base_config(dir)});
  args.push_back("--set");
  for (const auto& o : g.cells[cell]) args.push_back(o);
  args.push_back("train.threads=" + std::to_string(threads));
  args.insert(args.end(), {"--out", cell_trace_path(dir, cell)});
  // The cell dies with the sweep (spawn_process). Its own process group: a terminal's Ctrl-C
  // reaches the sweep alone, which stops its cells in order instead of racing them.
  SpawnOptions so;
  so.log = cell_log_path(dir, cell);
  so.own_process_group = true;
  return spawn_process(args, so);
}

// The resources of the emitted scripts: the command line's, else the grid's [slurm] table's.
std::map<std::string, std::string> slurm_resources(const Grid& g, const SlurmResources& cli) {
  std::map<std::string, std::string> r = g.slurm;
  auto set = [&](const char* key, const std::string& v) {
    if (!v.empty()) r[key] = v;
  };
  set("time", cli.time), set("mem", cli.mem), set("partition", cli.partition);
  set("account", cli.account), set("setup", cli.setup);
  if (cli.gpus_per_task >= 0) r["gpus_per_task"] = std::to_string(cli.gpus_per_task);
  if (cli.cpus_per_task >= 0) r["cpus_per_task"] = std::to_string(cli.cpus_per_task);
  if (!r.count("cpus_per_task")) r["cpus_per_task"] = "2";
  // A cell whose ranks run over NCCL needs a GPU per rank on its node (divlab starts the ranks
  // there): the array asks for the most any cell needs, unless told, and never for fewer.
  int need = 0;
  size_t needing = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const RunConfig cfg = parse_config_text(g.base_config_text, g.base_config, g.cells[i]);
    if (cfg.data_parallel == RankTransport::Nccl && cfg.ranks > need) need = cfg.ranks, needing = i;
  }
  if (need > 0 && !r.count("gpus_per_task")) r["gpus_per_task"] = std::to_string(need);
  if (need > 0 && std::stoll(r["gpus_per_task"]) < need)
    throw InputError("slurm gpus_per_task = " + r["gpus_per_task"] + ": cell " +
                     std::to_string(needing) + " (" + g.describe(needing) + ") runs " +
                     std::to_string(need) + " ranks over NCCL, one GPU each");
  for (const auto& [key, value] : r)
    if (value.find_first_of("\r\n") != std::string::npos)
      throw InputError("slurm " + key + ": must be one line");
  const long long cpus = std::stoll(r["cpus_per_task"]);
  if (cpus < 1 || cpus > kMaxThreads)  // a cell's threads
    throw InputError("slurm cpus_per_task = " + r["cpus_per_task"] + ": must be 1 to " +
                     std::to_string(kMaxThreads));
  // What sbatch would refuse at submission, after the folder was written: refused here. (Names
  // are left alone: Slurm's accounts may hold spaces, which the directive quotes.)
  struct Form {
    const char *key, *pattern, *expected;
  };
  const Form forms[] = {
      {"time", "(\\d+-)?\\d+(:\\d{1,2}){0,2}|UNLIMITED|INFINITE|unlimited|infinite",
       "minutes, H:MM:SS or D-HH:MM:SS"},
      {"mem", "\\d+[KMGTkmgt]?", "a size such as 8G or 4000M"}};
  for (const Form& f : forms)
    if (r.count(f.key) && !std::regex_match(r[f.key], std::regex(f.pattern)))
      throw InputError(std::string("slurm ") + f.key + " = '" + r[f.key] +
                       "': sbatch would refuse it (expected " + f.expected + ")");
  return r;
}

// An #SBATCH value: Slurm splits directives like a shell, so one with spaces is quoted.
std::string directive_value(const std::string& v) {
  return v.find_first_of(" \t") == std::string::npos ? v : "\"" + v + "\"";
}

void emit_slurm(const Grid& g, const SweepOptions& opt,
                const std::map<std::string, std::string>& res) {
  const std::string exe = shell_word(self_exe()), out = shell_word(opt.out);
  auto directives = [&](std::ostream& s, bool cells) {
    for (const auto& [key, flag] :
         std::vector<std::pair<std::string, std::string>>{{"time", "time"},
                                                          {"mem", "mem"},
                                                          {"partition", "partition"},
                                                          {"account", "account"}}) {
      if (res.count(key)) s << "#SBATCH --" << flag << "=" << directive_value(res.at(key)) << "\n";
    }
    if (cells && res.count("gpus_per_task"))
      s << "#SBATCH --gpus-per-task=" << res.at("gpus_per_task") << "\n";
  };
  auto setup = [&](std::ostream& s) {
    s << "set -e\n";
    if (res.count("setup")) s << res.at("setup") << "\n";
  };
  std::ostringstream array, analyze, submit;
  array << "#!/bin/bash\n#SBATCH --job-name=divlab-sweep\n#SBATCH --array=0-" << g.size() - 1
        << "\n#SBATCH --cpus-per-task=" << res.at("cpus_per_task") << "\n";
  directives(array, true);
  array << "#SBATCH --output=" << directive_value(opt.out + "/cells/slurm-%a.log") << "\n"
        << "# One grid cell per array task, from the grid frozen in the sweep folder; cells\n"
        << "# already finished are skipped. Each cell uses the task's CPUs as its threads.\n";
  setup(array);
  array << "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-" << res.at("cpus_per_task") << "}\n"
        << "exec " << exe << " sweep --out " << out << (opt.quick ? " --quick" : "")
        << (opt.seed_offset ? " --seed-offset " + std::to_string(opt.seed_offset) : "")
        << " --cell \"$SLURM_ARRAY_TASK_ID\"\n";
  analyze << "#!/bin/bash\n#SBATCH --job-name=divlab-analyze\n#SBATCH --cpus-per-task=1\n";
  directives(analyze, false);
  analyze << "#SBATCH --output=" << directive_value(opt.out + "/analyze.log") << "\n";
  setup(analyze);
  analyze << "exec " << exe << " analyze " << out << "\n";
  submit << "#!/bin/bash\n# Submits the sweep as a job array, then the analysis once every task "
            "has ended.\nset -e\ncd \"$(dirname \"$0\")\"\njid=$(sbatch --parsable sweep.slurm)\n"
            "sbatch --dependency=afterany:$jid analyze.slurm\n";
  write_atomically(opt.out + "/sweep.slurm", array.str());
  write_atomically(opt.out + "/analyze.slurm", analyze.str());
  write_atomically(opt.out + "/submit.sh", submit.str());
  chmod((opt.out + "/submit.sh").c_str(), 0755);
}

}  // namespace

AnalyzeOptions analyze_options(const std::string& dir) {
  AnalyzeOptions an;
  an.dirs = {dir};
  an.is_benign = cpu_variant_is_benign;
  return an;
}

namespace {
// A sweep continued after its plug-in libraries were rebuilt would pool two builds' cells under
// one variant name: refused, judged by the first finished cell that recorded its libraries.
void check_cells_plugins(const Grid& g, const std::string& out) {
  if (loaded_plugins().empty()) return;
  for (size_t i = 0; i < g.size(); ++i) {
    const std::string path = cell_trace_path(out, i);
    if (!finished_status(path)) continue;
    const TraceReader r(path);
    if (!r.has_attr("/", "plugins")) continue;
    if (const std::string changed = changed_plugin(r.string_attr("/", "plugins")); !changed.empty())
      throw InputError("--out '" + out + "': cell " + std::to_string(i) + " ran with another " +
                       "build: " + changed + "; the new build's cells need a folder of their own");
    return;
  }
}
}  // namespace

namespace {
// The host memory a sweep's cells may hold together, and each cell's share of it: its run's
// prediction (experiments/train.h) and the process's own margin, as its run's check counts them.
class HostBudget {
 public:
  HostBudget(const Grid& g, const std::vector<size_t>& todo, double memory_gib, int jobs) {
    need_.assign(g.size(), 0);
    int64_t largest = 0;
    for (size_t cell : todo)
      if (g.host_bytes.at(cell) > 0)
        largest = std::max(largest, need_[cell] = g.host_bytes[cell] + int64_t(kHostProcessMargin));
    const bool given = memory_gib > 0;
    // (Past 2^62 bytes every budget is the same: none.)
    bytes_ = given ? int64_t(std::min(memory_gib * double(int64_t(1) << 30), 0x1p62))
                   : int64_t(available_host_memory());
    if (bytes_ <= 0) bytes_ = std::numeric_limits<int64_t>::max();  // unknown: no budget
    together_ =
        int(std::min<int64_t>(jobs, largest > 0 ? std::max<int64_t>(1, bytes_ / largest) : jobs));
    if (together_ < jobs) {
      char text[200];
      std::snprintf(text, sizeof text,
                    "sweep: cells need up to %.2f GiB of host memory each, %.2f GiB %s: %d at "
                    "a time",
                    double(largest) / double(1 << 30), double(bytes_) / double(1 << 30),
                    given ? "given (--memory)" : "available", together_);
      note_ = text;
    }
  }
  int64_t need(size_t cell) const { return need_.at(cell); }
  int64_t bytes() const { return bytes_; }
  // How many of the largest cells fit together (at most --jobs).
  int together() const { return together_; }
  const std::string& note() const { return note_; }

 private:
  std::vector<int64_t> need_;
  int64_t bytes_ = 0;
  int together_ = 1;
  std::string note_;
};
}  // namespace

SweepSummary run_sweep(const SweepOptions& opt) {
  accept_stop_requests();  // a signal now stops the cells in order (signals.h)
  if (opt.out.empty()) throw InputError("--out: an output folder is required");
  // Without --config, the grid frozen in the folder (job-array tasks run from it).
  const std::string frozen_grid = opt.out + "/grid.toml", frozen_base = frozen_base_config(opt.out);
  if (opt.grid.empty() && access(frozen_grid.c_str(), F_OK) != 0)
    throw InputError("--config: the grid to sweep is required (--out '" + opt.out +
                     "' holds no frozen grid.toml)");
  const Grid g = opt.grid.empty()
                     ? load_grid(frozen_grid, opt.quick, opt.seed_offset,
                                 access(frozen_base.c_str(), F_OK) == 0 ? frozen_base : "")
                     : load_grid(opt.grid, opt.quick, opt.seed_offset);
  if (opt.cell >= int(g.size()))
    throw InputError("--cell " + std::to_string(opt.cell) + ": the grid has " +
                     std::to_string(g.size()) + " cells (0.." + std::to_string(g.size() - 1) + ")");
  if (opt.jobs < 0) throw InputError("--jobs " + std::to_string(opt.jobs) + ": must be >= 0");
  if (!(opt.memory_gib >= 0) || !std::isfinite(opt.memory_gib)) {
    std::ostringstream given;
    given << opt.memory_gib;
    throw InputError("--memory " + given.str() + ": must be a number of GiB >= 0");
  }
  for (const auto& [name, seconds] :
       {std::pair{"--timeout", opt.timeout_s}, std::pair{"--stop-grace", opt.stop_grace_s}})
    if (!(seconds >= 0) || !std::isfinite(seconds)) {
      std::ostringstream given;  // as typed (-1, not std::to_string's -1.000000)
      given << seconds;
      throw InputError(std::string(name) + " " + given.str() +
                       ": must be a number of seconds >= 0");
    }
  // Cells this machine cannot run would each fail the same way: refused before the folder is
  // touched, unless they are to run elsewhere (--emit-slurm, or one --cell from a job array).
  if (g.first_cuda_cell >= 0 && !opt.emit_slurm && opt.cell < 0)
    if (const std::string why = cuda_unavailable(); !why.empty())
      throw InputError("grid '" + g.path + "', cell " + std::to_string(g.first_cuda_cell) + " (" +
                       g.describe(size_t(g.first_cuda_cell)) + "): backend = \"cuda\": " + why +
                       " (--emit-slurm writes the job array for a GPU machine)");
  if (opt.cell < 0 && !opt.emit_slurm) check_cells_plugins(g, opt.out);
  // Checked before the folder is touched, like everything else the command line gives.
  const auto slurm =
      opt.emit_slurm ? slurm_resources(g, opt.slurm) : std::map<std::string, std::string>{};
  // The commonest other grid is this one with the other --quick (check --train sweeps quick).
  std::string hint;
  if (std::string id; read_file(opt.out + "/grid.id", id) && id.rfind(g.id, 0) != 0) try {
      const Grid other = opt.grid.empty()
                             ? load_grid(frozen_grid, !opt.quick, opt.seed_offset,
                                         access(frozen_base.c_str(), F_OK) == 0 ? frozen_base : "")
                             : load_grid(opt.grid, !opt.quick, opt.seed_offset);
      if (id.rfind(other.id, 0) == 0)
        hint = std::string("it was swept ") + (opt.quick ? "without" : "with") +
               " --quick: run the same command " + (opt.quick ? "without" : "with") + " it";
    } catch (const InputError&) {  // no [quick] overlay: no such grid
    }
  std::unique_ptr<WriterLock> lock;
  prepare_dir(opt.out, g, opt.cell < 0, lock, hint);
  SweepSummary sum;
  sum.cells = int(g.size());
  if (opt.emit_slurm) {
    emit_slurm(g, opt, slurm);
    if (opt.verbose)
      std::cout << "wrote " << opt.out << "/sweep.slurm (" << g.size() << " array tasks), "
                << opt.out << "/analyze.slurm and " << opt.out << "/submit.sh\n";
    if (lock) lock->done();
    return sum;
  }
  if (opt.cell >= 0) {  // one cell, in this process
    if (finished_status(cell_trace_path(opt.out, opt.cell))) {
      sum.skipped = 1;
      return sum;
    }
    TrainOptions t;
    t.out = cell_trace_path(opt.out, opt.cell), t.force = true, t.progress = false;
    const std::string base = g.base_config.empty() ? "" : frozen_base_config(opt.out);
    const TrainResult r = train(load_config(base, g.cells[opt.cell]), t);
    (r.status == RunStatus::Nan ? sum.nan : sum.completed) = 1;
    return sum;
  }

  std::vector<Record> rec(g.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < g.size(); ++i) {
    const std::optional<RunStatus> done = finished_status(cell_trace_path(opt.out, i));
    if (!done) {
      todo.push_back(i);
    } else {
      rec[i].status = name_of(*done) + std::string(" (earlier)");
      ++sum.skipped;
    }
  }
  // Cells sharing the host: each checks its predicted memory against what is free when it
  // starts, before any cell started with it has allocated, so cells started together could each
  // fit and all together not. They start only while the running cells' predictions leave room
  // for the next one's (HostBudget); one cell always may, and a cell too large for the host
  // alone is refused by its own check. Where the largest cells fit fewer at a time than --jobs
  // asks, each gets the cores of the cells that cannot run.
  const int cores = omp_get_num_procs();
  const int asked = std::max(1, opt.jobs > 0 ? opt.jobs : cores);
  const HostBudget budget(g, todo, opt.memory_gib, asked);
  const int jobs = std::min(asked, budget.together());
  const int threads = std::max(1, cores / jobs);
  if (opt.verbose)
    std::cout << "sweep " << g.path << ": " << g.size() << " cells, " << sum.skipped
              << " already finished, " << todo.size() << " to run, " << jobs << " at a time x "
              << threads << " thread(s)" << std::endl;
  write_manifest(opt.out, g, rec);
  std::vector<Running> running;
  size_t next = 0, done = 0;
  // Cells sharing one GPU: a cell that finds the device's memory held by the others exits with
  // kExitDeviceBusy before writing anything. It goes back to the front of the queue and fewer
  // cells run at once; each cell that then ends normally lets one more start again.
  int limit = jobs;
  if (opt.verbose && !budget.note().empty()) std::cout << budget.note() << std::endl;
  int64_t in_use = 0;
  auto fits = [&](size_t cell) {
    return running.empty() || in_use + budget.need(cell) <= budget.bytes();
  };
  const size_t to_run = todo.size();
  SweepProgress progress(opt.verbose, to_run);
  while (next < todo.size() || !running.empty()) {
    if (stop_signal() != 0) {
      progress.interrupt();
      stop_cells(running, rec, opt);
      write_manifest(opt.out, g, rec);
      throw StopRequested(stop_signal());
    }
    while (next < todo.size() && int(running.size()) < limit && fits(todo[next])) {
      const size_t cell = todo[next++];
      const pid_t pid = spawn_cell(g, cell, opt.out, threads);
      if (pid < 0) {
        rec[cell] = {"failed (could not start)", -1, 0};
        ++sum.failed;
        continue;
      }
      running.push_back({cell, pid, Clock::now()});
      in_use += budget.need(cell);
      rec[cell].status = "running";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (size_t r = 0; r < running.size();) {
      Running& run = running[r];
      const double age = std::chrono::duration<double>(Clock::now() - run.start).count();
      int status = 0;
      const pid_t w = waitpid(run.pid, &status, WNOHANG);
      if (w == 0 && opt.timeout_s > 0 && age > opt.timeout_s) {
        kill(run.pid, SIGKILL);
        waitpid(run.pid, &status, 0);
        std::ostringstream why;
        why << "timeout: killed after " << opt.timeout_s << " s (sweep --timeout)";
        // The killed cell's writer (its supervised child, dying with it a moment later) left
        // the trace "running": it records why it ended, as a crashed run's supervisor does.
        record_crash_after_writer(cell_trace_path(opt.out, run.cell), why.str(), 10);
        rec[run.cell] = {"timeout", -1, age};
        ++sum.failed;
      } else if (w == 0) {
        ++r;
        continue;
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == kExitDeviceBusy &&
                 running.size() > 1) {
        limit = std::max(1, int(running.size()) - 1);
        todo.insert(todo.begin() + long(next), run.cell);  // next to start
        rec[run.cell].status = "waiting (device busy)";
        progress.interrupt();
        if (opt.verbose)
          std::cout << "cell " << run.cell << " waits: the device's memory is held by the other "
                    << running.size() - 1 << " running cell(s); " << limit << " at a time now"
                    << std::endl;
        in_use -= budget.need(run.cell);
        running.erase(running.begin() + long(r));
        continue;
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        limit = std::min(jobs, limit + 1);
        const std::optional<RunStatus> s = finished_status(cell_trace_path(opt.out, run.cell));
        rec[run.cell] = {s ? name_of(*s) : "failed (no finished trace)", 0, age};
        (!s ? sum.failed : *s == RunStatus::Nan ? sum.nan : sum.completed)++;
      } else {
        const bool signalled = WIFSIGNALED(status);
        const int code = signalled ? WTERMSIG(status) : WEXITSTATUS(status);
        const std::string said = last_words(cell_log_path(opt.out, run.cell), signalled);
        rec[run.cell] = {std::string(signalled ? "crashed (signal " : "failed (exit ") +
                             std::to_string(code) + ")" + (said.empty() ? "" : ": " + said),
                         signalled ? 128 + code : code, age};
        ++sum.failed;
      }
      ++done;
      progress.cell_ended(done, running.size() - 1, run.cell, rec[run.cell].status, age,
                          g.describe(run.cell));
      write_manifest(opt.out, g, rec);
      in_use -= budget.need(run.cell);
      running.erase(running.begin() + long(r));
    }
  }
  write_manifest(opt.out, g, rec);
  if (lock) lock->done();
  return sum;
}

}  // namespace divlab
