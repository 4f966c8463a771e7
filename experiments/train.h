// `divlab train`: one run from a resolved config to a trace.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "io/trace.h"

namespace divlab {

struct TrainOptions {
  std::string out;       // trace path
  bool force = false;    // overwrite an existing trace
  bool progress = true;  // progress line on stderr when it is a terminal
  bool profile = false;  // time every op call; print the table on stderr at the end
  // Called once every check of the run has passed (its data read, its memory predicted and
  // allocated), before its trace is created or its ranks start: what a command prints about
  // the run then never precedes a refusal.
  std::function<void()> on_start;
};

struct TrainResult {
  RunStatus status = RunStatus::Completed;  // completed, nan or interrupted
  int64_t steps = 0;
  double final_loss = 0;
  int signal = 0;  // the signal that interrupted the run
  // train.data_parallel = "nccl" started by hand: this process launched the ranks (one per GPU,
  // experiments/ranks.h), rank 0 reported the run, and the command exits with this status.
  std::optional<int> launcher_exit;
  // False in a data-parallel rank other than 0: rank 0 reports the run to the user.
  bool reports = true;
};

// Validates the output path before anything is written (InputError if unusable), then trains;
// with train.data_parallel = "nccl", as the rank the environment names, or by launching one
// process per rank (experiments/ranks.h).
// SIGINT/SIGTERM end the run after the current step (status "interrupted"); a non-finite loss
// or gradient ends it with status "nan" and the first op that produced one in the trace.
TrainResult train(const RunConfig& cfg, const TrainOptions& opt);
// The host memory a cpu run allocates, predicted from its config as the run checks it before
// allocating (every rank process's, with train.data_parallel = "processes"); 0 for a cuda run,
// whose buffers are on its GPU.
int64_t run_host_bytes(const RunConfig& cfg);

// Whether a run's steps replay a CUDA graph (Transformer::set_graph_steps): on the cuda backend
// with debug.cuda_graphs, every kernel graphable (VariantDoc::graphable: none draws random bits
// from its call's seed or waits for the host), and nothing running host code between the ops
// (shadow taps, the profiler's timers, debug.sync_kernels).
template <class T, class A>
bool graph_steps(const RunConfig& cfg, bool profile, const Catalogue<T, A>& catalogue,
                 const KernelSet<T, A>& kernels);

// Continues a run from the newest checkpoint in its trace (written every checkpoint.every
// steps), with the trace's own config plus `overrides` (e.g. train.steps to go further). The
// losses equal an uninterrupted run's bit for bit.
TrainResult resume_training(const std::string& trace, const std::vector<std::string>& overrides,
                            bool progress);

// Threads for train.threads = 0: OMP_NUM_THREADS when set, else the number of cores. InputError
// when OMP_NUM_THREADS asks for more than kMaxThreads.
int default_threads();

// The checks train() makes on its output path, for other commands that write files.
void check_output_path(const std::string& path, bool force);

// A file a command reads, and what to call it when --out names it ("the trace being read").
struct ReadFile {
  std::string path, what;
};
// --out must be none of the files the command reads, nor inside the folder of the text corpus
// that `data_spec` names: with --force it would be written over one (or read as text by the
// next run).
void check_out_is_no_input(const std::string& out, const std::vector<ReadFile>& inputs,
                           const std::string& data_spec);

}  // namespace divlab
