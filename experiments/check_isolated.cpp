// `divlab check` as a command: the conditions in a worker process (a crash or a hang is a
// verdict for the condition it happened in), the compute-sanitizer pass, and --train.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "common/paths.h"
#include "common/process.h"
#include "common/signals.h"
#include "experiments/check.h"
#include "experiments/check_conditions.h"
#include "experiments/check_train.h"
#include "experiments/config.h"
#include "experiments/reproduce.h"
#include "experiments/sanitizer_log.h"
#include "kernels/plugins.h"

namespace divlab {

namespace {

// Seconds divlab's own work between a draw's kernel calls may go without a word (inputs of 16 M
// values, fp64 references and their rounding allowances; minutes under the sanitizers) before
// the worker is taken for hung.
constexpr int kOwnWorkLimit = 900;

// One condition's result as one line of tab-separated, escaped fields (worker -> parent).
std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\')
      o += "\\\\";
    else if (c == '\t')
      o += "\\t";
    else if (c == '\n')
      o += "\\n";
    else
      o += c;
  }
  return o;
}
std::string unescape(const std::string& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      o += s[i];
      continue;
    }
    const char c = s[++i];
    o += c == 't' ? '\t' : c == 'n' ? '\n' : c;
  }
  return o;
}
std::string number(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

std::string encode(const ConditionResult& r) {
  std::string stray;
  for (const auto& w : r.stray_writes) stray += (stray.empty() ? "" : "\x1f") + w;
  const std::vector<std::string> fields = {r.name,
                                           r.shape,
                                           std::to_string(r.ran),
                                           r.note,
                                           number(r.row_error),
                                           number(r.norm_error),
                                           number(r.verifier_pass),
                                           number(r.bias),
                                           std::to_string(r.finite),
                                           std::to_string(r.deterministic),
                                           stray,
                                           std::to_string(r.rows_not_updated),
                                           std::to_string(r.rows_wrongly_updated),
                                           r.row_example,
                                           r.worst,
                                           std::to_string(r.draws),
                                           r.smallest,
                                           std::to_string(r.failed),
                                           r.why,
                                           number(r.fp32_grade_error),
                                           std::to_string(r.nans_hidden),
                                           r.nan_example,
                                           number(r.fp32_outputs_error),
                                           r.fp32_outputs_worst};
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "\t" : "") + escape(fields[i]);
  return line;
}

bool decode(const std::string& line, ConditionResult* r) {
  std::vector<std::string> f;  // empty fields count (getline would drop a trailing one)
  for (size_t at = 0;;) {
    const size_t tab = line.find('\t', at);
    f.push_back(unescape(line.substr(at, tab == std::string::npos ? std::string::npos : tab - at)));
    if (tab == std::string::npos) break;
    at = tab + 1;
  }
  if (f.size() != 24) return false;
  r->name = f[0], r->shape = f[1], r->ran = f[2] == "1", r->note = f[3];
  r->row_error = std::strtod(f[4].c_str(), nullptr);
  r->norm_error = std::strtod(f[5].c_str(), nullptr);
  r->verifier_pass = std::strtod(f[6].c_str(), nullptr);
  r->bias = std::strtod(f[7].c_str(), nullptr);
  r->finite = f[8] == "1", r->deterministic = f[9] == "1";
  std::stringstream stray(f[10]);
  for (std::string w; std::getline(stray, w, '\x1f');) r->stray_writes.push_back(w);
  r->rows_not_updated = std::strtoll(f[11].c_str(), nullptr, 10);
  r->rows_wrongly_updated = std::strtoll(f[12].c_str(), nullptr, 10);
  r->row_example = f[13], r->worst = f[14], r->draws = std::atoi(f[15].c_str());
  r->smallest = f[16], r->failed = f[17] == "1", r->why = f[18];
  r->fp32_grade_error = std::strtod(f[19].c_str(), nullptr);
  r->nans_hidden = std::strtoll(f[20].c_str(), nullptr, 10), r->nan_example = f[21];
  r->fp32_outputs_error = std::strtod(f[22].c_str(), nullptr), r->fp32_outputs_worst = f[23];
  return true;
}

// The command line of this check's conditions (another process of the same executable).
std::vector<std::string> check_argv(const CheckOptions& opt, uint64_t seed) {
  std::vector<std::string> argv = {"check",       opt.target,
                                   "--backend",   name_of(opt.backend),
                                   "--precision", name_of(opt.precision),
                                   "--grade",     name_of(opt.grade),
                                   "--draws",     std::to_string(opt.draws),
                                   "--seed",      std::to_string(seed)};
  if (opt.backend == Backend::Cuda) argv.push_back("--no-sanitizer");
  for (const auto& p : opt.plugins) argv.insert(argv.end(), {"--plugins", p});
  if (!opt.trace.empty()) argv.insert(argv.end(), {"--trace", opt.trace});
  for (const auto& c : opt.conditions) argv.insert(argv.end(), {"--condition", c});
  return argv;
}

std::string last_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

}  // namespace

int run_check_worker(const CheckOptions& opt) {
  CheckReport rep = new_check_report(opt);
  const int fd = open(opt.worker_report.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) throw InputError("check: cannot write '" + opt.worker_report + "'");
  // One write() per line: the parent reads whole lines, whatever the kernel prints elsewhere.
  auto line = [fd](const std::string& s) {
    const std::string l = s + "\n";
    if (write(fd, l.data(), l.size()) != ssize_t(l.size()))
      throw std::runtime_error("check: cannot report to the parent");
  };
  CheckProgress progress;
  progress.begin = [&](size_t i) { line("begin " + std::to_string(i)); };
  progress.result = [&](size_t i, const ConditionResult& r) {
    line("result " + std::to_string(i) + " " + encode(r));
  };
  progress.verifier = [&](bool ok) { line(std::string("verifier ") + (ok ? "1" : "0")); };
  progress.control = [&](bool yes) { line(std::string("control ") + (yes ? "1" : "0")); };
  progress.kernel_calls = [&] { line("kernel"); };
  progress.own_work = [&] { line("own"); };
  run_check_conditions(opt, rep, size_t(opt.worker_from), progress);
  line("done");
  close(fd);
  return 0;
}

CheckReport run_check_isolated(const CheckOptions& opt) {
  CheckReport rep = new_check_report(opt);  // the seed every worker shares
  const std::vector<ConditionInfo> infos = check_conditions(opt);
  const size_t count = infos.size();
  const std::string self = self_exe();
  // Unnamed files: a check killed at any moment leaves none of them behind.
  const UnnamedFile report_file("divlab-check-report"), log_file("divlab-check-log");
  const std::string &report = report_file.path(), &log = log_file.path();
  bool verifier_seen = false, done_seen = false;
  for (size_t from = 0; from <= count;) {
    report_file.clear();
    std::vector<std::string> argv = check_argv(opt, rep.seed);
    argv.insert(argv.begin(), self);
    argv.insert(argv.end(), {"--worker-from", std::to_string(from), "--worker-report", report});
    SpawnOptions so;
    so.log = log;
    const pid_t pid = spawn_process(argv, so);
    if (pid < 0) throw std::runtime_error("check: cannot start its worker process");
    size_t current = from;
    std::string pending;
    off_t offset = 0;
    auto last = std::chrono::steady_clock::now();
    // Whether the kernel's code may be running: loading the plug-ins (before the first
    // condition) and a draw's calls are timed by --time-limit; divlab's own work between them
    // only by kOwnWorkLimit.
    bool kernel_running = true;
    // New whole lines of the worker's report: progress, results, the verifier's outcome.
    auto read_report = [&] {
      char buf[65536];
      ssize_t n;
      while ((n = pread(report_file.fd(), buf, sizeof buf, offset)) > 0)
        offset += n, pending.append(buf, size_t(n));
      for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
        const std::string l = pending.substr(0, nl);
        last = std::chrono::steady_clock::now();
        size_t i = 0;
        kernel_running = l == "kernel";
        if (std::sscanf(l.c_str(), "begin %zu", &i) == 1) current = i;
        if (l == "done") done_seen = true;
        if (l.rfind("verifier ", 0) == 0)
          verifier_seen = true, rep.benchmark_verifier_passes = l == "verifier 1";
        if (l.rfind("control ", 0) == 0) rep.declared_control = l == "control 1";
        if (std::sscanf(l.c_str(), "result %zu ", &i) == 1 && i < count) {
          ConditionResult r;
          const size_t at = l.find(' ', 7);
          if (at != std::string::npos && decode(l.substr(at + 1), &r)) rep.conditions[i] = r;
          from = i + 1;
        }
      }
    };
    int status = 0;
    bool hung = false;
    while (true) {
      read_report();
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      const auto quiet = std::chrono::steady_clock::now() - last;
      const int limit = kernel_running ? opt.time_limit : std::max(opt.time_limit, kOwnWorkLimit);
      if (quiet > std::chrono::seconds(limit)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        hung = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    read_report();
    // Success is the worker's "done", not its exit code: a kernel that ends the process
    // (exit(0) inside a plug-in) must not pass the conditions it never finished.
    if (!hung && WIFEXITED(status) && WEXITSTATUS(status) == 0 && done_seen) break;
    if (!hung && WIFEXITED(status) && WEXITSTATUS(status) == 2) {  // bad input, said once
      const std::string why = last_line_of(log);
      throw InputError(why.rfind("divlab: ", 0) == 0 ? why.substr(8) : why);
    }
    // The worker died or hung inside condition `current`: that condition's verdict.
    std::string why =
        hung && !kernel_running
            ? "divlab's own work on this condition (not the kernel's calls) gave no word within " +
                  std::to_string(std::max(opt.time_limit, kOwnWorkLimit)) + " s"
        : hung ? "hang: no result within " + std::to_string(opt.time_limit) + " s (--time-limit)"
        : WIFSIGNALED(status) ? "crashed: " + describe_wait_status(status)
        : WEXITSTATUS(status) == 0
            ? std::string("crashed: the process ended (exit code 0) inside the condition")
            : "crashed: exited with code " + std::to_string(WEXITSTATUS(status));
    const std::string said = last_line_of(log);
    if (!hung && !said.empty()) why += "; its last words: " + said;
    if (current >= count) {  // in the verifier emulation, after every condition
      rep.benchmark_verifier_passes = false;
      break;
    }
    ConditionResult& r = rep.conditions[current];
    r = ConditionResult{};
    r.name = infos[current].name, r.shape = infos[current].shape;
    r.crashed = r.failed = true, r.finite = false, r.why = why;
    from = current + 1;
  }
  if (!verifier_seen) rep.benchmark_verifier_passes = false;
  finish_check_report(rep);
  return rep;
}

namespace {

// The tools of the compute-sanitizer pass, each over the same check (same seed) in one process:
// memcheck (accesses out of bounds or misaligned, failed API calls) over every kernel; racecheck
// (shared-memory hazards: a barrier missing between one thread's access and another's, which a
// condition sees only when the warps' timing goes wrong) over every kernel but cuDNN's generated
// attention kernels, whose TMA and mbarrier pipelines it does not model (docs/cuda.md); the races
// it reports inside cuBLASLt's Hopper GEMMs (nvjet_sm90_*), built the same way, are not counted
// (read_sanitizer_log). A candidate's kernels are always covered.
// racecheck slows shared-memory-heavy kernels by orders of magnitude (the whole check took more
// than 8 minutes on an H100, the GEMMs of "concurrent load" among them), so it runs the shape
// conditions only, one draw each (a hazard needs the code path, not particular values), and
// without the GEMM tuner's timing calls (DIVLAB_GEMM_TUNING=0: the same bits). synccheck (a
// barrier that some threads of a warp reach while the others wait at another) over every kernel
// but cuDNN's generated ones: under it their mbarrier pipelines overflowed the tool's tracking
// ("Detected overflow of tracked cuda::barrier structures") and returned wrong values (H200,
// 2026-11-30). Such misuse is undefined behaviour that current GPUs often forgive: the values
// come out right and no condition sees it.
struct SanitizerTool {
  const char* name;
  std::vector<std::string> options;
  const char* summary;  // the line that counts what it found
  bool shapes_only;
};
const SanitizerTool kSanitizerTools[] = {
    {"memcheck", {}, "ERROR SUMMARY", false},
    {"racecheck", {"--kernel-name-exclude", "kns=cudnn_generated"}, "RACECHECK SUMMARY", true},
    {"synccheck", {"--kernel-name-exclude", "kns=cudnn_generated"}, "ERROR SUMMARY", false},
};

// Runs each tool; one line each: "memcheck: ERROR SUMMARY: 0 errors", or with what it found
// first ("racecheck: ERRORS: RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings); first:
// Error: Race reported between Write access at ..."), and whether it found anything. After a
// hang in `r`'s conditions it does not run; a tool still running sanitizer_tool_seconds after
// it started (the conditions took `conditions_seconds`) is killed, and its line says so.
bool any_shape_condition_selected(const CheckOptions& opt, const CheckReport& r) {
  if (r.selected.empty()) return true;
  for (const Condition& c : check_condition_list(!opt.trace.empty()))
    if (c.shapes_only &&
        std::find(r.selected.begin(), r.selected.end(), c.name) != r.selected.end())
      return true;
  return false;
}

std::vector<std::pair<std::string, bool>> sanitizer_pass(const CheckOptions& opt,
                                                         const CheckReport& r,
                                                         double conditions_seconds) {
  if (!on_path("compute-sanitizer")) return {{"not run (compute-sanitizer not on PATH)", false}};
  if (const std::string why = sanitizer_pass_skipped(r); !why.empty())
    return {{"not run (" + why + ")", false}};
  const double limit = sanitizer_tool_seconds(conditions_seconds);
  std::vector<std::pair<std::string, bool>> lines;
  for (const SanitizerTool& tool : kSanitizerTools) {
    if (tool.shapes_only && !any_shape_condition_selected(opt, r)) {
      lines.emplace_back(std::string(tool.name) +
                             ": not run (it runs the shape conditions, and --condition names none)",
                         false);
      continue;
    }
    std::vector<std::string> argv = {"compute-sanitizer", "--tool", tool.name, "--error-exitcode",
                                     "99"};
    argv.insert(argv.end(), tool.options.begin(), tool.options.end());
    CheckOptions run = opt;
    if (tool.shapes_only) run.draws = 1;
    const std::vector<std::string> check = check_argv(run, r.seed);
    argv.push_back(self_exe_to_start());
    argv.insert(argv.end(), check.begin(), check.end());
    argv.push_back("--in-process");  // in one process: the sanitizer follows no worker
    if (tool.shapes_only) argv.push_back("--shape-conditions-only");
    const UnnamedFile log("divlab-check-sanitizer-log");
    SpawnOptions so;
    so.log = log.path();
    so.setenv = {die_with_starter_env()};  // the checked divlab is compute-sanitizer's child
    // Past the deadline the whole group is killed: compute-sanitizer's launcher and the checked
    // divlab under it (killing the tool alone left both running until this check ended).
    so.own_process_group = true;
    if (tool.shapes_only) so.setenv.push_back("DIVLAB_GEMM_TUNING=0");
    bool timed_out = false;
    const int rc = run_process(argv, so, limit, &timed_out);
    if (timed_out) {  // the checked divlab dies with the tool (die_with_starter_env)
      char seconds[64];
      std::snprintf(seconds, sizeof seconds, "%.0f s (100 x the conditions' %.1f s, at least 600)",
                    limit, conditions_seconds);
      lines.emplace_back(std::string(tool.name) + ": not finished within " + seconds +
                             ", killed: a kernel that hangs under the sanitizer, or one it slows "
                             "down more than that; --no-sanitizer skips the pass",
                         false);
      continue;
    }
    std::ifstream in(log.path());
    const SanitizerFindings findings = read_sanitizer_log(in, tool.summary);
    const bool errors_exit = WIFEXITED(rc) && WEXITSTATUS(rc) == 99;
    const bool found = findings.fails(errors_exit);
    std::string said = findings.line(errors_exit);
    if (findings.summary.empty()) {  // the tool was killed, crashed, or never ran the check
      const std::string last = last_line_of(log.path());
      said += " (it ended with " + describe_wait_status(rc) + (found ? "" : "; not judged") +
              (last.empty() ? "" : "; its log's last line: " + last.substr(0, 200)) + ")";
    }
    lines.emplace_back(std::string(tool.name) + ": " + (found ? "ERRORS: " : "") + said, found);
  }
  return lines;
}
}  // namespace

namespace {
// --train's settings, checked before anything runs: a bad one must not cost the user the whole
// stress table first, nor leave a grid file behind.
std::string train_output(const CheckOptions& opt, const std::string& op,
                         const std::string& variant) {
  if (!opt.train) {
    if (!opt.out.empty()) throw InputError("check --out '" + opt.out + "': only used with --train");
    if (opt.jobs != 0)
      throw InputError("check --jobs " + std::to_string(opt.jobs) + ": only used with --train");
    if (!opt.plots) throw InputError("check --no-plots: only used with --train");
    return "";
  }
  if (opt.jobs < 0) throw InputError("check --jobs " + std::to_string(opt.jobs) + ": must be >= 0");
  std::string out = opt.out.empty() ? "runs/check-" + op + "-" + variant : opt.out;
  check_output_folder(out, "check --out");  // the sweep makes the folders missing on the way
  return out;
}
}  // namespace

int cmd_check(const CheckOptions& opt) {
  const auto eq = opt.target.find('=');
  const std::string train_out =
      eq == std::string::npos
          ? ""
          : train_output(opt, opt.target.substr(0, eq), opt.target.substr(eq + 1));
  const auto started = std::chrono::steady_clock::now();
  CheckReport r = opt.isolated ? run_check_isolated(opt) : run_check(opt);
  const double conditions_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (opt.backend == Backend::Cuda && opt.sanitizer)
    for (const auto& [line, found] : sanitizer_pass(opt, r, conditions_seconds)) {
      r.sanitizer.push_back(line);
      if (found) r.pass = false, r.failing.push_back("sanitizer " + line.substr(0, line.find(':')));
    }
  std::fputs(format_check(r).c_str(), stdout);
  if (opt.train) {
    // The op's short training grid with this candidate and the op's benign controls (the noise
    // floor) beside the reference, on the check's backend.
    std::vector<std::string> arms = {"reference"};
    if (r.variant != "reference") arms.push_back(r.variant);  // the reference once
    // The controls of the mode it was checked in (the bf16 mode's catalogue on the GPU holds
    // kernels of its own).
    with_backend_catalogue(opt.backend, opt.precision, [&](const auto& catalogue) {
      catalogue.for_each_op([&](const auto& ops, auto) {
        if (ops.op != r.op) return;
        for (const auto& e : ops.entries)
          if (e.doc.benign && e.name != r.variant) arms.push_back(e.name);
      });
    });
    if (arms.size() == 1) {
      std::printf(
          "\n--train: nothing to compare: %s=reference is the baseline and %s has no benign "
          "control; check a variant (or load one with --plugins)\n",
          r.op.c_str(), r.op.c_str());
      return r.pass ? 0 : 1;
    }
    Op op{};
    if (!parse_op(r.op, &op)) throw InputError("check --train: no op '" + r.op + "'");
    const CheckTrainGrid grid = check_train_grid(op, arms, opt.backend, opt.precision, opt.plugins);
    ReproduceOptions rp;
    rp.out = train_out;
    rp.quick = grid.quick, rp.jobs = opt.jobs, rp.plots = opt.plots;
    rp.grid = rp.out + ".grid.toml";
    const MadeFolders folders(rp.grid, "check --out");  // runs/ in a fresh checkout
    if (!write_file_atomically(rp.grid, grid.text))
      throw InputError("check --out '" + rp.out + "': cannot write '" + rp.grid + "'");
    std::printf("\n--train: the short training grid for %s (%s) with %s=%s (%s)\n", r.op.c_str(),
                grid.base.c_str(), r.op.c_str(), r.variant.c_str(), rp.grid.c_str());
    const std::vector<Verdict> verdicts = run_reproduce(rp);
    std::printf("\n%s", train_summary(r.op + "=" + r.variant, verdicts).c_str());
  }
  // What to do next, by outcome.
  const std::string candidate = r.op + "=" + r.variant;
  if (!r.pass)
    std::printf(
        "\nnext: the failing conditions above name what breaks it; `divlab kernels --op %s` "
        "lists how the zoo's variants fail, for comparison\n",
        r.op.c_str());
  else if (!opt.train)
    std::printf(
        "\nnext: `divlab check %s --train` trains with it (a short grid chosen for the op) "
        "to see what it does to a loss curve\n",
        candidate.c_str());
  else
    std::printf(
        "\nnext: the verdicts above are against the op's benign controls (against zero where "
        "it has none); `divlab bisect` finds which of several swapped kernels moves the loss\n");
  return r.pass ? 0 : 1;
}

}  // namespace divlab
