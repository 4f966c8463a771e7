#include "kernels/shadow.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "kernels/shadow_replay.h"

namespace divlab {

namespace {

using shadow_detail::moved_list;
using shadow_detail::Output;
using shadow_detail::replay;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Copies of what the run's kernels just read (host or device memory) to the host, unconverted.
// On a device the copy is queued behind the step's kernels, never waited for here: a wait would
// drain the GPU's queue, and the launches after it would then run with the GPU idle.
// Each tap function is bound to its tap (Kernel::state), so any number of taps can coexist.
template <class T, class A>
struct Recorder {
  const OpContext& ctx;
  ShadowTap<T, A>& t = *static_cast<ShadowTap<T, A>*>(ctx.state);
  template <class V>
  StagedArray copy(const V* p, int64_t n) const {
    StagedArray a = StagedArray::make<V>(n, &t.staging());
    t.run_kernels().memory->download_async(a.bytes.data(), p, sizeof(V) * size_t(n));
    return a;
  }
  Staged<TokenId> ids(const TokenId* p, int64_t n) const {
    Staged<TokenId> host(static_cast<size_t>(n), StagingAllocator<TokenId>(&t.staging()));
    t.run_kernels().memory->download_async(host.data(), p, sizeof(TokenId) * size_t(n));
    return host;
  }
  template <class... Arrays>
  static std::vector<StagedArray> inputs(Arrays&&... arrays) {
    return moved_list<StagedArray>(std::forward<Arrays>(arrays)...);
  }
  // Records one call: `make` builds the capture (the copies), timed.
  template <class MakeCapture>
  void record(const char* op, MakeCapture make) const {
    const auto t0 = std::chrono::steady_clock::now();
    typename ShadowTap<T, A>::Capture c = make();
    c.seed = ctx.seed;
    c.stream = ctx.stream;
    t.store(op, std::move(c), seconds_since(t0));
  }
};

// --- Taps: call the run's own kernel, then record its inputs if asked. ----------------------
template <class T, class A>
void tap_embed_rmsnorm_backward(const OpContext& ctx, T* dwte, T* dwpe, T* dw_norm,
                                const A* dy_norm, const T* dresid, const T* x0, const T* w_norm,
                                const T* rstd, const TokenId* tokens, int B, int T_, int C, int V) {
  Recorder<T, A> r{ctx};
  r.t.run_kernels().embed_rmsnorm_backward(ctx, dwte, dwpe, dw_norm, dy_norm, dresid, x0, w_norm,
                                           rstd, tokens, B, T_, C, V);
  if (!r.t.wants("embed_rmsnorm_backward")) return;
  const int64_t N = int64_t(B) * T_;
  r.record("embed_rmsnorm_backward", [&]() -> typename ShadowTap<T, A>::Capture {
    return {r.inputs(r.copy(dy_norm, N * C), r.copy(dresid, N * C), r.copy(x0, N * C),
                     r.copy(w_norm, C), r.copy(rstd, N)),
            r.ids(tokens, N),
            {B, T_, C, V},
            0.0};
  });
}

template <class T, class A>
void tap_rmsnorm_forward(const OpContext& ctx, A* y, T* rstd, const T* x, const T* w, int N, int C,
                         T eps) {
  Recorder<T, A> r{ctx};
  r.t.run_kernels().rmsnorm_forward(ctx, y, rstd, x, w, N, C, eps);
  if (r.t.wants("rmsnorm_forward"))
    r.record("rmsnorm_forward", [&]() -> typename ShadowTap<T, A>::Capture {
      return {r.inputs(r.copy(x, int64_t(N) * C), r.copy(w, C)), {}, {N, C}, double(eps)};
    });
}

template <class T, class A>
void tap_rmsnorm_backward(const OpContext& ctx, T* dresid, T* dw, const A* dy, const T* x,
                          const T* w, const T* rstd, int N, int C) {
  Recorder<T, A> r{ctx};
  // Record before the call: the run's kernel adds into dresid, which is not an input here.
  if (r.t.wants("rmsnorm_backward"))
    r.record("rmsnorm_backward", [&]() -> typename ShadowTap<T, A>::Capture {
      return {r.inputs(r.copy(dy, int64_t(N) * C), r.copy(x, int64_t(N) * C), r.copy(w, C),
                       r.copy(rstd, N)),
              {},
              {N, C},
              0.0};
    });
  r.t.run_kernels().rmsnorm_backward(ctx, dresid, dw, dy, x, w, rstd, N, C);
}

template <class T, class A>
void tap_linear_forward(const OpContext& ctx, A* y, const A* x, const A* W, int N, int in,
                        int out) {
  Recorder<T, A> r{ctx};
  r.t.run_kernels().linear_forward(ctx, y, x, W, N, in, out);
  if (r.t.wants("linear_forward"))
    r.record("linear_forward", [&]() -> typename ShadowTap<T, A>::Capture {
      return {r.inputs(r.copy(x, int64_t(N) * in), r.copy(W, int64_t(out) * in)),
              {},
              {N, in, out},
              0.0};
    });
}

template <class T, class A>
void tap_attention_forward(const OpContext& ctx, A* out, A* att, const A* qkv, int B, int T_, int C,
                           int NH) {
  Recorder<T, A> r{ctx};
  r.t.run_kernels().attention_forward(ctx, out, att, qkv, B, T_, C, NH);
  if (r.t.wants("attention_forward"))
    r.record("attention_forward", [&]() -> typename ShadowTap<T, A>::Capture {
      return {r.inputs(r.copy(qkv, int64_t(B) * T_ * 3 * C)), {}, {B, T_, C, NH}, 0.0};
    });
}

template <class T, class A>
void tap_cross_entropy(const OpContext& ctx, T* losses, A* dlogits, const A* logits,
                       const TokenId* targets, int N, int V, T dloss) {
  Recorder<T, A> r{ctx};
  r.t.run_kernels().cross_entropy(ctx, losses, dlogits, logits, targets, N, V, dloss);
  if (r.t.wants("cross_entropy"))
    r.record("cross_entropy", [&]() -> typename ShadowTap<T, A>::Capture {
      return {r.inputs(r.copy(logits, int64_t(N) * V)), r.ids(targets, N), {N, V}, double(dloss)};
    });
}

}  // namespace

int frequency_bucket(int64_t count) {
  if (count <= 0) return -1;
  if (count == 1) return 0;
  if (count < 4) return 1;
  if (count < 16) return 2;
  if (count < 64) return 3;
  if (count < 256) return 4;
  if (count < 1024) return 5;
  return 6;
}

StagingPool::~StagingPool() {
  for (const auto& [bytes, p] : free_) mem_.release_staging(p);
}

void* StagingPool::get(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = free_.find(bytes); it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
  }
  return mem_.allocate_staging(bytes);
}

void StagingPool::put(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(bytes, p);
}

std::vector<std::string> shadowable_ops() {
  return {"embed_rmsnorm_backward", "rmsnorm_forward",   "rmsnorm_backward",
          "linear_forward",         "attention_forward", "cross_entropy"};
}

template <class Cat>
std::vector<ShadowSpec> parse_shadow_specs(const std::vector<std::string>& entries,
                                           const Cat& catalogue) {
  std::vector<ShadowSpec> specs;
  const auto ops = shadowable_ops();
  for (const auto& e : entries) {
    const auto eq = e.find('=');
    if (eq == std::string::npos)
      throw UnknownKernel("shadow.variants entry '" + e + "': expected op=variant");
    ShadowSpec s{e.substr(0, eq), e.substr(eq + 1)};
    if (std::find(ops.begin(), ops.end(), s.op) == ops.end()) {
      std::string valid;
      for (const auto& o : ops) valid += (valid.empty() ? "" : ", ") + o;
      throw UnknownKernel("shadow.variants entry '" + e + "': shadow mode evaluates " + valid);
    }
    try {
      catalogue.select({{s.op, s.variant}});
    } catch (const UnknownKernel& err) {
      throw UnknownKernel("shadow.variants entry '" + e + "': " + err.what());
    }
    specs.push_back(s);
  }
  return specs;
}

template std::vector<ShadowSpec> parse_shadow_specs(const std::vector<std::string>&,
                                                    const Catalogue<float>&);
template std::vector<ShadowSpec> parse_shadow_specs(const std::vector<std::string>&,
                                                    const Catalogue<float, bf16>&);

// One submitted evaluation: the recorded inputs, the candidates' outputs (per spec, per call),
// and the batch's token counts.
// On a device its host arrays are being filled by queued copies until `fence` has passed: the
// reference side calls ready() before reading them, and a job dropped unread waits too, so its
// staging blocks go back to the pool only when no copy still writes into them.
template <class T, class A>
struct ShadowTap<T, A>::Job {
  int64_t step;
  std::map<std::string, std::vector<Capture>> captured;
  std::vector<std::vector<std::vector<Output>>> candidate;
  std::vector<TokenId> batch;
  std::vector<int64_t> id_count;
  const MemoryOps* mem = nullptr;
  void* fence = nullptr;

  void ready() {
    void* f = fence;
    fence = nullptr;
    if (f) mem->wait_fence(f);
  }
  ~Job() {
    try {
      ready();
    } catch (...) {  // the run is failing already; the failure is reported elsewhere
    }
  }
};

template <class T, class A>
ShadowTap<T, A>::ShadowTap(const KernelSet<T, A>& run_kernels, const std::vector<ShadowSpec>& specs,
                           const Catalogue<T, A>& variants, int background)
    : run_(run_kernels),
      tapped_(run_kernels),
      staging_(*run_kernels.memory),
      host_arrays_(host_memory()),
      replay_context_(*run_kernels.memory),
      variants_(variants),
      specs_(specs) {
  for (const auto& s : specs) {
    ++wanted_[s.op];
    if (s.op == "embed_rmsnorm_backward")
      tapped_.embed_rmsnorm_backward = {tap_embed_rmsnorm_backward<T, A>, this};
    if (s.op == "rmsnorm_forward") tapped_.rmsnorm_forward = {tap_rmsnorm_forward<T, A>, this};
    if (s.op == "rmsnorm_backward") tapped_.rmsnorm_backward = {tap_rmsnorm_backward<T, A>, this};
    if (s.op == "linear_forward") tapped_.linear_forward = {tap_linear_forward<T, A>, this};
    if (s.op == "attention_forward")
      tapped_.attention_forward = {tap_attention_forward<T, A>, this};
    if (s.op == "cross_entropy") tapped_.cross_entropy = {tap_cross_entropy<T, A>, this};
  }
  if (background < 0 ? !run_.memory->host_accessible : background > 0)
    worker_ = std::thread([this] { work(); });
}

template <class T, class A>
ShadowTap<T, A>::~ShadowTap() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

template <class T, class A>
void ShadowTap<T, A>::arm() {
  captured_.clear();
  armed_ = true;
}

namespace {
// The fp64 reference of every recorded call and the comparison with the candidates' outputs.
template <class T, class A, class Job, class Spec>
std::vector<ShadowMetrics> compare_with_reference(const Job& job, const std::vector<Spec>& specs,
                                                  StagingPool* pool) {
  const KernelSet<double> reference = cpu_catalogue<double>().select({});
  OpContextSource host(host_memory());
  // One fp64 replay per recorded call, shared by every variant of that op.
  std::map<std::string, std::vector<std::vector<Output>>> ref_outputs;
  std::vector<ShadowMetrics> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& calls = job.captured.at(specs[i].op);
    auto& refs = ref_outputs[specs[i].op];
    if (refs.empty())
      for (const auto& call : calls)
        refs.push_back(replay<T, A>(specs[i].op, call, reference, host, pool));
    out.push_back(
        shadow_detail::compare_outputs(job.candidate[i], refs, job.id_count, job.batch.data()));
  }
  return out;
}
}  // namespace

template <class T, class A>
void ShadowTap<T, A>::submit(const TokenId* batch, int64_t n, int vocab, int64_t step) {
  armed_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto job = std::make_unique<Job>();
  job->step = step;
  job->batch.assign(batch, batch + n);
  job->id_count.assign(size_t(vocab), 0);
  for (int64_t i = 0; i < n; ++i) ++job->id_count[batch[i]];
  for (const auto& s : specs_) {
    const auto it = captured_.find(s.op);
    if (it == captured_.end())
      throw std::logic_error("shadow: op " + s.op + " was not called during the step");
    const KernelSet<T, A> variant = variants_.select({{s.op, s.variant}});
    auto& outputs = job->candidate.emplace_back();
    for (const auto& call : it->second)
      outputs.push_back(replay<T, A>(s.op, call, variant, replay_context_, &staging_));
  }
  job->captured = std::move(captured_);
  captured_.clear();
  job->mem = run_.memory;
  job->fence = run_.memory->fence();
  const double candidates_s = seconds_since(t0);
  if (!worker_.joinable()) {
    const auto t1 = std::chrono::steady_clock::now();
    job->ready();
    done_.push_back({step, compare_with_reference<T, A>(*job, specs_, &host_arrays_)});
    timing_.evaluations += 1;
    timing_.candidates_s += candidates_s;
    timing_.reference_s += seconds_since(t1);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const auto t1 = std::chrono::steady_clock::now();
  changed_.wait(lock, [&] { return pending_.size() < kMaxPending || failure_; });
  timing_.evaluations += 1;
  timing_.candidates_s += candidates_s;
  timing_.waited_s += seconds_since(t1);
  pending_.push_back(std::move(job));
  changed_.notify_all();
}

template <class T, class A>
void ShadowTap<T, A>::work() {
  // Half the cores: the training thread, which launches the GPU's work, must never wait for
  // one, and idle OpenMP threads spin for a while after each parallel region.
  omp_set_num_threads(std::max(1, omp_get_num_procs() / 2));
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;
    Job& job = *pending_.front();
    lock.unlock();
    Result r{job.step, {}};
    std::exception_ptr failure;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      job.ready();
      r.metrics = compare_with_reference<T, A>(job, specs_, &host_arrays_);
    } catch (...) {
      failure = std::current_exception();
    }
    const double seconds = seconds_since(t0);
    lock.lock();
    timing_.reference_s += seconds;
    pending_.pop_front();
    if (failure && !failure_) failure_ = failure;
    if (!failure) done_.push_back(std::move(r));
    changed_.notify_all();
  }
}

template <class T, class A>
std::vector<typename ShadowTap<T, A>::Result> ShadowTap<T, A>::collect(bool wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (wait) changed_.wait(lock, [&] { return pending_.empty() || failure_; });
  if (failure_) std::rethrow_exception(failure_);
  std::vector<Result> out;
  out.swap(done_);
  return out;
}

template <class T, class A>
typename ShadowTap<T, A>::Timing ShadowTap<T, A>::timing() {
  std::lock_guard<std::mutex> lock(mutex_);
  return timing_;
}

template class ShadowTap<float>;
template class ShadowTap<double>;
template class ShadowTap<float, bf16>;
}  // namespace divlab
