#include "kernels/shadow.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <tuple>
#include <type_traits>

#include "kernels/op_spec.h"
#include "kernels/op_tracker.h"
#include "kernels/shadow_replay.h"

namespace divlab {

namespace {

using shadow_detail::moved_list;
using shadow_detail::Output;
using shadow_detail::replay;

// A pool's check before it grows: the device's, naming what the memory is for.
std::function<void(size_t)> checked_growth(const DeviceComparison* device, const char* what) {
  if (!device) return {};
  return [device, what](size_t bytes) { device->check_fits(bytes, what); };
}

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
      const MemoryOps& mem = *t.run_kernels().memory;
      if constexpr (std::is_same_v<E, TokenId>) {
        if (spec.role != ArgRole::TokenIds) return;
        if (t.on_device()) {
          c.device_ids = PoolBlock(&t.device_captures(), sizeof(TokenId) * n);
          mem.copy(c.stream, c.device_ids.get(), v, sizeof(TokenId) * n);
          return;
        }
        c.ids = Staged<TokenId>(n, StagingAllocator<TokenId>(&t.staging()));
        mem.download_async(c.stream, c.ids.data(), v, sizeof(TokenId) * n);
      } else {
        if (spec.role != ArgRole::Input) return;
        if (t.on_device()) {
          DeviceArray copy = DeviceArray::make<E>(int64_t(n), &t.device_captures());
          mem.copy(c.stream, copy.block.get(), v, sizeof(E) * n);
          c.device_inputs.push_back(std::move(copy));
          return;
        }
        StagedArray copy = StagedArray::make<E>(int64_t(n), &t.staging());
        mem.download_async(c.stream, copy.bytes.data(), v, sizeof(E) * n);
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

StagingPool::~StagingPool() {
  for (const auto& [bytes, p] : free_)
    place_ == Place::Device ? mem_.release(p) : mem_.release_staging(p);
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
  if (before_growing_) before_growing_(bytes);
  return place_ == Place::Device ? mem_.allocate(bytes) : mem_.allocate_staging(bytes);
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
    // Each entry's metrics are a trace series of their own, named by the entry.
    for (const auto& seen : specs)
      if (seen.op == s.op && seen.variant == s.variant)
        throw UnknownKernel("shadow.variants entry '" + e + "' is named twice");
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
  // With a DeviceComparison: each spec's sums (ShadowSums) as they come back, and the staged
  // token counts and tokens the device reads, kept until the fence has passed.
  std::vector<StagedArray> sums;
  Staged<int64_t> staged_counts;
  Staged<TokenId> staged_batch;
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
                           const Catalogue<T, A>& variants, int background,
                           const DeviceComparison* device)
    : run_(run_kernels),
      tapped_(run_kernels),
      staging_(*run_kernels.memory),
      host_arrays_(host_memory()),
      replay_context_(*run_kernels.memory),
      device_(device),
      device_captures_(*run_kernels.memory, StagingPool::Place::Device,
                       checked_growth(device,
                                      "shadow mode's device copies of the recorded inputs (fewer "
                                      "shadow.variants, or shadow.reference = \"fp64\", which "
                                      "keeps them on the host)")),
      device_arrays_(*run_kernels.memory, StagingPool::Place::Device,
                     checked_growth(device,
                                    "shadow mode's replays on the device (fewer shadow.variants, "
                                    "or shadow.reference = \"fp64\")")),
      variants_(variants),
      specs_(specs) {
  if (device_) {
    if (!std::is_same_v<T, float> || run_.memory->host_accessible)
      throw std::logic_error("shadow: a device comparison is for fp32 runs on a device");
    stream_ = std::make_unique<OwnedStream>(*run_.memory);
    replay_context_.set_stream(stream_->get());
  }
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
  if (!job.sums.empty()) {  // compared on the device: the sums are all that is left to read
    for (const StagedArray& sums : job.sums) out.push_back(metrics_from_sums(sums.data<double>()));
    return out;
  }
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
  for (const auto& s : specs_)
    if (!captured_.count(s.op))
      throw std::logic_error("shadow: op " + s.op + " was not called during the step");
  // Behind every copy the step's calls and the candidates' replays queued, on the run's stream;
  // on the tap's own stream with a DeviceComparison.
  void* stream = captured_.empty() || captured_.begin()->second.empty()
                     ? nullptr
                     : captured_.begin()->second.front().stream;
  if (device_) {
    evaluate_on_device(*job, batch, n);
    stream = stream_->get();
  } else {
    for (size_t i = 0; i < specs_.size(); ++i) {
      const ShadowSpec& s = specs_[i];
      const KernelSet<T, A> variant = variants_.select({{s.op, s.variant}});
      auto& outputs = job->candidate.emplace_back();
      mark_replay(int(i));
      for (const auto& call : captured_.at(s.op))
        outputs.push_back(replay<T, A>(s.op, call, variant, replay_context_, &staging_));
      mark_replay(-1);
    }
  }
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
void ShadowTap<T, A>::evaluate_on_device(Job& job, const TokenId* batch, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    using shadow_detail::replay_on_device;
    const MemoryOps& mem = *run_.memory;
    void* side = stream_->get();
    // After the recorded copies, queued on the calls' streams (the run's).
    std::vector<void*> waited;
    for (const auto& [op, calls] : captured_)
      for (const auto& c : calls)
        if (std::find(waited.begin(), waited.end(), c.stream) == waited.end()) {
          device_->wait_for(side, c.stream);
          waited.push_back(c.stream);
        }
    // The step's token counts and tokens, which bucket the rows.
    job.staged_counts = Staged<int64_t>(job.id_count.size(), StagingAllocator<int64_t>(&staging_));
    std::copy(job.id_count.begin(), job.id_count.end(), job.staged_counts.begin());
    job.staged_batch = Staged<TokenId>(size_t(n), StagingAllocator<TokenId>(&staging_));
    std::copy(batch, batch + n, job.staged_batch.begin());
    const PoolBlock counts(&device_arrays_, sizeof(int64_t) * job.staged_counts.size());
    const PoolBlock tokens(&device_arrays_, sizeof(TokenId) * size_t(n));
    mem.upload_async(side, counts.get(), job.staged_counts.data(), counts.bytes());
    mem.upload_async(side, tokens.get(), job.staged_batch.data(), tokens.bytes());
    const auto* id_count = static_cast<const int64_t*>(counts.get());
    const auto* ids = static_cast<const TokenId*>(tokens.get());

    std::vector<PoolBlock> sums;
    for (size_t i = 0; i < specs_.size(); ++i) {
      sums.emplace_back(&device_arrays_, sizeof(double) * ShadowSums::Count);
      mem.zero(side, sums.back().get(), sums.back().bytes());
    }
    // Op by op and call by call: the reference's outputs of one call, then each of that op's
    // candidates on the same call, compared at once, so one call's arrays are alive at a time.
    // Each spec's sums still add its calls in call order.
    std::map<std::string, std::vector<size_t>> specs_of_op;
    for (size_t i = 0; i < specs_.size(); ++i) specs_of_op[specs_[i].op].push_back(i);
    for (const auto& [op, indices] : specs_of_op) {
      std::vector<KernelSet<T, A>> candidates;
      for (size_t i : indices) candidates.push_back(variants_.select({{op, specs_[i].variant}}));
      for (const auto& call : captured_.at(op)) {
        const auto ref = replay_on_device<T, A>(op, call, *device_->reference, replay_context_,
                                                &device_arrays_, side, *device_);
        for (size_t j = 0; j < indices.size(); ++j) {
          mark_replay(int(indices[j]));
          const auto got = replay_on_device<T, A>(op, call, candidates[j], replay_context_,
                                                  &device_arrays_, side, *device_);
          mark_replay(-1);
          for (size_t o = 0; o < got.size(); ++o) {
            const DeviceArray& v = got[o].values;
            device_->tally(replay_context_.next(), static_cast<double*>(sums[indices[j]].get()),
                           v.block.get(), v.type,
                           static_cast<const float*>(ref[o].values.block.get()), got[o].rows,
                           got[o].cols, got[o].key, id_count, ids);
          }
        }
      }
    }
    for (const PoolBlock& block : sums) {
      job.sums.push_back(StagedArray::make<double>(ShadowSums::Count, &staging_));
      mem.download_async(side, job.sums.back().bytes.data(), block.get(), block.bytes());
    }
  } else {
    (void)job, (void)batch, (void)n;
    throw std::logic_error("shadow: a device comparison is for fp32 runs on a device");
  }
}

template <class T, class A>
void ShadowTap<T, A>::mark_replay(int spec) {
  if (note_) note_->shadow.store(spec);
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
