// Run configuration: one schema of dotted keys, read from TOML (toml++, strict types), overridden
// by `--set key=value`, validated with a message that names the key, and printed back as TOML.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/errors.h"
#include "kernels/backend.h"
#include "model/optimizer.h"
#include "model/transformer.h"

namespace divlab {

// Where a run's data-parallel ranks (train.ranks > 1) execute: one after another on the run's
// device, one process per GPU joined over NCCL, or one process per rank on this host's CPU
// joined over sockets. All reduce the same stacked gradients with the same grad_reduce kernel,
// so they compute the same numbers.
enum class RankTransport { Simulated, Nccl, Processes };
template <>
struct EnumNames<RankTransport> {
  static constexpr std::pair<RankTransport, const char*> table[] = {
      {RankTransport::Simulated, "simulated"},
      {RankTransport::Nccl, "nccl"},
      {RankTransport::Processes, "processes"}};
};
// Whether the ranks run as processes of their own (started by a launcher).
inline bool ranks_are_processes(RankTransport t) {
  return t != RankTransport::Simulated;
}

// What shadow mode compares the candidates with: the op's reference in fp64 on the host (exact;
// a GPU run sends every recorded input there), or, on a GPU, the backend's fp32 reference
// kernels on the device with the comparison there too (kernels/shadow.h, DeviceComparison).
// auto: fp32_device on cuda, fp64 on the cpu.
enum class ShadowReference { Auto, Fp64, Fp32Device };
template <>
struct EnumNames<ShadowReference> {
  static constexpr std::pair<ShadowReference, const char*> table[] = {
      {ShadowReference::Auto, "auto"},
      {ShadowReference::Fp64, "fp64"},
      {ShadowReference::Fp32Device, "fp32_device"}};
};

// The most CPU threads one run may ask for: OpenMP could not start 100 000 in one process (the
// run crashed at its first parallel loop), while 4096 start and run.
constexpr int kMaxThreads = 4096;

struct RunConfig {
  Backend backend = Backend::Cpu;
  std::string data = "uniform";
  ModelConfig model;
  OptimConfig optim;
  int batch = 8;
  int ranks = 1;          // data-parallel ranks, each a shard of every step's batch
  int micro_batches = 1;  // each rank's shard run as this many batches, accumulated in place
  RankTransport data_parallel = RankTransport::Simulated;
  int64_t steps = 100;
  uint64_t seed = 0;
  Precision precision = Precision::Fp32;
  int threads = 0;         // 0: all cores; at most kMaxThreads
  int64_t eval_every = 0;  // 0: no evaluation
  int eval_batches = 4;
  std::map<std::string, std::string> kernels;  // op -> variant
  int64_t shadow_every = 0;
  std::vector<std::string> shadow_variants;
  ShadowReference shadow_reference = ShadowReference::Auto;
  // The sequences the model holds: one micro-batch of one rank's shard.
  int model_batch() const { return int(batch / (int64_t(ranks) * micro_batches)); }
  // shadow_reference with auto resolved for the backend.
  bool shadow_on_device() const {
    return shadow_reference == ShadowReference::Fp32Device ||
           (shadow_reference == ShadowReference::Auto && backend == Backend::Cuda);
  }
  std::vector<std::string> plugins;  // shared libraries with candidate kernels
  int64_t flush_steps = 10;
  double flush_seconds = 2.0;
  int64_t abort_at_step = -1;      // debug: std::abort() at this step
  bool sync_kernels = false;       // debug: cuda synchronises after every launch
  bool cuda_graphs = true;         // debug: cuda replays reference runs' steps from a graph
  int64_t checkpoint_every = 100;  // 0: no checkpoints
  bool initial_weights = false;    // keep /weights/initial
  bool final_weights = false;      // keep /weights/final

  // Every key with its resolved value, as TOML value text (strings quoted), in schema order.
  std::vector<std::pair<std::string, std::string>> resolved;
  std::string to_toml() const;
};

// Documentation of every key: name, type, default, meaning (for `divlab train --help-config`).
std::string describe_config_keys();

// Reads `path` (may be empty: defaults only), applies `overrides` ("key=value", value may be a
// TOML-like list "[a, b]") and validates every key, value and rule between keys, touching
// nothing else: no plug-in is loaded, no catalogue consulted. Throws InputError naming the key,
// value or path.
RunConfig parse_config(const std::string& path, const std::vector<std::string>& overrides);
// Where a config's TOML text comes from, for messages: a config file ("config file 'PATH' line
// 3, column 5: ...", "(PATH line 3)") or a trace's recorded config ("trace 'PATH' line 3 ...").
enum class ConfigFrom { File, Trace };
// The same from TOML text (e.g. a trace's config_toml); `source` is its path.
RunConfig parse_config_text(const std::string& toml, const std::string& source,
                            const std::vector<std::string>& overrides,
                            ConfigFrom from = ConfigFrom::File);

// The step between parsing and running: loads the config's plug-ins (once per process) and checks
// its kernel choices and shadow entries against its backend's catalogue, whose names the
// plug-ins extend. Throws InputError naming the key.
void resolve_kernels(const RunConfig& cfg);

// parse_config and resolve_kernels: what a command that runs or validates a run calls.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides);
RunConfig load_config_text(const std::string& toml, const std::string& source,
                           const std::vector<std::string>& overrides,
                           ConfigFrom from = ConfigFrom::File);

// The name in `names` within 3 edits of `word` and closest to it, for "did you mean" hints;
// empty if none is.
std::string closest_name(const std::string& word, const std::vector<std::string>& names);

}  // namespace divlab
