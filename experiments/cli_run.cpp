// The commands that train and experiment: train, check, bisect, sweep, reproduce.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "datasets/dataset.h"
#include "experiments/bisect.h"
#include "experiments/check.h"
#include "experiments/cli.h"
#include "experiments/config.h"
#include "experiments/ranks.h"
#include "experiments/reproduce.h"
#include "experiments/supervise.h"
#include "experiments/sweep.h"
#include "experiments/train.h"
#include "kernels/backend.h"

namespace divlab {
namespace {

// The run's last line. A run of train.steps = 0 (its initial weights into a trace, for `check
// --trace` or `export`) computed no loss: it says so rather than "final loss 0".
int report_train(const TrainResult& r, const std::string& trace) {
  if (r.launcher_exit) return *r.launcher_exit;  // rank 0 reported the run
  if (r.reports) {
    std::cout << "status " << name_of(r.status) << "  steps " << r.steps << "  final loss ";
    if (r.steps > 0)
      std::cout << r.final_loss;
    else
      std::cout << "- (no step ran)";
    std::cout << "  trace " << trace << std::endl;
  }
  return r.status == RunStatus::Interrupted ? 128 + r.signal : 0;  // nan is a finding: exit 0
}

// `divlab train`'s command line, as given.
struct TrainArgs {
  std::string config, out, resume;
  std::vector<std::string> sets, plugins;
  bool force = false, quiet = false, help_config = false, profile = false;
};

int cmd_train(const TrainArgs& a) {
  const std::string &config = a.config, &out = a.out, &resume = a.resume;
  const std::vector<std::string>& sets = a.sets;
  if (!resume.empty()) {
    if (!config.empty() || !out.empty())
      throw InputError(
          "--resume: the trace holds its config and is the output; drop --config "
          "and --out");
    return report_train(resume_training(resume, sets, !a.quiet), resume);
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
    check_output_path(out, a.force);
    if (cfg.data_parallel == RankTransport::Nccl && !launch) check_local_gpus(cfg.ranks);
    // Printed once the run has passed every check, so a refusal stands alone.
    opt.on_start = [&cfg] {
      std::cout << "# divlab train: resolved config\n" << cfg.to_toml() << std::endl;
    };
  }
  opt.out = out;
  opt.force = a.force;
  opt.progress = !a.quiet;
  opt.profile = a.profile;
  return report_train(train(cfg, opt), out);
}

}  // namespace

Command add_train_command(CLI::App& app) {
  const auto o = std::make_shared<TrainArgs>();
  auto* train = app.add_subcommand("train", "train one model and write its trace");
  train->add_option("--config", o->config, "TOML config file")->check(kPathGiven);
  train->add_option("--set", o->sets, "override keys: --set key=value [key=value ...]")
      ->allow_extra_args();
  train
      ->add_option("--plugins", o->plugins,
                   "load these plug-in libraries (the same as --set plugins=[...])")
      ->check(kPathGiven);
  train->add_option("--out", o->out, "trace file to write (HDF5)");
  train->add_flag("--force", o->force, "overwrite an existing trace");
  train->add_flag("--quiet", o->quiet, "no progress line");
  train->add_flag("--profile", o->profile,
                  "time every op call (device time between two timing marks on its stream; "
                  "steps run op by op) and print where a step's time goes");
  train->add_flag("--help-config", o->help_config, "list every config key and exit");
  train->add_option("--resume", o->resume, "continue a run from the newest checkpoint in its trace")
      ->check(kPathGiven);
  return {
      train, [o] {
        if (o->help_config) {
          std::cout << describe_config_keys();
          return 0;
        }
        if (!o->plugins.empty()) {
          for (const auto& s : o->sets)
            if (s.rfind("plugins=", 0) == 0)
              throw InputError("--plugins and --set plugins=[...]: give the libraries once");
          std::string list;
          for (const auto& p : o->plugins) list += (list.empty() ? "" : ", ") + p;
          o->sets.push_back("plugins=[" + list + "]");
        }
        run_supervised(o->resume.empty() ? o->out : o->resume);  // the parent exits with the run
        return cmd_train(*o);
      }};
}

Command add_check_command(CLI::App& app) {
  struct Options {
    CheckOptions ck;
    std::string backend = "cpu", precision = "fp32", grade = "fp32";
    bool in_process = false, no_plots = false, no_sanitizer = false;
  };
  const auto o = std::make_shared<Options>();
  CheckOptions& ck = o->ck;
  auto* check = app.add_subcommand(
      "check", "stress one kernel variant against the fp64 reference (kernel authors)");
  check->add_option("target", ck.target, "OP=VARIANT, e.g. embed_rmsnorm_backward=bf16_accum")
      ->required();
  check->add_option("--backend", o->backend, "cpu | cuda (where the variant runs)")
      ->capture_default_str();
  check->add_option("--plugins", ck.plugins, "load these plug-in libraries first")
      ->check(kPathGiven);
  check
      ->add_option("--trace", ck.trace,
                   "also judge the op on the values it saw in this run's trace (its newest "
                   "weights)")
      ->check(kPathGiven);
  check->add_option("--seed", ck.seed, "input seed (default: fresh, printed)")->check(kNotNegative);
  check
      ->add_option("--precision", o->precision,
                   "fp32 | bf16 (the bf16-mode catalogue, judged at the bf16 grade; the "
                   "outputs that mode keeps in fp32 at the fp32 grade)")
      ->capture_default_str();
  check
      ->add_option("--grade", o->grade,
                   "fp32 | bf16: the grade an fp32 kernel, or the bf16 mode's fp32 outputs, "
                   "must reach (bf16 accepts reduced-precision arithmetic inside it)")
      ->capture_default_str();
  check->add_option("--draws", ck.draws, "independent draws per condition")->capture_default_str();
  check
      ->add_option("--condition", ck.conditions,
                   "run only this condition (its name as the table prints it; repeatable): "
                   "its rows as the whole check gives them for the same --seed")
      ->allow_extra_args(false);  // one name per --condition: OP=VARIANT may follow it
  check
      ->add_option("--time-limit", ck.time_limit,
                   "seconds a draw's kernel calls may run before they are a hang")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  check->add_flag("--in-process", o->in_process,
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
  check->add_flag("--no-sanitizer", o->no_sanitizer, "cuda: skip the compute-sanitizer pass");
  check->add_flag("--no-plots", o->no_plots, "--train: skip the matplotlib figures");
  return {check, [o] {
            CheckOptions& ck = o->ck;
            ck.plots = !o->no_plots;
            ck.sanitizer = !o->no_sanitizer;
            ck.backend = option_choice<Backend>("--backend", o->backend);
            if (o->no_sanitizer && ck.backend != Backend::Cuda)
              throw InputError(
                  "--no-sanitizer: only with --backend cuda (a CPU check runs no "
                  "compute-sanitizer pass)");
            // Candidates are judged against the fp64 reference, so they run fp32 or bf16 only.
            if (o->precision != "fp32" && o->precision != "bf16")
              throw InputError("--precision '" + o->precision + "': expected fp32 or bf16" +
                               (o->precision == "fp64" ? " (the reference is fp64 already)" : ""));
            ck.precision = option_choice<Precision>("--precision", o->precision);
            ck.grade = option_choice<Grade>("--grade", o->grade);
            ck.isolated = !o->in_process;
            if (ck.worker_from >= 0) return run_check_worker(ck);
            return cmd_check(ck);
          }};
}

Command add_bisect_command(CLI::App& app) {
  const auto bs = std::make_shared<BisectOptions>();
  auto* bisect = app.add_subcommand(
      "bisect", "find which swapped kernels make a run diverge (delta debugging)");
  bisect->add_option("source", bs->source, "a trace or a config with non-reference kernels")
      ->required();
  bisect->add_option("--set", bs->overrides, "override keys of the source's config")
      ->allow_extra_args();
  bisect->add_option("--seeds", bs->seeds, "seeds per decision")->capture_default_str();
  bisect->add_option("--steps", bs->steps, "train.steps of each run (default: the config's)");
  bisect->add_option("--out", bs->out, "working folder")->capture_default_str();
  bisect->add_option("--jobs", bs->jobs, "runs at a time (0, the default: number of cores)");
  return {bisect, [bs] { return cmd_bisect(*bs); }};
}

Command add_sweep_command(CLI::App& app) {
  const auto sw = std::make_shared<SweepOptions>();
  auto* sweep = app.add_subcommand("sweep", "run every cell of an experiment grid");
  sweep
      ->add_option("--config", sw->grid,
                   "grid TOML file (default: the one frozen in --out by an earlier sweep)")
      ->check(kPathGiven);
  sweep->add_option("--out", sw->out, "output folder (cells/, manifest.tsv)")->required();
  auto* jobs =
      sweep->add_option("--jobs", sw->jobs, "cells at a time (0, the default: number of cores)");
  auto* cell =
      sweep->add_option("--cell", sw->cell, "run only cell I, in this process (job arrays)")
          ->check(kNotNegative)
          ->excludes(jobs);
  sweep->add_option("--timeout", sw->timeout_s, "seconds per cell before it is killed");
  sweep
      ->add_option("--stop-grace", sw->stop_grace_s,
                   "asked to stop (Ctrl-C, SIGTERM), seconds the running cells have to finish "
                   "their step before they are killed")
      ->capture_default_str();
  sweep
      ->add_option("--memory", sw->memory_gib,
                   "GiB of host memory the running cells may hold together (default: what is "
                   "available when the sweep starts)")
      ->excludes(cell);
  sweep->add_flag("--quick", sw->quick, "apply the grid's [quick] overlay");
  sweep
      ->add_option("--seed-offset", sw->seed_offset,
                   "add N to every cell's train.seed (a re-run with fresh seeds)")
      ->check(kNotNegative);
  auto* emit =
      sweep->add_flag("--emit-slurm", sw->emit_slurm, "write a Slurm job array + analysis step")
          ->excludes(cell)
          ->excludes("--memory");
  // Resources of the emitted scripts (each overrides the grid's [slurm] value); without
  // --emit-slurm they would be dropped while the sweep runs here, so they are refused.
  sweep->add_option("--slurm-time", sw->slurm.time, "--emit-slurm: #SBATCH --time")->needs(emit);
  sweep->add_option("--slurm-mem", sw->slurm.mem, "--emit-slurm: #SBATCH --mem")->needs(emit);
  sweep->add_option("--slurm-partition", sw->slurm.partition, "--emit-slurm: #SBATCH --partition")
      ->needs(emit);
  sweep->add_option("--slurm-account", sw->slurm.account, "--emit-slurm: #SBATCH --account")
      ->needs(emit);
  sweep->add_option("--slurm-gpus", sw->slurm.gpus_per_task, "--emit-slurm: GPUs per cell")
      ->check(kNotNegative)
      ->needs(emit);
  sweep
      ->add_option("--slurm-cpus", sw->slurm.cpus_per_task,
                   "--emit-slurm: CPUs per cell (its threads; default 2)")
      ->check(kNotNegative)
      ->needs(emit);
  sweep
      ->add_option("--slurm-setup", sw->slurm.setup,
                   "--emit-slurm: a line run before divlab (modules, environment)")
      ->needs(emit);
  return {sweep, [sw] {
            const SweepSummary r = run_sweep(*sw);
            if (!sw->emit_slurm)
              std::printf("sweep: %d cells: %d completed, %d nan, %d failed, %d already finished\n",
                          r.cells, r.completed, r.nan, r.failed, r.skipped);
            return 0;
          }};
}

Command add_reproduce_command(CLI::App& app) {
  struct Options {
    ReproduceOptions rp;
    std::string backend = "cpu";
  };
  const auto o = std::make_shared<Options>();
  ReproduceOptions& rp = o->rp;
  auto* reproduce = app.add_subcommand("reproduce", "the reported failure, end to end");
  reproduce->add_flag("--quick", rp.quick, "the short version (CI)");
  reproduce->add_option("--out", rp.out, "output folder (default runs/reproduce[-quick])")
      ->check(kPathGiven);
  reproduce->add_option("--backend", o->backend,
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
  return {reproduce, [o] {
            o->rp.backend = option_choice<Backend>("--backend", o->backend);
            run_reproduce(o->rp);
            return 0;
          }};
}

}  // namespace divlab
