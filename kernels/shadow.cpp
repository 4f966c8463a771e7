#include "kernels/shadow.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <tuple>
#include <type_traits>

#include "kernels/op_spec.h"
#include "kernels/shadow_replay.h"

namespace divlab {

namespace {

using shadow_detail::moved_list;
using shadow_detail::Output;
using shadow_detail::replay;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Copies of what the run's kernel is about to read (host or device memory) to the host,
// unconverted. On a device the copy is queued on the call's stream ahead of the kernel, never
// waited for here: a wait would drain the GPU's queue, and the launches after it would then run
// with the GPU idle.
template <class T, class A>
struct Recorder {
  ShadowTap<T, A>& t;
  typename ShadowTap<T, A>::Capture c;  // c.stream: the call's, where the copies queue

  template <class V>
  void arg(const ArgSpec& spec, V v, size_t index) {
    if constexpr (std::is_pointer_v<V>) {
      using E = std::remove_const_t<std::remove_pointer_t<V>>;
      if (!v) {
        c.null_args |= uint64_t(1) << index;
        return;
      }
      const size_t n = size_t(spec.size());
      if constexpr (std::is_same_v<E, TokenId>) {
        if (spec.role != ArgRole::TokenIds) return;
        c.ids = Staged<TokenId>(n, StagingAllocator<TokenId>(&t.staging()));
        t.run_kernels().memory->download_async(c.stream, c.ids.data(), v, sizeof(TokenId) * n);
      } else {
        if (spec.role != ArgRole::Input) return;
        StagedArray copy = StagedArray::make<E>(int64_t(n), &t.staging());
        t.run_kernels().memory->download_async(c.stream, copy.bytes.data(), v, sizeof(E) * n);
        c.inputs.push_back(std::move(copy));
      }
    } else {
      c.values.push_back(double(v));  // sizes, eps, dloss, flags: exact in a double
    }
  }
};

// The tap of one op, bound to its ShadowTap (Kernel::state): records the call's inputs when the
// tap is armed and asks for the op, then calls the run's own kernel unchanged. Recording comes
// first because the kernel may add into arrays the op also reads (none today; safe anyway).
template <class T, class A, Op op, class Fn>
struct Tap;
template <class T, class A, Op op, class... Args>
struct Tap<T, A, op, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    auto& t = *static_cast<ShadowTap<T, A>*>(ctx.state);
    if (t.wants(op_name(op))) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::tuple<Args...> a(args...);
      const auto spec = OpSpec<op>::args(a);
      Recorder<T, A> r{t, {}};
      r.c.seed = ctx.seed;
      r.c.stream = ctx.stream;
      size_t index = 0;
      std::apply([&](auto... v) { ((r.arg(spec[index], v, index), ++index), ...); }, a);
      t.store(op_name(op), std::move(r.c), seconds_since(t0));
    }
    (t.run_kernels().*kernel_member<op, T, A>())(ctx, args...);
  }
};

// Installs the tap of op `name` into `k`, bound to `tap`.
template <class T, class A>
void install_tap(KernelSet<T, A>& k, const std::string& name, ShadowTap<T, A>* tap) {
  using S = OpSignatures<T, A>;
// Op names and signatures are pasted into declarations, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_INSTALL_TAP(op_name, Signature) \
  if constexpr (OpSpec<Op::op_name>::known)    \
    if (name == #op_name)                      \
      k.op_name = {&Tap<T, A, Op::op_name, typename S::Signature>::call, static_cast<void*>(tap)};
  DIVLAB_OPS(DIVLAB_INSTALL_TAP)
#undef DIVLAB_INSTALL_TAP
  // NOLINTEND(bugprone-macro-parentheses)
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
  // Every op with a spec (kernels/op_spec.h) that the model's forward and backward call (not the
  // bf16 weight copy, the optimizer's reduction and updates, or the reduction between
  // data-parallel ranks, which run outside them). attention_backward's replays remake the state
  // its forward saves (shadow_replay.cpp).
  std::vector<std::string> ops;
// Op names are pasted into strings and template arguments only.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_SHADOWABLE(name, Signature) \
  if (OpSpec<Op::name>::known && model_op(Op::name)) ops.push_back(#name);
  DIVLAB_OPS(DIVLAB_SHADOWABLE)
#undef DIVLAB_SHADOWABLE
  // NOLINTEND(bugprone-macro-parentheses)
  return ops;
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
    install_tap(tapped_, s.op, this);
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
  // Behind every copy the step's calls and the candidates' replays queued, on the run's stream.
  void* stream = captured_.empty() || captured_.begin()->second.empty()
                     ? nullptr
                     : captured_.begin()->second.front().stream;
  job->captured = std::move(captured_);
  captured_.clear();
  job->mem = run_.memory;
  job->fence = run_.memory->fence(stream);
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
