#include "experiments/bisect.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "analysis/analyze.h"
#include "analysis/report.h"
#include "common/errors.h"
#include "common/files.h"
#include "datasets/dataset.h"
#include "experiments/config.h"
#include "experiments/sweep.h"
#include "io/sweep_folder.h"
#include "io/trace.h"
#include "kernels/backend.h"
#include "kernels/registry.h"

namespace divlab {

namespace {
using Subset = std::vector<std::string>;  // sorted "op=variant"

std::string join(const Subset& s, const char* sep) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : sep) + x;
  return out;
}

RunConfig load_source(const BisectOptions& opt) {
  require_input_file(opt.source, "bisect", " (bisect takes a trace or a config file)");
  std::ifstream f(opt.source, std::ios::binary);
  char magic[8] = {0};
  f.read(magic, 8);
  // A trace by its signature, or by its name: a damaged trace is refused as a trace, not read
  // as TOML.
  const bool named_trace =
      opt.source.size() > 3 && opt.source.rfind(".h5") == opt.source.size() - 3;
  if (named_trace || std::string(magic, 8) == "\x89HDF\r\n\x1a\n") {
    const TraceReader r(opt.source);
    return load_config_text(r.string_attr("/", "config_toml"), opt.source, opt.overrides,
                            ConfigFrom::Trace);
  }
  return load_config(opt.source, opt.overrides);
}

class Bisector {
 public:
  Bisector(const BisectOptions& opt, const RunConfig& cfg) : opt_(opt) {
    std::error_code ec;  // the folders missing on the way too, as `mkdir -p` would
    if (std::filesystem::create_directories(opt.out, ec); ec)
      throw InputError("bisect --out '" + opt.out + "': cannot create it (" + ec.message() + ")");
    // The base config: everything but the kernels; short runs, no checkpoints.
    RunConfig base = cfg;
    base.resolved.erase(
        std::remove_if(base.resolved.begin(), base.resolved.end(),
                       [](const auto& kv) { return kv.first.rfind("kernels.", 0) == 0; }),
        base.resolved.end());
    for (auto& [k, v] : base.resolved) {
      if (k == "checkpoint.every") v = "0";
      if (k == "train.steps" && opt.steps > 0) v = std::to_string(opt.steps);
    }
    write_output_file(opt.out + "/base.toml", base.to_toml(), "bisect: file");
    // Benign controls of the swapped ops: the noise floor of every decision.
    with_backend_catalogue(cfg.backend, cfg.precision, [&](const auto& cat) {
      for (const auto& kv : cfg.kernels) {
        const std::string &op = kv.first, &variant = kv.second;
        if (variant == "reference") continue;
        swapped_.push_back(op + "=" + variant);
        cat.for_each_op([&](const auto& ops, auto) {
          if (ops.op != op) return;
          // Not the swapped variant itself, when it is a control: its runs would be the
          // decision's own.
          for (const auto& e : ops.entries)
            if (e.doc.benign && e.name != variant) {
              controls_.push_back(op + "=" + e.name);
              return;
            }
        });
      }
    });
  }

  BisectDecision test(const Subset& s) {
    const std::string key = join(s, "+");
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    run_baseline();
    const std::string dir = opt_.out + "/d" + std::to_string(cache_.size());
    run_grid(dir, axis_op(s), {s});
    // The reference and control runs are the same for every decision: run once, linked in.
    for (const auto& name : baseline_cells_) {
      const std::string link = dir + "/cells/base-" + name;
      if (symlink(("../../baseline/cells/" + name).c_str(), link.c_str()) != 0 && errno != EEXIST)
        throw InputError("bisect: cannot create '" + link + "': " + std::strerror(errno));
    }
    AnalyzeOptions an = analyze_options(dir);
    an.plots = false, an.verbose = false;
    BisectDecision d;
    d.subset = s;
    for (const Verdict& v : analyze(an))
      if (v.variant == key) {
        d.verdict = v.verdict, d.gap = v.gap, d.p = v.p_welch, d.onset = v.onset;
        d.fails = v.verdict == Outcome::Diverged || v.verdict == Outcome::LowerLoss ||
                  v.verdict == Outcome::Nan || v.verdict == Outcome::Crashed;
        if (v.lopsided) d.moved = lopsided_words(v);
        if (v.perturbed) d.moved = perturbed_words(v), d.perturbs = true;
      }
    std::printf("  %-64s %-14s gap %+.4f p %.3g%s\n", key.c_str(), name_of(d.verdict), d.gap, d.p,
                d.moved.empty() ? ""
                : d.perturbs    ? " (perturbed)"
                                : " (lopsided)");
    std::fflush(stdout);
    decisions_.push_back(d);
    return cache_[key] = d;
  }

  int runs() const { return runs_; }
  const std::vector<BisectDecision>& decisions() const { return decisions_; }

 private:
  static std::string axis_op(const Subset& s) { return s.front().substr(0, s.front().find('=')); }

  // The noise floor every decision is judged against: the reference and the benign controls of
  // the swapped ops, over the seeds, run once into OUT/baseline.
  void run_baseline() {
    if (!baseline_cells_.empty()) return;
    std::vector<Subset> arms = {{}};
    for (const auto& c : controls_) arms.push_back({c});
    const std::string dir = opt_.out + "/baseline";
    run_grid(dir, axis_op(swapped_), arms);
    for (size_t i = 0; i < arms.size() * size_t(opt_.seeds); ++i) {
      const std::string path = cell_trace_path(dir, i);
      // Every decision is judged against these runs: one that left no trace (killed, out of
      // memory) ends the bisect here, by name, not as a missing file in the first decision.
      if (access(path.c_str(), F_OK) != 0)
        throw RunFailed("bisect: the noise floor's cell " + std::to_string(i) + " (" +
                        (i < size_t(opt_.seeds) ? std::string("the reference")
                                                : arms[i / size_t(opt_.seeds)].front()) +
                        ", seed " + std::to_string(i % size_t(opt_.seeds)) +
                        ") left no trace; its log: " + cell_log_path(dir, i));
      baseline_cells_.push_back(path.substr(path.rfind('/') + 1));
    }
  }

  // One grid: `arms` (kernel sets) x the seeds, the first op of `axis` on the grid's axis and
  // the rest as overrides.
  void run_grid(const std::string& dir, const std::string& axis, const std::vector<Subset>& arms) {
    auto arm = [&](const Subset& kernels) {
      std::string v = "reference";
      std::string rest;
      for (const auto& k : kernels) {
        const auto eq = k.find('=');
        if (k.substr(0, eq) == axis)
          v = k.substr(eq + 1);
        else
          rest += " kernels." + k;
      }
      return "\"" + v + rest + "\"";
    };
    std::string values, seeds;
    for (const auto& a : arms) values += (values.empty() ? "" : ", ") + arm(a);
    for (int i = 0; i < opt_.seeds; ++i) seeds += (i ? ", " : "") + std::to_string(i);
    write_output_file(dir + ".grid.toml",
                      "config = \"base.toml\"\n\n[axes.kernels]\n" + axis + " = [" + values +
                          "]\n\n[axes.train]\nseed = [" + seeds + "]\n",
                      "bisect: file");
    SweepOptions sw;
    sw.grid = dir + ".grid.toml", sw.out = dir, sw.jobs = opt_.jobs, sw.verbose = false;
    const SweepSummary sum = run_sweep(sw);
    runs_ += sum.completed + sum.nan + sum.failed;
  }

  const BisectOptions& opt_;
  Subset swapped_;
  Subset controls_;
  std::vector<std::string> baseline_cells_;  // file names under OUT/baseline/cells
  std::map<std::string, BisectDecision> cache_;
  std::vector<BisectDecision> decisions_;
  int runs_ = 0;
};

// Zeller's ddmin: the smallest subset of `c` that still fails (1-minimal), by `fails`.
Subset ddmin(Subset c, Bisector& b, bool (*fails)(const BisectDecision&)) {
  size_t n = 2;
  while (c.size() >= 2) {
    const size_t chunk = (c.size() + n - 1) / n;
    std::vector<Subset> parts;
    for (size_t i = 0; i < c.size(); i += chunk)
      parts.emplace_back(c.begin() + long(i), c.begin() + long(std::min(c.size(), i + chunk)));
    bool reduced = false;
    for (const auto& p : parts)
      if (fails(b.test(p))) {
        c = p, n = 2, reduced = true;
        break;
      }
    if (!reduced && parts.size() > 2)
      for (const auto& p : parts) {
        Subset rest;
        std::set_difference(c.begin(), c.end(), p.begin(), p.end(), std::back_inserter(rest));
        if (fails(b.test(rest))) {
          c = rest, n = std::max<size_t>(n - 1, 2), reduced = true;
          break;
        }
      }
    if (reduced) continue;
    if (n >= c.size()) break;
    n = std::min(2 * n, c.size());
  }
  return c;
}
}  // namespace

BisectResult run_bisect(const BisectOptions& opt) {
  // Each decision trains every arm at every seed: past a thousand, one would take days (and its
  // grid would pass the sweep's cap on cells after the folder was made).
  if (opt.seeds < 2 || opt.seeds > 1000)
    throw InputError("bisect --seeds " + std::to_string(opt.seeds) + ": need 2 to 1000");
  if (opt.jobs < 0)
    throw InputError("bisect --jobs " + std::to_string(opt.jobs) + ": must be >= 0");
  if (opt.steps < 0)
    throw InputError("bisect --steps " + std::to_string(opt.steps) +
                     ": need >= 1 (0: the config's)");
  const RunConfig cfg = load_source(opt);
  check_dataset_source(cfg.data);  // before the output folder is made
  BisectResult r;
  for (const auto& [op, variant] : cfg.kernels)
    if (variant != "reference") r.swapped.push_back(op + "=" + variant);
  std::sort(r.swapped.begin(), r.swapped.end());
  if (r.swapped.empty())
    throw InputError("bisect '" + opt.source +
                     "': every kernel is the reference; nothing to bisect");
  Bisector b(opt, cfg);
  std::printf("bisect: %zu swapped kernels: %s; %d seeds per decision\n", r.swapped.size(),
              join(r.swapped, ", ").c_str(), opt.seeds);
  const BisectDecision all = b.test(r.swapped);
  if (all.fails) {
    r.culprits = ddmin(r.swapped, b, [](const BisectDecision& d) { return d.fails; });
    const BisectDecision d = b.test(r.culprits);
    r.verdict = d.verdict, r.onset = d.onset;
  } else if (all.perturbs) {
    // No divergence, yet every run moved far past the controls: which kernels move them is as
    // worth naming (an optimizer that absorbs a bias still carries the noise).
    r.culprits = ddmin(r.swapped, b, [](const BisectDecision& d) { return d.perturbs; });
    r.verdict = b.test(r.culprits).verdict, r.perturbed = true;
  }
  r.runs = b.runs();
  r.decisions = b.decisions();
  return r;
}

std::string bisect_conclusion(const BisectResult& r, int seeds) {
  char line[512];
  if (r.culprits.empty()) {
    const BisectDecision& all = r.decisions.front();
    if (!all.moved.empty()) {  // no verdict, yet the seeds moved: more seeds, not innocence
      std::snprintf(line, sizeof line,
                    "bisect: nothing to blame at %d seeds; --seeds %d or more may settle it. %d "
                    "runs.\n",
                    seeds, std::max(8, 2 * seeds), r.runs);
      return std::string("bisect: with every swapped kernel no verdict (") + name_of(all.verdict) +
             "), but the seeds moved: " + all.moved + "\n" + line;
    }
    std::snprintf(line, sizeof line,
                  "bisect: with every swapped kernel the run does not leave the control band "
                  "(%s); nothing to blame. %d runs.\n",
                  name_of(all.verdict), r.runs);
    return line;
  }
  if (r.perturbed) {
    std::snprintf(line, sizeof line, "; %zu decisions, %d runs\n", r.decisions.size(), r.runs);
    return "bisect: no divergence, but every run moved: perturbing: " + join(r.culprits, " + ") +
           " (far past the controls, in no consistent direction)" + line;
  }
  std::snprintf(line, sizeof line,
                "bisect: culprit%s: %s (%s, onset at step %lld); %zu decisions, %d runs\n",
                r.culprits.size() > 1 ? "s" : "", join(r.culprits, " + ").c_str(),
                name_of(r.verdict), r.onset, r.decisions.size(), r.runs);
  return line;
}

int cmd_bisect(const BisectOptions& opt) {
  const BisectResult r = run_bisect(opt);
  std::printf("\n%s", bisect_conclusion(r, opt.seeds).c_str());
  return r.culprits.empty() ? 1 : 0;
}

}  // namespace divlab
