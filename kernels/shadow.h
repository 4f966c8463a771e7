// Shadow mode: evaluate candidate variants on a run's own live inputs, without touching the run.
//
// On an armed step the tap records the inputs of every call of every shadowed op (per-layer ops
// are called once per block; linear_forward five times per block and once for the LM head).
// Afterwards each listed variant runs on copies of those inputs, and its outputs are compared
// with the op's reference evaluated on the same inputs: in fp64 on the host, or, on a GPU, by the
// GPU's fp32 reference kernels with the comparison there too (DeviceComparison below); the
// metrics pool all calls. The run itself calls its own kernels unchanged, so its trajectory is
// bitwise the same with or without shadowing.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/memory.h"
#include "kernels/op_spec.h"
#include "kernels/registry.h"

namespace divlab {
struct OpNote;  // kernels/op_tracker.h
}

namespace divlab {

struct ShadowSpec {
  std::string op, variant;
};
// Parses "op=variant" entries, variants named in `catalogue` (the run's backend); throws
// UnknownKernel naming the entry for an unknown op or variant, or an op shadow mode cannot
// evaluate.
template <class Cat = Catalogue<float>>
std::vector<ShadowSpec> parse_shadow_specs(const std::vector<std::string>& entries,
                                           const Cat& catalogue = cpu_catalogue<float>());
// Ops whose inputs the tap can capture.
std::vector<std::string> shadowable_ops();

// Token-frequency buckets: an output row belongs to the bucket of its token's count in the
// step's batch (embedding rows: the id's count; per-position rows: the count of that position's
// id).
inline const std::vector<std::string>& frequency_bucket_labels() {
  static const std::vector<std::string> labels = {"1",      "2-3",      "4-15", "16-63",
                                                  "64-255", "256-1023", "1024+"};
  return labels;
}
// -1 for count 0. Host and device code (the GPU comparison) bucket alike.
DIVLAB_HOST_DEVICE constexpr int frequency_bucket(int64_t count) {
  return count <= 0     ? -1
         : count == 1   ? 0
         : count < 4    ? 1
         : count < 16   ? 2
         : count < 64   ? 3
         : count < 256  ? 4
         : count < 1024 ? 5
                        : 6;
}
// The bucket of output row `row` keyed by `key` (kernels/op_spec.h), given the step's token
// counts by id and its tokens; -1 for none.
DIVLAB_HOST_DEVICE inline int row_bucket(RowKey key, int64_t row, const int64_t* id_count,
                                         const TokenId* batch) {
  return key == RowKey::TokenId    ? frequency_bucket(id_count[row])
         : key == RowKey::Position ? frequency_bucket(id_count[batch[row]])
                                   : -1;
}

struct ShadowMetrics {
  double rel_l2 = 0;       // ||v - r|| / ||r|| over every output element
  double max_row_rel = 0;  // max over rows with ||r_row|| > 0 of ||v_row - r_row|| / ||r_row||
  double cosine = 0;       // <v, r> / (||v|| ||r||)
  std::vector<double> bucket_rel_l2;  // per frequency bucket; NaN where the bucket is empty
};

// The sums one spec's metrics come from, pooled over every output row of every recorded call
// (v: the candidate's values, r: the reference's), in one array of doubles that the host or a
// device fills alike. Per row: sum (v - r)^2, sum r^2, sum v^2, sum v r; the largest row ratio
// sqrt(diff / ref) (infinite where r_row = 0 and v_row differs), the rows whose diff is NaN, and
// diff and ref per frequency bucket.
struct ShadowSums {
  enum Index : int {
    Diff,
    Ref,
    Got,
    Dot,
    MaxRow,
    NanRows,
    BucketDiff,
    BucketRef = BucketDiff + 7,
    Count = BucketRef + 7
  };
};
ShadowMetrics metrics_from_sums(const double* sums);

// How a run on a device evaluates its shadow specs there (shadow.reference = "fp32_device"):
// the reference is the backend's fp32 reference kernels on the recorded inputs widened to fp32
// (exactly), the candidates read the recorded device copies in place, and the sums above are
// taken on the device in fp64, on a stream of the tap's own; only the sums cross to the host.
// kernels/cuda/shadow_compare.cu provides the GPU's.
struct DeviceComparison {
  const KernelSet<float>* reference;
  // n bf16 values widened to fp32, queued on `stream`.
  void (*widen_bf16)(void* stream, float* out, const bf16* in, int64_t n);
  // Work queued on `waiting` after this call runs after everything queued on `stream` so far.
  void (*wait_for)(void* waiting, void* stream);
  // Throws (the backend's out-of-memory error, naming `what`) when `bytes` more will not fit.
  void (*check_fits)(size_t bytes, const std::string& what);
  // Adds one output's comparison into `sums` (ShadowSums::Count doubles in device memory):
  // `got` (rows x cols of storage `type`) against `ref` (fp32), rows bucketed by `key` with the
  // step's token counts `id_count` [vocab] and tokens `batch` (device arrays). Queued on the
  // context's stream; folds rows in a fixed order, so the sums repeat bit for bit.
  void (*tally)(const OpContext& ctx, double* sums, const void* got, Storage type, const float* ref,
                int64_t rows, int64_t cols, RowKey key, const int64_t* id_count,
                const TokenId* batch);
  const char* description;  // what the trace records as the shadow reference
};

// Staging memory for the recorded inputs: the backend's fastest host memory (page-locked on
// CUDA), kept and reused step after step. Fresh pageable vectors made recording a step's inputs
// several times slower than the copies themselves (page faults; unpinned transfers).
// A pool of Place::Device blocks holds device memory instead (shadow.reference = "fp32_device":
// the recorded inputs and the replays' outputs stay on the device); `before_growing` is asked
// before each new block, so the need is checked before the memory is allocated.
class StagingPool {
 public:
  enum class Place { Staging, Device };
  explicit StagingPool(const MemoryOps& mem, Place place = Place::Staging,
                       std::function<void(size_t)> before_growing = {})
      : mem_(mem), place_(place), before_growing_(std::move(before_growing)) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  void* get(size_t bytes);
  void put(void* p, size_t bytes);

 private:
  const MemoryOps& mem_;
  Place place_;
  std::function<void(size_t)> before_growing_;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
};

// A block of a pool, handed back when dropped.
class PoolBlock {
 public:
  PoolBlock() = default;
  PoolBlock(StagingPool* pool, size_t bytes)
      : pool_(pool), p_(bytes ? pool->get(bytes) : nullptr), bytes_(bytes) {}
  PoolBlock(PoolBlock&& o) noexcept { swap(o); }
  PoolBlock& operator=(PoolBlock&& o) noexcept {
    PoolBlock(std::move(o)).swap(*this);
    return *this;
  }
  PoolBlock(const PoolBlock&) = delete;
  PoolBlock& operator=(const PoolBlock&) = delete;
  ~PoolBlock() {
    if (p_) pool_->put(p_, bytes_);
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void swap(PoolBlock& o) noexcept {
    std::swap(pool_, o.pool_), std::swap(p_, o.p_), std::swap(bytes_, o.bytes_);
  }
  StagingPool* pool_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// An array in device memory (a pool block) with its storage type: a recorded input, or a
// device replay's output.
struct DeviceArray {
  PoolBlock block;
  Storage type = Storage::F32;
  int64_t size = 0;
  template <class V>
  static DeviceArray make(int64_t n, StagingPool* pool) {
    return {PoolBlock(pool, size_t(n) * sizeof(V)), storage_of<V>(), n};
  }
};

template <class T>
struct StagingAllocator {
  using value_type = T;
  // A staged array moved into another takes its pool along (captures are built, then moved).
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  StagingPool* pool = nullptr;
  StagingAllocator() = default;  // for arrays that stay empty (a capture without token ids)
  explicit StagingAllocator(StagingPool* p) : pool(p) {}
  template <class U>
  StagingAllocator(const StagingAllocator<U>& o) : pool(o.pool) {}
  T* allocate(size_t n) {
    if (!pool) throw std::logic_error("StagingAllocator: no pool to allocate from");
    return static_cast<T*>(pool->get(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) { pool->put(p, n * sizeof(T)); }
  // Default-initialises: staged arrays are overwritten by a copy at once, so no zero fill.
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0)
      ::new (static_cast<void*>(p)) U;
    else
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const StagingAllocator<U>& o) const {
    return pool == o.pool;
  }
  template <class U>
  bool operator!=(const StagingAllocator<U>& o) const {
    return pool != o.pool;
  }
};
template <class T>
using Staged = std::vector<T, StagingAllocator<T>>;

// An array in staging memory with its storage type: a recorded input (the run's T or A), or a
// replay's output. Widened to double only where compared.
struct StagedArray {
  Staged<unsigned char> bytes;
  Storage type = Storage::F32;
  int64_t size = 0;
  template <class V>
  static StagedArray make(int64_t n, StagingPool* pool) {
    return {Staged<unsigned char>(size_t(n) * sizeof(V), StagingAllocator<unsigned char>(pool)),
            storage_of<V>(), n};
  }
  template <class V>
  V* data() {
    check(storage_of<V>());
    return reinterpret_cast<V*>(bytes.data());
  }
  template <class V>
  const V* data() const {
    check(storage_of<V>());
    return reinterpret_cast<const V*>(bytes.data());
  }
  double at(int64_t i) const { return stored_value(bytes.data(), type, i); }

 private:
  void check(Storage want) const {
    if (want != type) throw std::logic_error("shadow: an array read as another storage type");
  }
};

template <class T, class A = T>
class ShadowTap {
 public:
  // Any number of taps may coexist (each tap function is bound to its tap); the tap must outlive
  // every use of kernels(). The variants come from `variants` (the run's backend). Without
  // `device`, the recorded inputs go to the host, the candidates run on uploaded copies of them
  // (on the GPU as GPU kernels) and the fp64 reference and the comparison on the CPU. With
  // `device` (a run on a device, T = float), everything stays there (DeviceComparison).
  // `background`: finish evaluations on a worker thread (the default where the run's memory is
  // on a device).
  ShadowTap(const KernelSet<T, A>& run_kernels, const std::vector<ShadowSpec>& specs,
            const Catalogue<T, A>& variants, int background = -1,
            const DeviceComparison* device = nullptr);
  ~ShadowTap();
  ShadowTap(const ShadowTap&) = delete;  // the tapped kernels point at this object
  ShadowTap& operator=(const ShadowTap&) = delete;
  // The kernels the model should call: the run's own, with taps on the shadowed ops.
  const KernelSet<T, A>& kernels() const { return tapped_; }
  // Record the calls of the shadowed ops until submit().
  void arm();
  // Evaluates every spec on what was recorded since arm(), given the batch's input tokens. The
  // candidates run here, in the caller's thread (on the GPU: queued on the run's stream, from the
  // recorded inputs, with every copy to and from the host queued too, so nothing here waits for
  // the GPU; the worker waits for a fence behind them). The fp64 reference and the comparison run
  // on a worker thread when the run lives on a device, so the GPU keeps training meanwhile; on the
  // CPU, where both would compete for the same cores, they run here. At most kMaxPending
  // evaluations wait for the worker: beyond that submit() blocks, and the wait shows up in the
  // run's step time. With a DeviceComparison everything, the reference and the comparison
  // included, is queued here on the tap's own stream, and the worker only waits for its fence
  // and reads the sums.
  void submit(const TokenId* batch_tokens, int64_t n, int vocab, int64_t step);
  struct Result {
    int64_t step;
    std::vector<ShadowMetrics> metrics;  // one per spec, in spec order
  };
  // Finished evaluations, oldest first; with wait = true every submitted one. Rethrows an
  // exception the worker hit.
  std::vector<Result> collect(bool wait);
  static constexpr size_t kMaxPending = 2;
  // Where shadow mode's time goes (wall seconds, summed over evaluations): recording the inputs
  // and running the candidates in the training thread, waiting there for a free slot, and the
  // reference + comparison (on the worker when there is one).
  struct Timing {
    int64_t evaluations = 0;
    double capture_s = 0, candidates_s = 0, waited_s = 0, reference_s = 0;
  };
  Timing timing();
  bool in_background() const { return worker_.joinable(); }
  // Marks `note->shadow` with a spec's index while that spec's candidate replays, and clears it
  // when the replay returns, so that a candidate that throws or crashes there is named (the
  // trainer's crash report) instead of the run's last op. Null: no marks.
  void name_replays_in(OpNote* note) { note_ = note; }

  // One op's recorded call: copies of its inputs in their storage types (exact), its token ids,
  // sizes and scalars. Host copies from a device are queued, not finished: readable only once
  // the evaluation's fence has passed. With a DeviceComparison the copies stay on the device.
  struct Capture {
    std::vector<StagedArray> inputs;  // the Input arrays (kernels/op_spec.h), in argument order
    Staged<TokenId> ids;              // token ids (embedding op) or targets (cross-entropy)
    std::vector<DeviceArray> device_inputs;  // ... or their device copies
    PoolBlock device_ids;
    std::vector<double> values;  // every size and scalar argument, in order (exact)
    uint64_t null_args = 0;      // bit i: argument i was null (an output not asked for)
    // The call's seed and stream: a candidate replays with the seed the run's call had, on the
    // stream its inputs were written on.
    uint64_t seed = 0;
    void* stream = nullptr;
  };
  // Used by the tap functions: the run's kernels, and whether `op` should be recorded now.
  const KernelSet<T, A>& run_kernels() const { return run_; }
  StagingPool& staging() { return staging_; }
  StagingPool& device_captures() { return device_captures_; }
  bool on_device() const { return device_ != nullptr; }
  bool wants(const std::string& op) const { return armed_ && wanted_.count(op); }
  void store(const std::string& op, Capture c, double seconds) {
    captured_[op].push_back(std::move(c));
    std::lock_guard<std::mutex> lock(mutex_);
    timing_.capture_s += seconds;
  }

 private:
  struct Job;
  void work();  // the worker thread's loop
  // submit()'s work with a DeviceComparison: the candidates, the reference and the sums queued
  // on the tap's stream.
  void evaluate_on_device(Job& job, const TokenId* batch, int64_t n);

  KernelSet<T, A> run_, tapped_;
  // Before every member that holds captures: destroyed after them. `staging_` is the run's
  // fastest host memory (page-locked on CUDA: captures, candidate outputs); `host_arrays_` plain
  // host memory for the fp64 reference's arrays, which never cross to a device.
  StagingPool staging_;
  StagingPool host_arrays_;
  OpContextSource replay_context_;  // the candidates' workspace
  // With a DeviceComparison: device blocks for the recorded inputs (written on the run's
  // stream, read on the tap's; back to the pool when their evaluation has finished) and for
  // the replays' arrays (used on the tap's stream only, so reused in its order at once), and
  // the tap's stream.
  const DeviceComparison* device_;
  StagingPool device_captures_, device_arrays_;
  std::unique_ptr<OwnedStream> stream_;
  const Catalogue<T, A>& variants_;
  std::vector<ShadowSpec> specs_;
  std::map<std::string, int> wanted_;
  std::map<std::string, std::vector<Capture>> captured_;
  bool armed_ = false;
  OpNote* note_ = nullptr;
  void mark_replay(int spec);  // note_->shadow = spec (-1: none)

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<Job>> pending_;  // submitted, not yet finished (front: running)
  std::vector<Result> done_;
  std::exception_ptr failure_;
  bool stopping_ = false;
  Timing timing_;       // capture_s is added by the taps, the rest under mutex_
  std::thread worker_;  // only when the run's memory is not host-accessible
};

}  // namespace divlab
