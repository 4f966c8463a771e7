// divlab: the command-line front end. Every subcommand reports bad input as one line on stderr
// and exit code 2, before writing anything.
#include <H5Cpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "analysis/analyze.h"
#include "common/paths.h"
#include "common/signals.h"
#include "common/utf8.h"
#include "common/version.h"
#include "datasets/dataset.h"
#include "experiments/bisect.h"
#include "experiments/check.h"
#include "experiments/config.h"
#include "experiments/export.h"
#include "experiments/ranks.h"
#include "experiments/reproduce.h"
#include "experiments/sample.h"
#include "experiments/supervise.h"
#include "experiments/sweep.h"
#include "experiments/train.h"
#include "io/trace.h"
#include "kernels/backend.h"
#include "kernels/plugins.h"
#include "kernels/registry.h"

namespace divlab {
namespace {

// Unsigned options: CLI11 reads "-1" into a uint64_t as 2^64 - 1, and an int option's "-1" would
// mean "not given" (sweep --cell), so a sign is refused before conversion; CLI11 2.1 also reads
// a seed past 2^64 - 1 as 2^64 - 1, so that is refused too (a replayed seed must be the one given).
const CLI::Validator kNotNegative(
    [](std::string& value) {
      if (!value.empty() && value[0] == '-') return "'" + value + "': must be >= 0";
      errno = 0;
      std::strtoull(value.c_str(), nullptr, 0);
      return errno == ERANGE ? "'" + value + "': at most 2^64 - 1" : std::string();
    },
    "N >= 0");

// A path given as '' (an unset shell variable, say) is refused: a command would otherwise take it
// for an option not given and run something else (the default grid, a check without the trace).
const CLI::Validator kPathGiven(
    [](std::string& value) { return value.empty() ? std::string("an empty path") : std::string(); },
    "");

// The run's last line. A run of train.steps = 0 (its initial weights into a trace, for `check
// --trace` or `export`) computed no loss: it says so rather than "final loss 0".
int report_train(const TrainResult& r, const std::string& trace) {
  if (r.launcher_exit) return *r.launcher_exit;  // rank 0 reported the run
  if (r.reports) {
    std::cout << "status " << r.status << "  steps " << r.steps << "  final loss ";
    if (r.steps > 0)
      std::cout << r.final_loss;
    else
      std::cout << "- (no step ran)";
    std::cout << "  trace " << trace << std::endl;
  }
  return r.status == "interrupted" ? 128 + r.signal : 0;  // nan is a finding: exit 0
}

int cmd_train(const std::string& config, const std::vector<std::string>& sets,
              const std::string& out, bool force, bool quiet, const std::string& resume,
              bool profile) {
  if (!resume.empty()) {
    if (!config.empty() || !out.empty())
      throw InputError(
          "--resume: the trace holds its config and is the output; drop --config "
          "and --out");
    return report_train(resume_training(resume, sets, !quiet), resume);
  }
  const RunConfig cfg = load_config(config, sets);
  check_dataset_source(cfg.data);
  // A data-parallel rank that a launcher started: its launcher checked the output and printed
  // the config (or, under mpirun and srun, rank 0 does); rank 0 alone reports the run.
  const std::optional<RankLaunch> launch = launched_rank(cfg.data_parallel);
  if (launch) check_world_size(*launch, cfg.ranks);
  // --out must not be one of the run's inputs: with --force the trace would be written over it.
  std::vector<ReadFile> inputs{{config, "the config file being read"}};
  for (const auto& p : cfg.plugins) inputs.push_back({p, "the plug-in '" + p + "'"});
  check_out_is_no_input(out, inputs, cfg.data);
  TrainOptions opt;
  if (answers_for_output(launch)) {
    check_output_path(out, force);
    if (cfg.data_parallel == RankTransport::Nccl && !launch) check_local_gpus(cfg.ranks);
    // Printed once the run has passed every check, so a refusal stands alone.
    opt.on_start = [&cfg] {
      std::cout << "# divlab train: resolved config\n" << cfg.to_toml() << std::endl;
    };
  }
  opt.out = out;
  opt.force = force;
  opt.progress = !quiet;
  opt.profile = profile;
  return report_train(train(cfg, opt), out);
}

int cmd_data(const std::string& spec, int vocab, int batch, int seq, uint64_t seed, int ranks) {
  if (vocab < 2) throw InputError("--vocab " + std::to_string(vocab) + ": must be >= 2");
  if (batch < 1) throw InputError("--batch " + std::to_string(batch) + ": must be >= 1");
  if (seq < 1) throw InputError("--seq " + std::to_string(seq) + ": must be >= 1");
  if (ranks < 1) throw InputError("--ranks " + std::to_string(ranks) + ": must be >= 1");
  if (batch % ranks != 0)
    throw InputError("--ranks " + std::to_string(ranks) + " does not divide --batch " +
                     std::to_string(batch) + " (every rank takes an equal shard of the batch)");
  check_batch_fits(batch, seq, 2 * sizeof(TokenId));  // a batch's inputs and targets
  DatasetOptions opt;
  opt.vocab = vocab, opt.seq_len = seq, opt.seed = seed;
  const auto data = make_dataset(spec, opt);
  const DatasetSummary s = summarize(*data, batch, seq, 64, ranks);
  const DatasetInfo& info = data->info();
  std::printf("dataset %s (%s), vocab %d\n", info.spec.c_str(), info.kind.c_str(), info.vocab);
  if (!info.corpus_sha256.empty()) std::printf("corpus sha256 %s\n", info.corpus_sha256.c_str());
  if (!info.tokens_sha256.empty()) std::printf("tokens sha256 %s\n", info.tokens_sha256.c_str());
  if (s.tokens >= 0)
    std::printf("%-44s %lld\n", "tokens (training split)", (long long)s.tokens);
  else
    std::printf("%-44s %s\n", "tokens", "unbounded (synthetic stream)");
  std::printf("%-44s %.4f\n", "top-1 share", s.top1_share);
  std::printf("%-44s %.4f\n", "top-10 share", s.top10_share);
  std::printf("%-44s %.3f\n", "fitted Zipf exponent", s.zipf_exponent);
  if (info.entropy_rate >= 0)
    std::printf("%-44s %.4f\n", "entropy rate (nats/token: the loss floor)", info.entropy_rate);
  char what[96];
  std::snprintf(what, sizeof what, "max contributions to one row per step (B*T=%d)", batch * seq);
  std::printf("%-44s %.1f (mean of %lld batches)\n", what, s.expected_max_row_contributions,
              (long long)s.batches_sampled);
  if (ranks > 1) {
    std::snprintf(what, sizeof what, "... per kernel call over %d ranks (B*T=%d each)", ranks,
                  batch / ranks * seq);
    std::printf("%-44s %.1f\n", what, s.expected_max_row_contributions_per_rank);
  }
  return 0;
}

// A command-line option's value from a closed set, parsed once; one line naming the option
// and the valid values otherwise.
template <class E>
E option_choice(const std::string& option, const std::string& value) {
  E v{};
  if (!parse_name(value, &v))
    throw InputError(option + " '" + value + "': expected " + names_text<E>());
  return v;
}

std::string partner_note(const Partner* p, const char* before, const char* after) {
  return p ? before + p->op + "=" + p->variant + after : "";
}

// Lists every op and variant of a backend's catalogue with its documentation (no device is
// touched); --markdown writes docs/kernels.md's body.
int cmd_kernels(const std::string& only_op, bool markdown, const std::vector<std::string>& plugins,
                Backend backend, Precision precision) {
  try {
    load_plugins(plugins);
  } catch (const PluginError& e) {
    throw InputError(std::string("--plugins: ") + e.what());
  }
  bool found = only_op.empty();
  const auto list = [&](const auto& catalogue) {
    catalogue.for_each_op([&](const auto& ops, auto) {
      if (!only_op.empty() && ops.op != only_op) return;
      found = true;
      if (markdown) {
        std::printf(
            "## `%s`\n\n%s\n\n| variant | what it does | what is wrong | exposed by | masked by |\n"
            "| --- | --- | --- | --- | --- |\n",
            ops.op.c_str(), ops.what.c_str());
        for (const auto& e : ops.entries)
          std::printf("| `%s`%s | %s%s | %s | %s | %s |\n", e.name.c_str(),
                      e.doc.benign ? " (control)" : "", e.doc.summary.c_str(),
                      partner_note(ops.partner(e.name), " (runs with `", "`)").c_str(),
                      e.doc.wrong.empty() ? "-" : e.doc.wrong.c_str(),
                      e.doc.exposed_by.empty() ? "-" : e.doc.exposed_by.c_str(),
                      e.doc.masked_by.empty() ? "-" : e.doc.masked_by.c_str());
        std::printf("\n");
        return;
      }
      std::printf("%s: %s\n", ops.op.c_str(), ops.what.c_str());
      for (const auto& e : ops.entries) {
        std::printf("  %-28s %s%s\n", e.name.c_str(), e.doc.benign ? "[control] " : "",
                    e.doc.summary.c_str());
        if (!e.doc.wrong.empty()) std::printf("  %-28s wrong:     %s\n", "", e.doc.wrong.c_str());
        if (!e.doc.exposed_by.empty())
          std::printf("  %-28s exposed by: %s\n", "", e.doc.exposed_by.c_str());
        if (!e.doc.masked_by.empty())
          std::printf("  %-28s masked by: %s\n", "", e.doc.masked_by.c_str());
        if (const Partner* p = ops.partner(e.name))
          std::printf("  %-28s runs with: %s=%s (chosen with it)\n", "", p->op.c_str(),
                      p->variant.c_str());
      }
      std::printf("\n");
    });
  };
  std::string elsewhere;  // plug-in variants of a dtype this mode does not run
  try {
    with_backend_catalogue(backend, precision, [&](const auto& catalogue) {
      list(catalogue);  // fp64 lists the fp32 variants
      for (const auto& v : plugin_variants()) {
        bool here = false;
        catalogue.for_each_op(
            [&](const auto& ops, auto) { here = here || (ops.op == v.op && ops.find(v.name)); });
        if (!here && (only_op.empty() || v.op == only_op))
          elsewhere += "\n  " + v.op + "=" + v.name + ": " + plugin_kernel_kind(v.dtype) +
                       ", run in " + mode_running(v.dtype);
      }
    });
  } catch (const BackendError& e) {
    throw InputError(std::string("--backend/--precision: ") + e.what());
  }
  if (!elsewhere.empty() && !markdown)
    std::printf("plug-in variants this mode (%s) does not run:%s\n", name_of(precision),
                elsewhere.c_str());
  if (!found) {
    std::string valid;
    for (const auto& o : op_names()) valid += (valid.empty() ? "" : ", ") + o;
    throw InputError("--op '" + only_op + "': unknown op; valid ops: " + valid);
  }
  return 0;
}

}  // namespace
}  // namespace divlab

int main(int argc, char** argv) {
  using namespace divlab;
  install_stop_handlers();  // first: a signal at any later instant is a clean stop
  if (argc > 1) {
    const std::string command = argv[1];
    if (command == "train" || command == "sweep" || command == "reproduce" || command == "bisect")
      accept_stop_requests();
  }
  // A file-size limit (or a full disk) must surface as a write error, not kill the process.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"divlab: reproduce and measure training divergence caused by kernels", "divlab"};
  app.require_subcommand(1);

  auto* train = app.add_subcommand("train", "train one model and write its trace");
  std::string config, out;
  std::vector<std::string> sets;
  bool force = false, quiet = false, help_config = false, profile = false;
  train->add_option("--config", config, "TOML config file")->check(kPathGiven);
  train->add_option("--set", sets, "override keys: --set key=value [key=value ...]")
      ->allow_extra_args();
  std::vector<std::string> train_plugins;
  train
      ->add_option("--plugins", train_plugins,
                   "load these plug-in libraries (the same as --set plugins=[...])")
      ->check(kPathGiven);
  train->add_option("--out", out, "trace file to write (HDF5)");
  train->add_flag("--force", force, "overwrite an existing trace");
  train->add_flag("--quiet", quiet, "no progress line");
  train->add_flag("--profile", profile,
                  "time every op call (device time between two timing marks on its stream; "
                  "steps run op by op) and print where a step's time goes");
  train->add_flag("--help-config", help_config, "list every config key and exit");
  std::string resume;
  train->add_option("--resume", resume, "continue a run from the newest checkpoint in its trace")
      ->check(kPathGiven);

  auto* check = app.add_subcommand(
      "check", "stress one kernel variant against the fp64 reference (kernel authors)");
  CheckOptions ck;
  check->add_option("target", ck.target, "OP=VARIANT, e.g. embed_rmsnorm_backward=bf16_accum")
      ->required();
  std::string check_backend = "cpu";
  check->add_option("--backend", check_backend, "cpu | cuda (where the variant runs)")
      ->capture_default_str();
  check->add_option("--plugins", ck.plugins, "load these plug-in libraries first")
      ->check(kPathGiven);
  check
      ->add_option("--trace", ck.trace,
                   "also judge the op on the values it saw in this run's trace (its newest "
                   "weights)")
      ->check(kPathGiven);
  check->add_option("--seed", ck.seed, "input seed (default: fresh, printed)")->check(kNotNegative);
  std::string check_precision = "fp32", check_grade = "fp32";
  check
      ->add_option("--precision", check_precision,
                   "fp32 | bf16 (the bf16-mode catalogue, judged at the bf16 grade)")
      ->capture_default_str();
  check
      ->add_option("--grade", check_grade,
                   "fp32 | bf16: the grade an fp32 kernel must reach (bf16 accepts "
                   "reduced-precision arithmetic inside it)")
      ->capture_default_str();
  check->add_option("--draws", ck.draws, "independent draws per condition")->capture_default_str();
  check
      ->add_option("--time-limit", ck.time_limit, "seconds a condition may run before it is a hang")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  bool check_in_process = false;
  check->add_flag("--in-process", check_in_process,
                  "run the conditions in this process (a crashing kernel then ends the check)");
  // The worker process of an isolated check (internal).
  check->add_option("--worker-from", ck.worker_from)->group("");
  check->add_option("--worker-report", ck.worker_report)->group("");
  check->add_flag("--shape-conditions-only", ck.shape_conditions_only)->group("");
  check->add_flag("--train", ck.train,
                  "then train with the candidate on a short grid chosen for the op");
  check->add_option("--out", ck.out, "--train: output folder (default runs/check-OP-VARIANT)")
      ->check(kPathGiven);
  check->add_option("--jobs", ck.jobs, "--train: cells at a time");
  bool check_no_plots = false, check_no_sanitizer = false;
  check->add_flag("--no-sanitizer", check_no_sanitizer, "cuda: skip the compute-sanitizer pass");
  check->add_flag("--no-plots", check_no_plots, "--train: skip the matplotlib figures");

  auto* bisect = app.add_subcommand(
      "bisect", "find which swapped kernels make a run diverge (delta debugging)");
  BisectOptions bs;
  bisect->add_option("source", bs.source, "a trace or a config with non-reference kernels")
      ->required();
  bisect->add_option("--set", bs.overrides, "override keys of the source's config")
      ->allow_extra_args();
  bisect->add_option("--seeds", bs.seeds, "seeds per decision")->capture_default_str();
  bisect->add_option("--steps", bs.steps, "train.steps of each run (default: the config's)");
  bisect->add_option("--out", bs.out, "working folder")->capture_default_str();
  bisect->add_option("--jobs", bs.jobs, "runs at a time (0, the default: number of cores)");

  auto* data = app.add_subcommand("data", "token-frequency statistics of a dataset");
  std::string spec;
  int vocab = 256, batch = 16, seq = 64;
  uint64_t seed = 0;
  data->add_option("--dataset", spec, "uniform | zipf:S | markov:S,P | text:PATH | brown | english")
      ->required();
  data->add_option("--vocab", vocab, "vocabulary size (text: BPE pieces)")->capture_default_str();
  data->add_option("--batch", batch, "sequences per step")->capture_default_str();
  data->add_option("--seq", seq, "tokens per sequence")->capture_default_str();
  int data_ranks = 1;
  data->add_option("--ranks", data_ranks,
                   "data-parallel ranks (train.ranks) sharing each batch: also the dose one "
                   "rank's kernel call sees")
      ->capture_default_str();
  data->add_option("--seed", seed, "seed for the batches sampled")
      ->capture_default_str()
      ->check(kNotNegative);
  BatchDumpOptions dump;
  auto* dump_step =
      data->add_option("--dump-batch", dump.step,
                       "write step N's training batch (as train draws it with train.seed = "
                       "--seed) to --out as HDF5: /inputs, /targets [batch, seq]");
  data->add_option("--out", dump.out, "--dump-batch: the HDF5 file to write");
  data->add_flag("--force", dump.force, "--dump-batch: overwrite --out");

  auto* sample_cmd = app.add_subcommand("sample", "text a trained run's model writes");
  SampleOptions so;
  sample_cmd->add_option("trace", so.trace, "the run's trace (train, or a sweep's cell)")
      ->required();
  sample_cmd->add_option("--prompt", so.prompt,
                         "text to continue (token ids \"3 17 5\" for synthetic data)");
  sample_cmd->add_option("--tokens", so.tokens, "tokens to generate")->capture_default_str();
  sample_cmd->add_option("--temperature", so.temperature, "0: always the most likely token")
      ->capture_default_str();
  sample_cmd->add_option("--seed", so.seed, "sampling seed (same seed, same text)")
      ->capture_default_str()
      ->check(kNotNegative);
  sample_cmd
      ->add_option("--weights", so.weights,
                   "final (kept with trace.final_weights, else the newest checkpoint) | "
                   "checkpoint | initial")
      ->capture_default_str();
  sample_cmd->add_option("--kernels", so.kernels,
                         "op=variant at inference (default: every op's reference)");

  auto* export_cmd = app.add_subcommand(
      "export", "a trace's weights as safetensors (PyTorch names and shapes, parameter order)");
  ExportOptions ex;
  export_cmd->add_option("trace", ex.trace, "the run's trace")->required();
  export_cmd->add_option("--out", ex.out, "FILE.safetensors")->required();
  export_cmd
      ->add_option("--weights", ex.weights,
                   "final | initial (trace.final_weights / trace.initial_weights) | "
                   "checkpoint (the newest)")
      ->capture_default_str();
  export_cmd->add_option("--dtype", ex.dtype, "f32 | f64")->capture_default_str();
  export_cmd->add_flag("--force", ex.force, "overwrite --out");

  auto* kernels = app.add_subcommand("kernels", "list every op and variant with its documentation");
  std::string only_op;
  bool markdown = false;
  kernels->add_option("--op", only_op, "only this op");
  kernels->add_flag("--markdown", markdown, "as Markdown tables (docs/kernels.md)");
  std::vector<std::string> kernel_plugins;
  kernels->add_option("--plugins", kernel_plugins, "also list the variants of these plug-ins")
      ->check(kPathGiven);
  std::string kernels_backend = "cpu", kernels_precision = "fp32";
  kernels->add_option("--backend", kernels_backend, "whose catalogue: cpu or cuda (no GPU needed)")
      ->capture_default_str();
  kernels
      ->add_option("--precision", kernels_precision,
                   "the catalogue of this train.precision (cuda: fp32 or bf16)")
      ->capture_default_str();

  auto* sweep = app.add_subcommand("sweep", "run every cell of an experiment grid");
  SweepOptions sw;
  sweep
      ->add_option("--config", sw.grid,
                   "grid TOML file (default: the one frozen in --out by an earlier sweep)")
      ->check(kPathGiven);
  sweep->add_option("--out", sw.out, "output folder (cells/, manifest.tsv)")->required();
  sweep->add_option("--jobs", sw.jobs, "cells at a time (0, the default: number of cores)");
  sweep->add_option("--cell", sw.cell, "run only cell I, in this process (job arrays)")
      ->check(kNotNegative);
  sweep->add_option("--timeout", sw.timeout_s, "seconds per cell before it is killed");
  sweep->add_flag("--quick", sw.quick, "apply the grid's [quick] overlay");
  sweep
      ->add_option("--seed-offset", sw.seed_offset,
                   "add N to every cell's train.seed (a re-run with fresh seeds)")
      ->check(kNotNegative);
  sweep->add_flag("--emit-slurm", sw.emit_slurm, "write a Slurm job array + analysis step");
  // Resources of the emitted scripts (each overrides the grid's [slurm] value).
  sweep->add_option("--slurm-time", sw.slurm.time, "--emit-slurm: #SBATCH --time");
  sweep->add_option("--slurm-mem", sw.slurm.mem, "--emit-slurm: #SBATCH --mem");
  sweep->add_option("--slurm-partition", sw.slurm.partition, "--emit-slurm: #SBATCH --partition");
  sweep->add_option("--slurm-account", sw.slurm.account, "--emit-slurm: #SBATCH --account");
  sweep->add_option("--slurm-gpus", sw.slurm.gpus_per_task, "--emit-slurm: GPUs per cell")
      ->check(kNotNegative);
  sweep
      ->add_option("--slurm-cpus", sw.slurm.cpus_per_task,
                   "--emit-slurm: CPUs per cell (its threads; default 2)")
      ->check(kNotNegative);
  sweep->add_option("--slurm-setup", sw.slurm.setup,
                    "--emit-slurm: a line run before divlab (modules, environment)");

  auto* analyze_cmd =
      app.add_subcommand("analyze", "verdicts for a sweep folder, or several pooled");
  AnalyzeOptions an = analyze_options("");
  analyze_cmd
      ->add_option("dirs", an.dirs,
                   "sweep output folder(s); several pool their seeds (a re-run with "
                   "--seed-offset) and need --out")
      ->required();
  analyze_cmd
      ->add_option("--out", an.out,
                   "where the tables, report and plots go (default: the sweep folder)")
      ->check(kPathGiven);
  analyze_cmd->add_flag("!--no-plots", an.plots, "skip the PNG plots");
  bool fail_on_diverged = false;
  analyze_cmd->add_flag("--fail-on-diverged", fail_on_diverged,
                        "exit 1 if any candidate diverged or crashed (for CI gates)");

  auto* reproduce = app.add_subcommand("reproduce", "the reported failure, end to end");
  ReproduceOptions rp;
  reproduce->add_flag("--quick", rp.quick, "the short version (CI)");
  reproduce->add_option("--out", rp.out, "output folder (default runs/reproduce[-quick])")
      ->check(kPathGiven);
  std::string reproduce_backend = "cpu";
  reproduce->add_option("--backend", reproduce_backend,
                        "cpu (the laptop grid) or cuda (real text at a realistic batch, one GPU)");
  reproduce
      ->add_option("--config", rp.grid,
                   "grid (default configs/reproduce.toml; --backend cuda: "
                   "configs/reproduce-gpu.toml)")
      ->check(kPathGiven);
  reproduce
      ->add_option("--seed-offset", rp.seed_offset,
                   "add N to every cell's train.seed (a re-run with fresh seeds)")
      ->check(kNotNegative);
  reproduce->add_option("--jobs", rp.jobs,
                        "cells at a time (default: number of cores; --backend cuda: 4)");
  reproduce->add_flag("!--no-plots", rp.plots, "skip the PNG plots");

  app.set_version_flag("--version", std::string("divlab ") + kDivlabVersion + " (" + kGitCommit +
                                        ")\nresources (configs, plots, data): " + resource_dir());
  // No command, or `help`: the overview. A mistyped command: the nearest one.
  if (argc == 1 || std::string(argv[1]) == "help") {
    std::cout << app.help();
    return argc == 1 ? 2 : 0;
  }
  if (argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      const std::string best = closest_name(argv[1], names);
      std::cerr << "divlab: unknown command '" << argv[1] << "'"
                << (best.empty() ? "" : "; did you mean '" + best + "'?")
                << " (divlab --help lists them)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "divlab: " << e.what() << "\n";
    return 2;
  }
  try {
    // The GEMM tuner reads it (kernels/cuda/gemm_lt.h); a value it would not take is refused
    // here, before anything runs, instead of leaving tuning silently on.
    if (const char* v = std::getenv("DIVLAB_GEMM_TUNING");
        v && std::string(v) != "0" && std::string(v) != "1")
      throw InputError(std::string("environment variable DIVLAB_GEMM_TUNING='") + v +
                       "': expected 0 (GEMMs run cuBLASLt's first choice) or 1 (tuned)");
    // Every command may run OpenMP loops (check's references, analyze's statistics), and one
    // asked for more threads than start crashes in the first: refused here for all of them.
    default_threads();
    if (*train) {
      if (help_config) {
        std::cout << describe_config_keys();
        return 0;
      }
      if (!train_plugins.empty()) {
        for (const auto& s : sets)
          if (s.rfind("plugins=", 0) == 0)
            throw InputError("--plugins and --set plugins=[...]: give the libraries once");
        std::string list;
        for (const auto& p : train_plugins) list += (list.empty() ? "" : ", ") + p;
        sets.push_back("plugins=[" + list + "]");
      }
      run_supervised(resume.empty() ? out : resume);  // the parent exits with the run
      return cmd_train(config, sets, out, force, quiet, resume, profile);
    }
    if (*data && dump_step->count()) {
      if (dump.out.empty()) throw InputError("--dump-batch: --out names the file to write");
      dump.dataset = spec, dump.vocab = vocab, dump.batch = batch, dump.seq = seq, dump.seed = seed;
      if (vocab < 2) throw InputError("--vocab " + std::to_string(vocab) + ": must be >= 2");
      dump_batch(dump);
      std::printf("wrote %s: step %lld, %d x %d tokens\n", dump.out.c_str(), (long long)dump.step,
                  batch, seq);
      return 0;
    }
    if (*data) {
      if (!dump.out.empty()) throw InputError("--out: only with --dump-batch");
      return cmd_data(spec, vocab, batch, seq, seed, data_ranks);
    }
    if (*sample_cmd) {
      const Sample out = sample(so);
      std::string kernels;
      for (const auto& k : so.kernels) kernels += (kernels.empty() ? "" : ", ") + k;
      std::cout << "# " << so.trace << ": " << out.weights
                << "; kernels: " << (kernels.empty() ? "reference" : kernels) << "; temperature "
                << so.temperature << ", seed " << so.seed << "\n"
                << out.text << std::endl;
      if (out.follows_chain >= 0)
        std::cout << "# follows the chain (a token its predecessor's successor): "
                  << std::lround(100 * out.follows_chain) << " % of the generated tokens; the "
                  << "data's: " << std::lround(100 * out.chain_follow_p) << " %, plus chance"
                  << std::endl;
      return 0;
    }
    if (*export_cmd) {
      std::cout << export_weights(ex) << std::endl;
      return 0;
    }
    if (*kernels)
      return cmd_kernels(only_op, markdown, kernel_plugins,
                         option_choice<Backend>("--backend", kernels_backend),
                         option_choice<Precision>("--precision", kernels_precision));
    if (*bisect) return cmd_bisect(bs);
    if (*check) {
      ck.plots = !check_no_plots;
      ck.sanitizer = !check_no_sanitizer;
      ck.backend = option_choice<Backend>("--backend", check_backend);
      ck.precision = option_choice<Precision>("--precision", check_precision);
      ck.grade = option_choice<Grade>("--grade", check_grade);
      ck.isolated = !check_in_process;
      if (ck.worker_from >= 0) return run_check_worker(ck);
      return cmd_check(ck);
    }
    if (*sweep) {
      const SweepSummary r = run_sweep(sw);
      if (!sw.emit_slurm)
        std::printf("sweep: %d cells: %d completed, %d nan, %d failed, %d already finished\n",
                    r.cells, r.completed, r.nan, r.failed, r.skipped);
      return 0;
    }
    if (*reproduce) {
      rp.backend = option_choice<Backend>("--backend", reproduce_backend);
      run_reproduce(rp);
      return 0;
    }
    if (*analyze_cmd) {
      const auto verdicts = analyze(an);
      const bool diverged = std::any_of(verdicts.begin(), verdicts.end(), [](const Verdict& v) {
        return v.verdict == "diverged" || v.verdict == "crashed";
      });
      return fail_on_diverged && diverged ? 1 : 0;
    }
  } catch (const DeviceBusyError& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return kExitDeviceBusy;
  } catch (const InputError& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const TraceWriteError& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const RunFailed& e) {
    std::cerr << "divlab: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const StopRequested& e) {
    std::cerr << "divlab: " << one_line(e.what())
              << "; finished cells are kept, and running the same command again continues\n";
    return 128 + e.signal;
  } catch (const std::exception& e) {
    std::cerr << "divlab: internal error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (const H5::Exception& e) {
    std::cerr << "divlab: HDF5 error in " << e.getFuncName() << ": " << e.getDetailMsg() << "\n";
    return 1;
  }
  return 0;
}
