#include "experiments/run_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/host.h"
#include "common/version.h"
#include "kernels/backend.h"
#include "kernels/plugins.h"

namespace divlab {

// Shadow specs named in the run's own backend catalogue (plug-in and GPU-only variants included).
std::vector<ShadowSpec> shadow_specs_of(const RunConfig& cfg) {
  return with_backend_catalogue(cfg.backend, cfg.precision, [&](const auto& cat) {
    return parse_shadow_specs(cfg.shadow_variants, cat);
  });
}

namespace {
// Each swapped kernel with its role ("op=variant control" or "... candidate", a line each), from
// the run's own catalogue (plug-in and GPU-only variants included): analysis reads it from the
// trace instead of re-deriving it from whichever catalogue the analysing binary has.
std::string kernel_roles(const RunConfig& cfg) {
  return with_backend_catalogue(cfg.backend, cfg.precision, [&](const auto& cat) {
    std::string out;
    for (const auto& choice : cfg.kernels) {
      const std::string &op = choice.first, &variant = choice.second;
      if (variant == "reference") continue;
      out += op + "=" + variant + (cat.is_benign(op, variant) ? " control\n" : " candidate\n");
    }
    return out;
  });
}

std::string shadow_group(const ShadowSpec& s) {
  return "/shadow/" + s.op + "/" + s.variant;
}

// What the run's shadow metrics are measured against (the trace's /shadow attribute
// "reference").
std::string shadow_reference_text(const RunConfig& cfg) {
  const DeviceComparison* device =
      cfg.shadow_on_device() ? device_shadow_comparison(cfg.backend) : nullptr;
  return device ? device->description
                : "fp64: each op's reference in fp64 on the host, on the recorded inputs";
}
}  // namespace

void lay_out_trace(TraceWriter& w, const RunConfig& cfg, const DatasetInfo& data,
                   const std::vector<ParamInfo>& layout, int threads, const std::string& device,
                   bool rank_series) {
  w.attr("/", "divlab_version", std::string(kDivlabVersion));
  w.attr("/", "git_commit", std::string(kGitCommit));
  w.attr("/", "start_utc", utc_now());
  w.attr("/", "host", hostname());
  w.attr("/", "cpu_model", cpu_model());
  w.attr("/", "compiler", std::string(kCompiler));
  w.attr("/", "build_flags", std::string(kBuildFlags));
  w.attr("/", "backend", std::string(name_of(cfg.backend)));
  w.attr("/", "device", device);
  w.attr("/", "precision", std::string(name_of(cfg.precision)));
  w.attr("/", "threads", int64_t(threads));
  w.attr("/", "param_count", int64_t(layout.back().offset + layout.back().size));
  if (!cfg.plugins.empty()) w.attr("/", "plugins", loaded_plugins_identity());
  w.status_attr(RunStatus::Running);
  w.attr("/", "config_toml", cfg.to_toml());
  w.attr("/", "kernel_roles", kernel_roles(cfg));
  for (const auto& [key, value] : cfg.resolved) {
    // Numbers stay numbers (easy for pandas); strings, booleans and lists keep their TOML text.
    char* end = nullptr;
    const double x = std::strtod(value.c_str(), &end);
    const bool numeric = end && *end == '\0' && !value.empty() && value[0] != '"';
    if (numeric && value.find_first_of(".eE") == std::string::npos)
      w.attr("/config", key, int64_t(std::stoll(value)));
    else if (numeric)
      w.attr("/config", key, x);
    else
      w.attr("/config", key, value.front() == '"' ? value.substr(1, value.size() - 2) : value);
  }
  w.attr("/dataset", "spec", data.spec);
  w.attr("/dataset", "kind", data.kind);
  w.attr("/dataset", "vocab", int64_t(data.vocab));
  w.attr("/dataset", "corpus_sha256", data.corpus_sha256);
  if (!data.tokens_sha256.empty()) w.attr("/dataset", "tokens_sha256", data.tokens_sha256);
  w.attr("/dataset", "zipf_exponent", data.zipf_exponent);
  w.attr("/dataset", "entropy_rate", data.entropy_rate);
  w.array("/dataset/token_counts", TraceWriter::Kind::Int64, data.vocab);
  if (!data.tokenizer_model.empty()) w.bytes("/dataset/tokenizer_model", data.tokenizer_model);
  using K = TraceWriter::Kind;
  for (const char* s : {"/metrics/loss", "/metrics/grad_norm", "/metrics/lr", "/metrics/wall_s",
                        "/metrics/top1_share"})
    w.series(s, K::Float64);
  for (const char* s : {"/metrics/step", "/metrics/tokens", "/metrics/max_row_contributions"})
    w.series(s, K::Int64);
  // Readers (resume, analyze, tests) count a trace's complete steps by /metrics/step.
  w.commit_series("/metrics/step");
  for (const auto& p : layout) w.series("/metrics/grad_norm_by_param/" + p.name, K::Float64);
  if (rank_series) w.series("/ranks/step", K::Int64);
  if (rank_series)
    for (int r = 0; r < cfg.ranks; ++r)
      for (const char* s : {"compute_s", "reduce_s"})
        w.series("/ranks/" + std::to_string(r) + "/" + s, K::Float64);
  if (cfg.eval_every > 0) {
    w.series("/eval/step", K::Int64);
    w.series("/eval/val_loss", K::Float64);
  }
  const auto specs = shadow_specs_of(cfg);
  for (const auto& s : specs) {
    const std::string g = shadow_group(s);
    for (const char* m : {"rel_l2", "max_row_rel", "cosine"}) w.series(g + "/" + m, K::Float64);
    w.series(g + "/step", K::Int64);
    for (const auto& label : frequency_bucket_labels())
      w.series(g + "/bucket_rel_l2/" + label, K::Float64);
  }
  if (!specs.empty()) w.attr("/shadow", "reference", shadow_reference_text(cfg));
}

void record_step(TraceWriter& w, const StepRow& row, const std::vector<ParamInfo>& layout) {
  w.append("/metrics/step", row.step);
  w.append("/metrics/loss", row.loss);
  w.append("/metrics/grad_norm", row.optimizer->grad_norm);
  w.append("/metrics/lr", row.optimizer->lr);
  w.append("/metrics/tokens", row.tokens);
  w.append("/metrics/wall_s", row.wall_s);
  w.append("/metrics/max_row_contributions", row.batch->max_row_contributions);
  w.append("/metrics/top1_share", row.batch->top1_share);
  for (size_t i = 0; i < layout.size(); ++i)
    w.append("/metrics/grad_norm_by_param/" + layout[i].name, row.optimizer->param_grad_norms[i]);
  if (!row.ranks->empty()) w.append("/ranks/step", row.step);
  for (size_t r = 0; r < row.ranks->size(); ++r) {
    w.append("/ranks/" + std::to_string(r) + "/compute_s", (*row.ranks)[r].compute_s);
    w.append("/ranks/" + std::to_string(r) + "/reduce_s", (*row.ranks)[r].reduce_s);
  }
}

void record_shadow(TraceWriter& w, const std::vector<ShadowSpec>& specs,
                   const std::vector<ShadowMetrics>& metrics, int64_t step) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string g = shadow_group(specs[i]);
    const ShadowMetrics& m = metrics[i];
    w.append(g + "/step", step);
    w.append(g + "/rel_l2", m.rel_l2);
    w.append(g + "/max_row_rel", m.max_row_rel);
    w.append(g + "/cosine", m.cosine);
    for (size_t b = 0; b < m.bucket_rel_l2.size(); ++b)
      w.append(g + "/bucket_rel_l2/" + frequency_bucket_labels()[b], m.bucket_rel_l2[b]);
  }
}

Progress::Progress(bool enabled) : enabled_(enabled), terminal_(isatty(STDERR_FILENO) != 0) {}

void Progress::update(int64_t step, int64_t steps, double loss, double tokens_per_s,
                      double elapsed) {
  if (!enabled_) return;
  const double eta = step > 0 ? elapsed / double(step) * double(steps - step) : 0.0;
  if (terminal_) {
    std::fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f tok/s  ETA %.0fs   ", (long long)step,
                 (long long)steps, loss, tokens_per_s, eta);
    return;
  }
  const int64_t tenth = steps > 0 ? step * 10 / steps : 10;
  if (tenth == last_tenth_ && step != steps) return;
  last_tenth_ = tenth;
  std::fprintf(stderr, "step %lld/%lld  loss %.4f  %.0f tok/s  elapsed %.0fs  ETA %.0fs\n",
               (long long)step, (long long)steps, loss, tokens_per_s, elapsed, eta);
}

void Progress::done() {
  if (enabled_ && terminal_) std::fprintf(stderr, "\n");
}

void print_profile(const std::map<std::string, OpTime>& times, int64_t steps, double wall_s) {
  std::vector<std::pair<std::string, OpTime>> rows(times.begin(), times.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& r : rows) total += r.second.seconds;
  std::fprintf(stderr,
               "\nop time over %lld steps after the first (per call, between timing marks on its "
               "stream; steps run op by op)\n",
               (long long)steps);
  std::fprintf(stderr, "%-24s %8s %12s %12s %7s\n", "op", "calls", "ms/step", "us/call", "share");
  for (const auto& [op, t] : rows)
    std::fprintf(stderr, "%-24s %8lld %12.3f %12.1f %6.1f%%\n", op.c_str(), (long long)t.calls,
                 1e3 * t.seconds / double(std::max<int64_t>(1, steps)),
                 1e6 * t.seconds / double(std::max<int64_t>(1, t.calls)), 100 * t.seconds / total);
  std::fprintf(stderr, "%-24s %8s %12.3f\n", "total", "",
               1e3 * total / double(std::max<int64_t>(1, steps)));
  std::fprintf(stderr, "%-24s %8s %12.3f\n", "step (wall)", "",
               1e3 * wall_s / double(std::max<int64_t>(1, steps)));
}

}  // namespace divlab
