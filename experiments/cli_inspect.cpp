// The commands that read and report: data, sample, export, kernels, analyze.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "analysis/analyze.h"
#include "datasets/dataset.h"
#include "experiments/cli.h"
#include "experiments/config.h"
#include "experiments/export.h"
#include "experiments/sample.h"
#include "experiments/sweep.h"
#include "kernels/backend.h"
#include "kernels/plugins.h"
#include "kernels/registry.h"

namespace divlab {
namespace {

// A synthetic dataset's sampler tables and the statistics' counts: a few numbers per id (25
// bytes measured at --vocab 10^7 and 10^8).
void check_vocabulary_fits(int vocab) {
  try {
    check_backend_fits(Backend::Cpu, size_t(vocab) * 32, "data --vocab " + std::to_string(vocab));
  } catch (const BackendError& e) {
    throw InputError(e.what());
  }
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
  check_vocabulary_fits(vocab);
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

Command add_data_command(CLI::App& app) {
  struct Options {
    std::string spec;
    int vocab = 256, batch = 16, seq = 64, ranks = 1;
    uint64_t seed = 0;
    BatchDumpOptions dump;
    CLI::Option* dump_step = nullptr;
    CLI::Option* ranks_given = nullptr;
  };
  const auto o = std::make_shared<Options>();
  auto* data = app.add_subcommand("data", "token-frequency statistics of a dataset");
  data->add_option("--dataset", o->spec,
                   "uniform | zipf:S | markov:S,P | text:PATH | brown | english")
      ->required();
  data->add_option("--vocab", o->vocab, "vocabulary size (text: BPE pieces)")
      ->capture_default_str();
  data->add_option("--batch", o->batch, "sequences per step")->capture_default_str();
  data->add_option("--seq", o->seq, "tokens per sequence")->capture_default_str();
  o->ranks_given = data->add_option("--ranks", o->ranks,
                                    "data-parallel ranks (train.ranks) sharing each batch: also "
                                    "the dose one rank's kernel call sees")
                       ->capture_default_str();
  data->add_option("--seed", o->seed, "seed for the batches sampled")
      ->capture_default_str()
      ->check(kNotNegative);
  o->dump_step =
      data->add_option("--dump-batch", o->dump.step,
                       "write step N's training batch (as train draws it with train.seed = "
                       "--seed) to --out as HDF5: /inputs, /targets [batch, seq]");
  data->add_option("--out", o->dump.out, "--dump-batch: the HDF5 file to write");
  data->add_flag("--force", o->dump.force, "--dump-batch: overwrite --out");
  return {data, [o] {
            BatchDumpOptions& dump = o->dump;
            if (o->dump_step->count() == 0) {
              if (!dump.out.empty()) throw InputError("--out: only with --dump-batch");
              if (dump.force) throw InputError("--force: only with --dump-batch");
              return cmd_data(o->spec, o->vocab, o->batch, o->seq, o->seed, o->ranks);
            }
            if (dump.out.empty()) throw InputError("--dump-batch: --out names the file to write");
            if (o->ranks_given->count() > 0)
              throw InputError(
                  "--ranks: not with --dump-batch, which writes the whole step's "
                  "batch (rank r of R takes its rows r B/R to (r + 1) B/R - 1)");
            dump.dataset = o->spec, dump.vocab = o->vocab, dump.batch = o->batch;
            dump.seq = o->seq, dump.seed = o->seed;
            if (o->vocab < 2)
              throw InputError("--vocab " + std::to_string(o->vocab) + ": must be >= 2");
            check_vocabulary_fits(o->vocab);
            dump_batch(dump);
            std::printf("wrote %s: step %lld, %d x %d tokens\n", dump.out.c_str(),
                        (long long)dump.step, o->batch, o->seq);
            return 0;
          }};
}

Command add_sample_command(CLI::App& app) {
  const auto so = std::make_shared<SampleOptions>();
  const auto weights = std::make_shared<std::string>(name_of(so->weights));
  auto* sample_cmd = app.add_subcommand("sample", "text a trained run's model writes");
  sample_cmd->add_option("trace", so->trace, "the run's trace (train, or a sweep's cell)")
      ->required();
  sample_cmd->add_option("--prompt", so->prompt,
                         "text to continue (token ids \"3 17 5\" for synthetic data)");
  sample_cmd->add_option("--tokens", so->tokens, "tokens to generate")->capture_default_str();
  sample_cmd->add_option("--temperature", so->temperature, "0: always the most likely token")
      ->capture_default_str();
  sample_cmd->add_option("--seed", so->seed, "sampling seed (same seed, same text)")
      ->capture_default_str()
      ->check(kNotNegative);
  sample_cmd
      ->add_option("--weights", *weights,
                   "final (kept with trace.final_weights, else the newest checkpoint) | "
                   "checkpoint | initial")
      ->capture_default_str();
  sample_cmd->add_option("--kernels", so->kernels,
                         "op=variant at inference (default: every op's reference)");
  return {sample_cmd, [so, weights] {
            so->weights = option_choice<WhichWeights>("--weights", *weights);
            const Sample out = sample(*so);
            std::string kernels;
            for (const auto& k : so->kernels) kernels += (kernels.empty() ? "" : ", ") + k;
            std::cout << "# " << so->trace << ": " << out.weights
                      << "; kernels: " << (kernels.empty() ? "reference" : kernels)
                      << "; temperature " << so->temperature << ", seed " << so->seed << "\n"
                      << out.text << std::endl;
            if (out.follows_chain >= 0)
              std::cout << "# follows the chain (a token its predecessor's successor): "
                        << std::lround(100 * out.follows_chain) << " % of the generated tokens; "
                        << "the data's: " << std::lround(100 * out.chain_follow_p)
                        << " %, plus chance" << std::endl;
            return 0;
          }};
}

Command add_export_command(CLI::App& app) {
  const auto ex = std::make_shared<ExportOptions>();
  const auto weights = std::make_shared<std::string>(name_of(ex->weights));
  const auto dtype = std::make_shared<std::string>(name_of(ex->dtype));
  auto* export_cmd = app.add_subcommand(
      "export", "a trace's weights as safetensors (PyTorch names and shapes, parameter order)");
  export_cmd->add_option("trace", ex->trace, "the run's trace")->required();
  export_cmd->add_option("--out", ex->out, "FILE.safetensors")->required();
  export_cmd
      ->add_option("--weights", *weights,
                   "final | initial (trace.final_weights / trace.initial_weights) | "
                   "checkpoint (the newest)")
      ->capture_default_str();
  export_cmd->add_option("--dtype", *dtype, "f32 | f64")->capture_default_str();
  export_cmd->add_flag("--force", ex->force, "overwrite --out");
  return {export_cmd, [ex, weights, dtype] {
            ex->weights = option_choice<WhichWeights>("--weights", *weights);
            ex->dtype = option_choice<ExportDtype>("--dtype", *dtype);
            std::cout << export_weights(*ex) << std::endl;
            return 0;
          }};
}

Command add_kernels_command(CLI::App& app) {
  struct Options {
    std::string only_op, backend = "cpu", precision = "fp32";
    bool markdown = false;
    std::vector<std::string> plugins;
  };
  const auto o = std::make_shared<Options>();
  auto* kernels = app.add_subcommand("kernels", "list every op and variant with its documentation");
  kernels->add_option("--op", o->only_op, "only this op");
  kernels->add_flag("--markdown", o->markdown, "as Markdown tables (docs/kernels.md)");
  kernels->add_option("--plugins", o->plugins, "also list the variants of these plug-ins")
      ->check(kPathGiven);
  kernels->add_option("--backend", o->backend, "whose catalogue: cpu or cuda (no GPU needed)")
      ->capture_default_str();
  kernels
      ->add_option("--precision", o->precision,
                   "the catalogue of this train.precision (cuda: fp32 or bf16)")
      ->capture_default_str();
  return {kernels, [o] {
            return cmd_kernels(o->only_op, o->markdown, o->plugins,
                               option_choice<Backend>("--backend", o->backend),
                               option_choice<Precision>("--precision", o->precision));
          }};
}

Command add_analyze_command(CLI::App& app) {
  struct Options {
    AnalyzeOptions an = analyze_options("");
    bool fail_on_diverged = false;
  };
  const auto o = std::make_shared<Options>();
  auto* analyze_cmd =
      app.add_subcommand("analyze", "verdicts for a sweep folder, or several pooled");
  analyze_cmd
      ->add_option("sweep_folders", o->an.dirs,
                   "sweep output folder(s); several pool their seeds (a re-run with "
                   "--seed-offset) and need --out")
      ->required();
  analyze_cmd
      ->add_option("--out", o->an.out,
                   "where the tables, report and plots go (default: the sweep folder)")
      ->check(kPathGiven);
  analyze_cmd->add_flag("!--no-plots", o->an.plots, "skip the PNG plots");
  analyze_cmd->add_flag("--fail-on-diverged", o->fail_on_diverged,
                        "exit 1 if any candidate diverged or crashed (for CI gates)");
  return {analyze_cmd, [o] {
            const auto verdicts = analyze(o->an);
            const bool diverged =
                std::any_of(verdicts.begin(), verdicts.end(), [](const Verdict& v) {
                  return v.verdict == Outcome::Diverged || v.verdict == Outcome::Crashed;
                });
            return o->fail_on_diverged && diverged ? 1 : 0;
          }};
}

}  // namespace divlab
