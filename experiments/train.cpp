#include "experiments/train.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <utility>

#include "common/files.h"
#include "common/lock.h"
#include "common/paths.h"
#include "common/signals.h"
#include "datasets/dataset.h"
#include "experiments/crash_report.h"
#include "experiments/data_parallel.h"
#include "experiments/ranks.h"
#include "experiments/run_trace.h"
#include "experiments/weights.h"
#include "io/checkpoint.h"
#include "io/trace.h"
#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "kernels/op_tracker.h"
#include "kernels/plugins.h"
#include "kernels/profile.h"
#include "kernels/shadow.h"
#include "model/optimizer.h"
#include "model/transformer.h"

namespace divlab {

int default_threads() {
  // OMP_NUM_THREADS when set (several runs sharing a machine), else every core.
  const char* env = std::getenv("OMP_NUM_THREADS");
  const long n = env ? std::strtol(env, nullptr, 10) : 0;
  if (n > kMaxThreads)
    throw InputError("OMP_NUM_THREADS=" + std::string(env) + ": at most " +
                     std::to_string(kMaxThreads) + " threads (or set train.threads)");
  return n > 0 ? int(n) : omp_get_num_procs();
}

void check_output_path(const std::string& path, bool force) {
  if (path.empty()) throw InputError("--out: an output path is required");
  // "runs/" or "runs/.": a folder by its spelling, even before it exists (its parents would be
  // made, then the file could not be).
  const std::filesystem::path name = std::filesystem::path(path).filename();
  if (name.empty() || name == "." || name == "..")
    throw InputError("output '" + path + "' names a folder (--out names the file to write)");
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw InputError("output '" + path + "' is a folder (--out names the file to write)");
    // A file is written beside it and renamed over it: with --force, as root, over /dev/null.
    if (!S_ISREG(st.st_mode))
      throw InputError("output '" + path + "' is " + special_file_kind(st.st_mode) +
                       ": --out names a file to write, and --force replaces only a regular file");
    if (!force) throw InputError("output '" + path + "' already exists (use --force to overwrite)");
    if (access(path.c_str(), W_OK) != 0)
      throw InputError("output '" + path + "' exists and is not writable");
  }
  check_output_folder(path, "output");
}

void check_out_is_no_input(const std::string& out, const std::vector<ReadFile>& inputs,
                           const std::string& data_spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(out, ec);
  if (ec) return;  // check_output_path reports what is wrong with it
  auto same = [&](const std::string& input) {
    std::error_code e;
    return !input.empty() && fs::exists(input, e) && fs::weakly_canonical(input, e) == target;
  };
  for (const ReadFile& f : inputs)
    if (same(f.path)) throw InputError("--out '" + out + "': is " + f.what);
  const std::string corpus = text_read_whole(data_spec);
  if (!corpus.empty()) {
    if (same(corpus)) throw InputError("--out '" + out + "': is the corpus being read");
    std::error_code e;
    if (fs::is_directory(corpus, e)) {
      const std::string dir = fs::weakly_canonical(corpus, e).string() + "/";
      if (target.string().rfind(dir, 0) == 0)
        throw InputError("--out '" + out + "': is inside the corpus folder '" + corpus +
                         "' (the next run would read it as text)");
    }
  }
}

struct Resume {
  std::optional<Checkpoint> checkpoint;  // none yet: the run starts over from step 0
  std::vector<std::pair<std::string, std::vector<double>>> history;
  std::optional<std::vector<double>> initial_weights;  // the trace's, carried over
};

namespace {
// The device comparison of a run whose shadow reference is on its device (fp32 runs only: an
// fp64 run is on the cpu).
template <class T>
const DeviceComparison* shadow_comparison(const RunConfig& cfg) {
  if (!std::is_same_v<T, float> || !cfg.shadow_on_device()) return nullptr;
  return device_shadow_comparison(cfg.backend);
}

// Replays a step whose loss or gradients were not finite, checking every op's output (every
// rank's, then the reduction's), and returns where the first non-finite value appeared (trace
// attributes). The weights are those the step started from: the optimizer does not apply
// non-finite gradients.
template <class T, class A>
std::vector<std::pair<std::string, std::string>> attribute_nan(Transformer<T, A>& model,
                                                               DataParallelStep<T, A>& replay,
                                                               const TokenId* in,
                                                               const TokenId* tgt, int64_t step,
                                                               uint64_t run_seed) {
  using Model = Transformer<T, A>;
  std::vector<std::pair<std::string, std::string>> where = {{"nan_step", std::to_string(step)}};
  bool found = false;
  std::vector<unsigned char> host;
  const MemoryOps& mem = *model.kernels().memory;
  int shard = 0;  // the rank whose forward and backward are being replayed
  model.after_op = [&](const typename Model::OpOutput& o) {
    if (found) return;
    const void* data = o.data;
    if (!mem.host_accessible) {
      host.resize(size_t(o.size) * storage_bytes(o.type));
      mem.download(model.stream(), host.data(), o.data, host.size());
      data = host.data();
    }
    for (int64_t i = 0; i < o.size && !found; ++i)
      found = !std::isfinite(stored_value(data, o.type, i));
    if (!found) return;
    where.insert(where.end(), {{"nan_pass", o.pass},
                               {"nan_op", o.op},
                               {"nan_layer", o.layer < 0 ? "-" : std::to_string(o.layer)},
                               {"nan_tensor", o.tensor}});
    if (replay.ranks() > 1) where.push_back({"nan_rank", std::to_string(shard)});
  };
  replay.run_in_turn(
      in, tgt, run_seed, step, [&](int r) { shard = r; }, [](int) {});
  model.after_op = nullptr;
  // Every shard's ops stayed finite: the reduction of their gradients may not have (fp16
  // overflow on the wire).
  if (!found && replay.ranks() > 1) {
    const std::vector<T> g = model.grads().to_vector(model.stream());
    found = std::any_of(g.begin(), g.end(), [](T v) { return !std::isfinite(double(v)); });
    if (found)
      where.insert(where.end(), {{"nan_pass", "reduce"},
                                 {"nan_op", "grad_reduce"},
                                 {"nan_layer", "-"},
                                 {"nan_tensor", "grads (reduced over ranks)"}});
  }
  if (!found) where.push_back({"nan_op", "unknown (the replay stayed finite)"});
  std::string text;
  for (const auto& [k, v] : where) text += " " + k + "=" + v;
  std::fprintf(stderr, "divlab: non-finite loss or gradient;%s\n", text.c_str());
  return where;
}

}  // namespace

template <class T, class A>
bool graph_steps(const RunConfig& cfg, bool profile, const Catalogue<T, A>& catalogue,
                 const KernelSet<T, A>& kernels) {
  return cfg.cuda_graphs && cfg.backend == Backend::Cuda && catalogue.graphable(kernels) &&
         cfg.shadow_every == 0 && !profile && !cfg.sync_kernels;
}
template bool graph_steps(const RunConfig&, bool, const Catalogue<float>&, const KernelSet<float>&);
template bool graph_steps(const RunConfig&, bool, const Catalogue<double>&,
                          const KernelSet<double>&);
template bool graph_steps(const RunConfig&, bool, const Catalogue<float, bf16>&,
                          const KernelSet<float, bf16>&);

namespace {

// A buffer's values, read in order with the work queued on `stream` (the run's).
template <class T>
std::vector<double> widen(const Buffer<T>& b, void* stream) {
  const std::vector<T> v = b.to_vector(stream);
  return std::vector<double>(v.begin(), v.end());
}

// The device's share of a run beyond the model's own buffers (Transformer::allocated_bytes), in
// bytes: optimizer state, and backend scratch at its largest: fp32 attention scores or their
// gradient [B, NH, T, T] (and, with bf16 activations, the scores' gradient as a bf16 GEMM
// operand beside it), the fused attention's recomputed output and row statistics, RMSNorm and
// embedding-gradient work space, rounded GEMM operands of the linear variants; with data-parallel
// ranks, their stacked gradients.
template <class T, class A>
int64_t predicted_bytes(const RunConfig& cfg, int64_t params) {
  const ModelConfig& m = cfg.model;
  const int64_t batch = cfg.model_batch();
  const int64_t N = batch * m.seq_len, C = m.d_model;
  const int64_t rows = batch * m.n_heads * m.seq_len, square = rows * m.seq_len;
  const int64_t t = sizeof(T), a = sizeof(A);
  const int64_t scratch =
      t * (3 * N * C + square + 4 * N * C + 2 * rows + int64_t(m.vocab) * C + 64 * C + 4 * N) +
      (a < t ? a * square : 0);
  const int64_t optimizer = (cfg.optim.kind == OptimizerKind::AdamW ? 2 : 1) * params * t;
  return optimizer + scratch + DataParallelStep<T, A>::extra_bytes(cfg.ranks, params);
}

// Over NCCL, NCCL's own buffers on each GPU beside the run's (channels, proxies, the all-gather's
// staging): a reserve, since NCCL sizes them by the topology it finds.
constexpr int64_t kNcclReserveBytes = int64_t(1) << 30;

// How long ranks 1.. wait for rank 0 to publish NCCL's id (rank 0 may still be loading a corpus).
constexpr double kRendezvousSeconds = 600;

// The bytes a run allocates on its device (one process's, one rank's), before any of them is.
template <class T, class A>
int64_t run_device_bytes(const RunConfig& cfg, bool over_nccl) {
  const ModelConfig& m = cfg.model;
  // On the cpu the device is the host, which also holds a checkpoint's fp64 copies while it is
  // written (weights and two moments, each beside its working-precision copy).
  // Kept weights take one such copy.
  const int copies = cfg.checkpoint_every > 0                     ? 3
                     : (cfg.initial_weights || cfg.final_weights) ? 1
                                                                  : 0;
  const int64_t checkpoint_bytes =
      cfg.backend == Backend::Cpu ? copies * param_count(m) * int64_t(8 + sizeof(T)) : 0;
  return Transformer<T, A>::allocated_bytes(m, cfg.model_batch()) +
         predicted_bytes<T, A>(cfg, param_count(m)) + checkpoint_bytes +
         (over_nccl ? kNcclReserveBytes : 0);
}

// Refuses a run whose buffers would not fit its device, before any of them is allocated.
template <class T, class A>
void check_run_fits(const RunConfig& cfg, bool over_nccl) {
  check_backend_fits(
      cfg.backend, size_t(run_device_bytes<T, A>(cfg, over_nccl)),
      "this model at train.batch = " + std::to_string(cfg.batch) +
          (cfg.ranks > 1 ? " over train.ranks = " + std::to_string(cfg.ranks) : "") +
          (cfg.micro_batches > 1 ? " in train.micro_batches = " + std::to_string(cfg.micro_batches)
                                 : ""));
}

// The ranks' communicator; none for a run in one process. Every rank has read what it needs of
// a resumed trace before rank 0 writes it: joining is the ranks' barrier.
std::unique_ptr<Communicator> join_ranks(const RunConfig& cfg, const TrainOptions& opt,
                                         const RankLaunch* launch, bool lead) {
  if (!launch) return nullptr;
  const bool nccl = cfg.data_parallel == RankTransport::Nccl;
  std::unique_ptr<Communicator> comm;
  try {
    comm =
        nccl ? open_nccl(launch->world, rendezvous_path(opt.out), launch->nonce, kRendezvousSeconds)
             : open_local_sockets(launch->world, launch->nonce, kRendezvousSeconds);
  } catch (const CommunicatorError& e) {
    throw RunFailed(std::string("rank ") + std::to_string(launch->world.rank) + ": " + e.what());
  }
  if (lead && nccl) std::remove(rendezvous_path(opt.out).c_str());  // every rank has joined
  return comm;
}

// What the model runs, each layer wrapping the one before: the run's kernels, tapped for shadow
// evaluation (rank 0 only), timed when profiled, and outermost tracked, so that a kernel that
// throws or crashes is named (the trace's "failure", the crash report's line). Validation runs
// the reference kernels, tracked too.
template <class T, class A>
struct RunKernels {
  RunKernels(const RunConfig& cfg, bool profile, bool lead)
      : catalogue(backend_catalogue<T, A>(cfg.backend, cfg.precision)),
        chosen(catalogue.select(cfg.kernels)),
        reference(catalogue.select({})),
        shadow_specs(shadow_specs_of(cfg)),
        tap(cfg.shadow_every > 0 && lead
                ? std::make_unique<ShadowTap<T, A>>(chosen, shadow_specs, catalogue, -1,
                                                    shadow_comparison<T>(cfg))
                : nullptr),
        profiler(profile ? std::make_unique<OpProfiler<T, A>>(tap ? tap->kernels() : chosen)
                         : nullptr),
        tracked(profiler ? profiler->kernels()
                : tap    ? tap->kernels()
                         : chosen,
                note),
        tracked_reference(reference, note) {
    if (tap) tap->name_replays_in(&note);
  }
  const KernelSet<T, A>& run() const { return tracked.kernels(); }

  const Catalogue<T, A>& catalogue;
  const KernelSet<T, A> chosen, reference;
  const std::vector<ShadowSpec> shadow_specs;
  const std::unique_ptr<ShadowTap<T, A>> tap;
  const std::unique_ptr<OpProfiler<T, A>> profiler;
  OpNote note;
  const OpTracker<T, A> tracked, tracked_reference;
};

// The model, its optimizer and its step over ranks and micro-batches, queued on `stream`.
template <class T, class A>
struct Trainee {
  std::unique_ptr<Transformer<T, A>> model;
  std::unique_ptr<Optimizer<T>> optim;
  std::unique_ptr<DataParallelStep<T, A>> step;
};

template <class T, class A>
Trainee<T, A> build_trainee(const RunConfig& cfg, bool profile, const RunKernels<T, A>& k,
                            void* stream, Communicator* comm) {
  Trainee<T, A> t;
  try {
    t.model = std::make_unique<Transformer<T, A>>(cfg.model, k.run(), cfg.model_batch());
    t.model->set_stream(stream);
    t.model->set_sync_each_launch(cfg.sync_kernels);
    t.model->set_graph_steps(graph_steps(cfg, profile, k.catalogue, k.chosen));
    t.optim = std::make_unique<Optimizer<T>>(cfg.optim, t.model->layout(), *k.chosen.memory);
    t.step = std::make_unique<DataParallelStep<T, A>>(*t.model, cfg.ranks, cfg.micro_batches, comm);
  } catch (const OutOfMemory& e) {
    throw InputError(std::string(e.what()) +
                     " (model at train.batch = " + std::to_string(cfg.batch) +
                     "; try a smaller batch or model, or train.micro_batches)");
  }
  return t;
}

// Where a run starts: step 0, or a resumed trace's checkpoint.
struct StartPoint {
  int64_t first_step = 0;
  double wall_offset = 0;  // the wall time of the steps run before the resume
  std::vector<int64_t> token_counts;
};

// Lays the trace out, carries a resumed run's history and checkpoint over, writes the initial
// weights, and publishes the trace (renames it onto its path once readable; a resumed run's
// after the history is copied, so the old file stays resumable until the new one is).
template <class T, class A>
StartPoint open_trace(TraceWriter& trace, const RunConfig& cfg, const TrainOptions& opt,
                      const Dataset& data, Transformer<T, A>& model, Optimizer<T>& optim,
                      const Resume* resume, const RankLaunch* launch, int threads,
                      const std::string& device) {
  StartPoint start;
  start.token_counts.assign(size_t(cfg.model.vocab), 0);
  const bool rank_series =
      launch ||
      (resume && std::any_of(resume->history.begin(), resume->history.end(),
                             [](const auto& h) { return h.first.rfind("/ranks/", 0) == 0; }));
  lay_out_trace(trace, cfg, data.info(), model.layout(), threads, device, rank_series);
  const int64_t n_params = int64_t(std::as_const(model).params().size());
  if (cfg.checkpoint_every > 0)
    lay_out_checkpoints(trace, n_params, cfg.optim.kind == OptimizerKind::AdamW, cfg.model.vocab);
  if (cfg.initial_weights) lay_out_weights(trace, WhichWeights::Initial, model.layout());
  if (cfg.final_weights) lay_out_weights(trace, WhichWeights::Final, model.layout());
  if (launch)
    trace.attr("/", "data_parallel",
               std::string(name_of(cfg.data_parallel)) + ": " + std::to_string(cfg.ranks) +
                   (cfg.data_parallel == RankTransport::Nccl ? " ranks, one GPU each"
                                                             : " ranks, processes on one host") +
                   ", launched by " + launch->launcher);
  if (resume)
    trace.attr("/", "resumed_at_step", resume->checkpoint ? resume->checkpoint->next_step : 0);
  trace.start();
  if (resume && resume->checkpoint) {
    const Checkpoint& c = *resume->checkpoint;
    if (int64_t(c.params.size()) != n_params)
      throw InputError("--resume '" + opt.out + "': the checkpoint does not fit the model");
    model.params().assign(c.params, model.stream());
    optim.first_moment().assign(c.first_moment, model.stream());
    if (cfg.optim.kind == OptimizerKind::AdamW)
      optim.second_moment().assign(c.second_moment, model.stream());
    start.token_counts = c.token_counts;
    for (const auto& [series, values] : resume->history) {
      for (double v : values) trace.append(series, v);
      if (series == "/metrics/wall_s" && !values.empty()) start.wall_offset = values.back();
    }
    start.first_step = c.next_step;
    // Into its own slot, which the run's next checkpoint does not overwrite: a kill while that
    // one is written still finds this one.
    if (cfg.checkpoint_every > 0)
      write_checkpoint(trace, c, checkpoint_slot(c.next_step, cfg.checkpoint_every));
  }
  if (cfg.initial_weights) {
    // A resumed run carries its trace's initial weights over; one starting over has them now.
    if (resume && resume->checkpoint && !resume->initial_weights)
      throw InputError("--resume '" + opt.out + "': trace.initial_weights = true, but the " +
                       "trace holds no initial weights");
    write_weights(trace, WhichWeights::Initial, model.layout(),
                  resume && resume->checkpoint
                      ? *resume->initial_weights
                      : widen(std::as_const(model).params(), model.stream()));
  }
  trace.publish();
  return start;
}

// "V", or "V, plug-in PATH" for a plug-in's variant.
std::string variant_label(const std::string& op, const std::string& variant) {
  const std::string library = plugin_of(op, variant);
  return variant + (library.empty() ? "" : ", plug-in " + library);
}
// Each op's kernel as a crash report names it ("reference", or the variant and its plug-in).
std::vector<std::string> kernel_names(const RunConfig& cfg) {
  std::vector<std::string> variants(kOpCount, "reference");
  for (int i = 0; i < kOpCount; ++i)
    if (const auto it = cfg.kernels.find(op_name(Op(i))); it != cfg.kernels.end())
      variants[size_t(i)] = variant_label(it->first, it->second);
  return variants;
}
// Each shadow.variants entry as a crash report names it.
std::vector<std::pair<std::string, std::string>> shadowed_names(
    const std::vector<ShadowSpec>& specs) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(specs.size());
  for (const ShadowSpec& s : specs) out.emplace_back(s.op, variant_label(s.op, s.variant));
  return out;
}

// The mean validation loss over eval.batches, always with the reference kernels: a candidate
// that only corrupts its own forward (e.g. a leaky mask) must not grade itself. None when a stop
// request ended a long evaluation (eval.batches may be large) early: a mean over part of the
// batches would be another measurement. Over ranks (`comm`) every rank evaluates to the end, as
// it must join every collective.
template <class T, class A>
std::optional<double> validate(const RunConfig& cfg, const Dataset& data, const RunKernels<T, A>& k,
                               Trainee<T, A>& t, bool comm, std::vector<TokenId>& in,
                               std::vector<TokenId>& tgt) {
  t.model->set_kernels(k.tracked_reference.kernels());
  double sum = 0;
  int evaluated = 0;
  for (; evaluated < cfg.eval_batches && (comm || stop_signal() == 0); ++evaluated) {
    data.validation_batch(evaluated, cfg.batch, cfg.model.seq_len, in.data(), tgt.data());
    sum += t.step->evaluate(in.data(), tgt.data());
  }
  t.model->set_kernels(k.run());
  if (evaluated < cfg.eval_batches) return std::nullopt;
  return sum / cfg.eval_batches;
}

template <class T, class A = T>
TrainResult train_impl(const RunConfig& cfg, const TrainOptions& opt, const Dataset& data,
                       int threads, const std::string& device, const Resume* resume,
                       const RankLaunch* launch) {
  // Over ranks every one runs this function for its shard; rank 0 alone writes the trace.
  const bool lead = launch == nullptr || launch->world.rank == 0;
  const int B = cfg.batch, Tn = cfg.model.seq_len;
  const int64_t N = int64_t(B) * Tn;
  check_run_fits<T, A>(cfg, launch && cfg.data_parallel == RankTransport::Nccl);
  const std::unique_ptr<Communicator> comm = join_ranks(cfg, opt, launch, lead);
  RunKernels<T, A> kernels(cfg, opt.profile, lead);
  ShadowTap<T, A>* const tap = kernels.tap.get();
  // The run's own stream: every op and copy of the step is queued there, none on the legacy
  // default stream (declared before the model, so it outlives the model's last use of it).
  const OwnedStream stream(*kernels.chosen.memory);
  Trainee<T, A> trainee = build_trainee(cfg, opt.profile, kernels, stream.get(), comm.get());
  Transformer<T, A>& model = *trainee.model;
  Optimizer<T>& optim = *trainee.optim;
  model.init(cfg.seed);

  if (lead && opt.on_start) opt.on_start();
  const std::unique_ptr<TraceWriter> owned_trace =
      lead ? std::make_unique<TraceWriter>(opt.out, resume ? true : opt.force)
           : std::make_unique<TraceWriter>();
  TraceWriter& trace = *owned_trace;
  StartPoint start =
      open_trace(trace, cfg, opt, data, model, optim, resume, launch, threads, device);
  const CrashReport crash(kernels.note, kernel_names(cfg), shadowed_names(kernels.shadow_specs));

  std::vector<TokenId> in(N), tgt(N);
  Progress progress(opt.progress && lead);
  const auto t0 = std::chrono::steady_clock::now();
  double profiled_from_s = 0, last_wall_s = 0;  // the profiled steps' span on the wall clock
  TrainResult result{RunStatus::Completed, start.first_step, 0.0, 0, std::nullopt, lead};
  std::vector<std::pair<std::string, std::string>> nan_where;
  // Then no step is taken; over NCCL the first step's reports carry the request instead, so that
  // every rank stops at the same step.
  const bool stopped_while_setting_up = stop_signal() != 0 && !comm;
  if (stopped_while_setting_up)
    result.status = RunStatus::Interrupted, result.signal = stop_signal();
  try {
    for (int64_t step = stopped_while_setting_up ? cfg.steps : start.first_step; step < cfg.steps;
         ++step) {
      kernels.note.step.store(step);
      if (step == cfg.abort_at_step) std::abort();
      data.batch(step, B, Tn, in.data(), tgt.data());
      const BatchStats bs =
          dose_of(in.data(), B, Tn, cfg.ranks, cfg.model.vocab, &start.token_counts);
      // Shadow mode judges rank 0's first micro-batch (the whole batch when there is one rank
      // and one micro-batch).
      const bool shadow_step = tap && step % cfg.shadow_every == 0;
      const int64_t tapped_tokens = int64_t(cfg.model_batch()) * Tn;
      const T loss = trainee.step->run(
          in.data(), tgt.data(), cfg.seed, step,
          [&](int rank) {
            if (shadow_step && rank == 0) tap->arm();
          },
          [&](int rank) {
            if (shadow_step && rank == 0)
              tap->submit(in.data(), tapped_tokens, cfg.model.vocab, step);
          });
      const StepStats st = optim.step(model, step);
      const double wall =
          start.wall_offset +
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const bool finite = std::isfinite(double(loss)) && std::isfinite(st.grad_norm);
      record_step(trace,
                  {step, double(loss), wall, (step + 1) * N, &st, &bs, &trainee.step->reports()},
                  model.layout());
      const int stop = trainee.step->stop_requested();
      result.steps = step + 1;
      // The first step pays one-time costs (cuDNN builds its fused attention plans, scratch grows):
      // the profile covers the steady steps after it when there are any.
      if (kernels.profiler && step == start.first_step && step + 1 < cfg.steps) {
        kernels.profiler->reset();
        profiled_from_s = wall;
      }
      last_wall_s = wall;
      result.final_loss = double(loss);
      const bool checkpoint = cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0;
      // Shadow evaluations finish on a worker while the GPU trains on; the trace gets them in step
      // order as they come, and all of them before a checkpoint or the end of the run.
      if (tap)
        for (const auto& r :
             tap->collect(step + 1 == cfg.steps || stop != 0 || checkpoint || !finite))
          record_shadow(trace, kernels.shadow_specs, r.metrics, r.step);
      if (cfg.eval_every > 0 && ((step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps))
        if (const auto val = validate(cfg, data, kernels, trainee, comm != nullptr, in, tgt)) {
          trace.append("/eval/step", step);
          trace.append("/eval/val_loss", *val);
        }
      trace.maybe_flush(cfg.flush_steps, cfg.flush_seconds);
      progress.update(step + 1, cfg.steps, double(loss), double((step + 1) * N) / wall, wall);
      if (!finite) {
        result.status = RunStatus::Nan;
        data.batch(step, B, Tn, in.data(), tgt.data());
        if (lead)  // over NCCL rank 0 replays every shard itself; the others are done
          nan_where = attribute_nan(model, *trainee.step, in.data(), tgt.data(), step, cfg.seed);
        break;
      }
      if (lead && checkpoint && step + 1 < cfg.steps)
        write_checkpoint(trace,
                         {step + 1, widen(std::as_const(model).params(), model.stream()),
                          widen(optim.first_moment(), model.stream()),
                          widen(optim.second_moment(), model.stream()), start.token_counts},
                         checkpoint_slot(step + 1, cfg.checkpoint_every));
      // SIGINT/SIGTERM/SIGHUP/SIGPIPE: the step is done and flushed. Over NCCL only what every
      // rank reported counts, so that all stop at this step.
      if (stop != 0 || (!comm && stop_signal() != 0)) {
        result.status = RunStatus::Interrupted;
        result.signal = stop != 0 ? stop : stop_signal();
        break;
      }
    }
  } catch (const TraceWriteError&) {
    throw;  // the trace cannot take the record
  } catch (const BackendError&) {
    throw;  // the device's verdict on the run's setup (busy, out of memory): run() maps it
  } catch (const std::exception& e) {
    // A kernel (or anything else in a step) threw: the trace records the steps before it, status
    // "failed" and where, and the command says the same in one line.
    progress.done();
    const std::string failure = crash.where() + ": " + e.what();
    trace.finish(RunStatus::Failed, {{"failure", failure}});
    throw RunFailed("train failed " + failure + " (trace '" + opt.out + "' records it)");
  }
  progress.done();
  // A step that could not be captured fell back to launching op by op: the same numbers, slower.
  if (!model.graph_failure().empty())
    std::fprintf(stderr, "divlab: note: CUDA graph steps are off for this run (%s)\n",
                 model.graph_failure().c_str());
  if (kernels.profiler && lead)
    print_profile(kernels.profiler->times(),
                  std::max<int64_t>(1, result.steps - start.first_step - 1),
                  last_wall_s - profiled_from_s);
  if (kernels.profiler && tap) print_shadow_timing(tap->timing(), tap->in_background());
  trace.write_array("/dataset/token_counts", start.token_counts);
  if (cfg.final_weights && lead)
    write_weights(trace, WhichWeights::Final, model.layout(),
                  widen(std::as_const(model).params(), model.stream()), result.steps);
  trace.finish(result.status, nan_where);
  return result;
}

}  // namespace

namespace {
TrainResult run(const RunConfig& cfg, const TrainOptions& opt, const Resume* resume,
                const RankLaunch* launch) {
  if (launch) {
    check_world_size(*launch, cfg.ranks);
    // Before anything starts CUDA in this process.
    if (cfg.data_parallel == RankTransport::Nccl) use_local_gpu(launch->world.local_rank);
  }
  std::string device;
  try {
    device = open_backend(cfg.backend);
    with_backend_catalogue(cfg.backend, cfg.precision, [](const auto&) {});
  } catch (const BackendError& e) {
    throw InputError(e.what());
  }
  const int threads = cfg.threads > 0 ? cfg.threads : default_threads();
  omp_set_num_threads(threads);  // Eigen itself never threads (kernels/catalogue.cpp)
  DatasetOptions dopt;
  dopt.vocab = cfg.model.vocab;
  dopt.seq_len = cfg.model.seq_len;
  dopt.seed = cfg.seed;
  const auto data = make_dataset(cfg.data, dopt);
  TrainResult r;
  try {
    if (cfg.precision == Precision::Fp64)
      r = train_impl<double>(cfg, opt, *data, threads, device, resume, launch);
    else if (cfg.precision == Precision::Bf16)
      r = train_impl<float, bf16>(cfg, opt, *data, threads, device, resume, launch);
    else
      r = train_impl<float>(cfg, opt, *data, threads, device, resume, launch);
  } catch (const BackendError& e) {
    if (dynamic_cast<const BackendBusy*>(&e)) throw DeviceBusyError(e.what());
    throw InputError(e.what());
  }
  return r;
}
}  // namespace

namespace {
// The command one rank of `cfg`'s run starts with: the resolved config as overrides, so that
// every rank computes exactly this run, whichever command resolved it (train, a sweep's cell).
std::vector<std::string> rank_command(const RunConfig& cfg, const TrainOptions& opt) {
  std::vector<std::string> args = {self_exe(), "train", "--out", opt.out, "--set"};
  for (const auto& [key, value] : cfg.resolved) args.push_back(key + "=" + value);
  if (opt.force) args.push_back("--force");
  if (!opt.progress) args.push_back("--quiet");
  if (opt.profile) args.push_back("--profile");
  return args;
}
}  // namespace

int64_t run_host_bytes(const RunConfig& cfg) {
  if (cfg.backend != Backend::Cpu) return 0;
  const int64_t processes = ranks_are_processes(cfg.data_parallel) ? cfg.ranks : 1;
  const int64_t each =
      cfg.precision == Precision::Fp64   ? run_device_bytes<double, double>(cfg, false)
      : cfg.precision == Precision::Bf16 ? run_device_bytes<float, bf16>(cfg, false)
                                         : run_device_bytes<float, float>(cfg, false);
  return processes * each;
}

TrainResult train(const RunConfig& cfg, const TrainOptions& opt) {
  const std::optional<RankLaunch> launch = launched_rank(cfg.data_parallel);
  // One writer per trace: a second run (--force included) is refused while this one lives.
  std::optional<MadeFolders> folders;  // declared first: removed (if still empty) after the lock
  std::optional<WriterLock> lock;
  if (answers_for_output(launch)) {
    check_output_path(opt.out, opt.force);
    folders.emplace(opt.out, "output");
    lock.emplace(opt.out + ".lock", "--out '" + opt.out + "'");
  }
  TrainResult r;
  if (ranks_are_processes(cfg.data_parallel) && !launch) {
    if (opt.on_start) opt.on_start();
    r.launcher_exit = launch_local_ranks(cfg.ranks, cfg.data_parallel == RankTransport::Nccl,
                                         opt.out, rank_command(cfg, opt));
  } else {
    r = run(cfg, opt, nullptr, launch ? &*launch : nullptr);
  }
  if (lock) lock->done();
  return r;
}

namespace {
// A resumed run continues the run its trace records: an override may lengthen it or change how
// it is carried out, never what its steps compute (the model, data, optimizer, kernels), or the
// steps already in the trace would be mislabelled.
void check_resume_overrides(const RunConfig& recorded, const RunConfig& now,
                            const std::string& path) {
  static const std::vector<std::string> may_change = {
      "train.steps", "train.threads", "trace.flush_steps", "trace.flush_seconds",
      "checkpoint.every", "debug.sync_kernels", "debug.cuda_graphs", "debug.abort_at_step",
      // Simulated and NCCL ranks compute the same numbers (experiments/data_parallel.h).
      "train.data_parallel"};
  std::map<std::string, std::string> before(recorded.resolved.begin(), recorded.resolved.end());
  std::map<std::string, std::string> after(now.resolved.begin(), now.resolved.end());
  for (const auto& [key, value] : after) {
    const auto it = before.find(key);
    if (it != before.end() && it->second == value) continue;
    if (std::find(may_change.begin(), may_change.end(), key) == may_change.end())
      throw InputError(
          "--resume '" + path + "': --set " + key + " would change what the run " +
          "computes (recorded " + (it == before.end() ? std::string("unset") : it->second) +
          ", given " + value + "); a resumed run may only change train.steps, train.threads, " +
          "trace.flush_*, trace.final_weights, checkpoint.every, train.data_parallel and " +
          "debug.*");
    if (key == "train.steps" && now.optim.schedule == LrSchedule::Cosine)
      throw InputError("--resume '" + path + "': --set train.steps changes the cosine " +
                       "schedule, which spans train.steps, so the steps already run would have " +
                       "had other learning rates");
  }
}

}  // namespace

TrainResult resume_training(const std::string& path, const std::vector<std::string>& overrides,
                            bool progress) {
  Resume resume;
  RunConfig cfg;
  require_input_file(path, "--resume", ", not a trace (a run's --out file)");
  // What the trace records decides whether it may resume at all, before the lock is taken (a
  // refusal then leaves every file as it was); over NCCL, whether this process is a rank (and
  // which) decides who takes the lock.
  {
    const TraceReader r(path);
    const std::string recorded = r.string_attr("/", "config_toml");
    cfg = load_config_text(recorded, path, overrides, ConfigFrom::Trace);
    check_resume_overrides(parse_config_text(recorded, path, {}, ConfigFrom::Trace), cfg, path);
    // A library rebuilt since would compute the remaining steps with other kernels under the
    // same names.
    if (r.has_attr("/", "plugins"))
      if (const std::string changed = changed_plugin(r.string_attr("/", "plugins"));
          !changed.empty())
        throw InputError("--resume '" + path + "': " + changed +
                         ": its kernels would compute the remaining steps");
  }
  const std::optional<RankLaunch> launch = launched_rank(cfg.data_parallel);
  std::optional<WriterLock> lock;
  if (answers_for_output(launch)) lock.emplace(path + ".lock", "--resume '" + path + "'");
  {
    const TraceReader r(path);
    const auto done = int64_t(r.ints("/metrics/step").size());
    if (r.status() == RunStatus::Completed && done >= cfg.steps)
      throw InputError("--resume '" + path + "': the run completed its " + std::to_string(done) +
                       " steps; nothing left to run (--set train.steps=N to go further)");
    resume.checkpoint = read_checkpoint(r);
    if (!resume.checkpoint) {
      // Killed before its first checkpoint (or checkpoint.every = 0): the trace still holds
      // the config, and batches depend on (seed, step) alone, so starting over loses nothing.
      if (progress)
        std::cerr << "divlab: '" << path << "' holds no checkpoint yet; starting over from step 0"
                  << std::endl;
    } else {
      if (resume.checkpoint->next_step >= cfg.steps)
        throw InputError("--resume '" + path + "': its checkpoint is at step " +
                         std::to_string(resume.checkpoint->next_step) + " of train.steps = " +
                         std::to_string(cfg.steps) + "; nothing left to run");
      resume.history = read_history(r, resume.checkpoint->next_step);
      resume.initial_weights = read_weights(r, WhichWeights::Initial, param_layout(cfg.model));
    }
  }
  if (access(path.c_str(), W_OK) != 0) throw InputError("--resume '" + path + "': not writable");
  TrainOptions opt;
  opt.out = path, opt.force = true, opt.progress = progress;
  TrainResult r;
  if (ranks_are_processes(cfg.data_parallel) && !launch) {
    std::vector<std::string> args = {self_exe(), "train", "--resume", path};
    if (!overrides.empty()) args.push_back("--set");
    args.insert(args.end(), overrides.begin(), overrides.end());
    if (!progress) args.push_back("--quiet");
    r.launcher_exit =
        launch_local_ranks(cfg.ranks, cfg.data_parallel == RankTransport::Nccl, path, args);
  } else
    r = run(cfg, opt, &resume, launch ? &*launch : nullptr);
  if (lock) lock->done();
  return r;
}

}  // namespace divlab
