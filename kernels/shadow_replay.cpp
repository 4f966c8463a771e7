#include "kernels/shadow_replay.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <type_traits>

#include "kernels/common/parallel.h"

namespace divlab::shadow_detail {

namespace {
// Captures run to tens of millions of values per step: filled and converted on every core.
constexpr int64_t kConvertChunk = 1 << 16;

// One input or output array of a replay, in the memory of the kernels that run it: a device
// buffer, or (for host kernels, e.g. the fp64 reference) a block from the staging pool, which
// is reused from step to step instead of being allocated, zeroed and faulted in each time.
template <class V>
struct ReplayArray {
  Buffer<V> device;
  StagedArray host;
  bool on_host;
  V* data() { return on_host ? host.data<V>() : device.data(); }
};

struct ReplayMemory {
  const MemoryOps& mem;
  StagingPool* pool;
  void* stream;  // the recorded call's: its inputs' downloads were queued there
  template <class V>
  using Array = ReplayArray<V>;
  using Ids = Buffer<TokenId>;
  using Values = StagedArray;
  // A zeroed output.
  template <class V>
  ReplayArray<V> out(int64_t n) const {
    if (!mem.host_accessible) return {Buffer<V>(mem, n), StagedArray{}, false};
    StagedArray h = StagedArray::make<V>(n, pool);
    V* p = h.data<V>();
    parallel_chunks(n, kConvertChunk,
                    [&](int64_t i0, int64_t i1) { std::fill(p + i0, p + i1, stored_as<V>(0.0)); });
    return {Buffer<V>(), std::move(h), true};
  }
  // Input `i` of the capture: the recorded values, converted to V.
  template <class V, class Capture>
  ReplayArray<V> in(const Capture& c, size_t i) const {
    const StagedArray& v = c.inputs.at(i);
    const int64_t n = v.size;
    if (mem.host_accessible) {
      StagedArray h = StagedArray::make<V>(n, pool);
      V* p = h.data<V>();
      parallel_chunks(n, kConvertChunk, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) p[i] = stored_as<V>(v.at(i));
      });
      return {Buffer<V>(), std::move(h), true};
    }
    // On a device only candidates replay, in the run's own storage: the capture goes up as it
    // is, queued after its own download (stream order makes the values arrive first). A
    // converting replay would have to read the capture here, before the fence.
    if (v.type != storage_of<V>())
      throw std::logic_error("shadow: a device replay must use the run's storage types");
    Buffer<V> b(mem, n);
    mem.upload_async(stream, b.data(), v.bytes.data(), sizeof(V) * size_t(n));
    return {std::move(b), StagedArray{}, false};
  }
  template <class Capture>
  Buffer<TokenId> ids(const Capture& c) const {
    const Staged<TokenId>& v = c.ids;
    if (mem.host_accessible) return Buffer<TokenId>();  // host kernels read the capture itself
    Buffer<TokenId> b(mem, int64_t(v.size()));
    mem.upload_async(stream, b.data(), v.data(), sizeof(TokenId) * v.size());
    return b;
  }
  template <class Capture>
  static const TokenId* ids_ptr(const Buffer<TokenId>& b, const Capture& c) {
    return b.empty() ? c.ids.data() : b.data();
  }
  // The output's values on the host (moved, when they are there already). From a device the
  // download is queued: the values are there once the evaluation's fence has passed.
  template <class V>
  StagedArray take(ReplayArray<V>& a) const {
    if (a.on_host) return std::move(a.host);
    StagedArray v = StagedArray::make<V>(a.device.size(), pool);
    mem.download_async(stream, v.bytes.data(), a.device.data(),
                       sizeof(V) * size_t(a.device.size()));
    return v;
  }
};

// The same on the device (DeviceComparison): inputs are the capture's device copies, read in
// place, or widened from bf16 where the replaying kernels store fp32 (the fp32 reference of a
// bf16 run); outputs are zeroed blocks of the pool; all of it queued on the tap's stream.
template <class V>
struct DeviceReplayArray {
  DeviceArray owned;  // empty for an input read in place
  V* p = nullptr;
  V* data() { return p; }
};
struct DeviceReplayMemory {
  const MemoryOps& mem;
  StagingPool* pool;
  void* stream;
  const DeviceComparison& dev;
  template <class V>
  using Array = DeviceReplayArray<V>;
  using Ids = int;  // nothing to hold: the capture's copy is read in place
  using Values = DeviceArray;
  template <class V>
  DeviceReplayArray<V> out(int64_t n) const {
    DeviceReplayArray<V> a{DeviceArray::make<V>(n, pool), nullptr};
    a.p = static_cast<V*>(a.owned.block.get());
    mem.zero(stream, a.p, sizeof(V) * size_t(n));
    return a;
  }
  template <class V, class Capture>
  DeviceReplayArray<V> in(const Capture& c, size_t i) const {
    const DeviceArray& v = c.device_inputs.at(i);
    if (v.type == storage_of<V>()) return {DeviceArray{}, static_cast<V*>(v.block.get())};
    if constexpr (std::is_same_v<V, float>) {
      if (v.type == Storage::Bf16) {
        DeviceReplayArray<V> a{DeviceArray::make<float>(v.size, pool), nullptr};
        a.p = static_cast<float*>(a.owned.block.get());
        dev.widen_bf16(stream, a.p, static_cast<const bf16*>(v.block.get()), v.size);
        return a;
      }
    }
    throw std::logic_error("shadow: a device replay reads its inputs as stored or widened to fp32");
  }
  template <class Capture>
  int ids(const Capture&) const {
    return 0;
  }
  template <class Capture>
  static const TokenId* ids_ptr(int, const Capture& c) {
    return static_cast<const TokenId*>(c.device_ids.get());
  }
  template <class V>
  DeviceArray take(DeviceReplayArray<V>& a) const {
    return std::move(a.owned);
  }
};

}  // namespace

namespace {
// One argument of a replayed call: an array in the replaying kernels' memory M, or a value.
template <class M, class V>
struct ReplayArg {  // a size or a scalar: nothing to hold
  template <class Capture>
  void bind(const M&, const Capture&, const ArgSpec&, V&, size_t&, bool) {}
  template <class Out>
  void take(const M&, const ArgSpec&, std::vector<Out>&) {}
};
template <class M, class E>
struct ReplayArg<M, E*> {
  using V = std::remove_const_t<E>;
  typename M::template Array<V> array;
  typename M::Ids ids{};
  bool bound = false;
  template <class Capture>
  void bind(const M& m, const Capture& c, const ArgSpec& spec, E*& p, size_t& input, bool null) {
    if (null) return;  // the run passed null (an output it did not ask for): so does the replay
    if constexpr (std::is_same_v<V, TokenId>) {
      ids = m.ids(c);
      p = M::ids_ptr(ids, c);
    } else {
      array = spec.role == ArgRole::Input ? m.template in<V>(c, input++)
                                          : m.template out<V>(spec.size());
      p = array.data();
      bound = true;
    }
  }
  template <class Out>
  void take(const M& m, const ArgSpec& spec, std::vector<Out>& out) {
    if constexpr (!std::is_same_v<V, TokenId>)
      if (bound && (spec.role == ArgRole::Output || spec.role == ArgRole::Accumulate))
        out.push_back(Out{m.take(array), spec.rows, spec.cols, spec.key});
  }
};

// attention_backward reads what its forward saved in that forward's own format (probabilities
// on the CPU; nothing on the GPU, whose fused backward recomputes them), so the recorded array
// means nothing to another backend's kernels and may come from a candidate forward. Every replay
// makes its own with the replaying kernel set's forward, from the recorded qkv.
template <Op op, class U, class UA, class M, class Args>
void refresh_saved_state(const KernelSet<U, UA>& k, const OpContext& ctx, const M& m, Args& args) {
  if constexpr (op == Op::attention_backward) {
    const auto& [dqkv, dout, qkv, att, B, T, C, NH] = args;
    (void)dqkv, (void)dout;
    auto y = m.template out<UA>(int64_t(B) * T * C);
    k.attention_forward(ctx, y.data(), const_cast<UA*>(att), qkv, B, T, C, NH);
  }
}

// Replays one recorded call of `op` with k's kernel: the call's sizes and scalars from the
// capture, its inputs converted to k's storage, its outputs fresh and zeroed (an accumulating
// op adds into zero, for the reference and the candidate alike).
template <Op op, class Capture, class U, class UA, class M>
std::vector<OutputOf<typename M::Values>> replay_op(const Capture& c, const KernelSet<U, UA>& k,
                                                    const OpContext& ctx, const M& m) {
  const auto& kernel = k.*kernel_member<op, U, UA>();
  using Fn = typename std::decay_t<decltype(kernel)>::Function;
  using Args = typename OpArgs<Fn>::Tuple;
  Args args{};
  size_t value = 0;
  std::apply(
      [&](auto&... a) {
        const auto set = [&](auto& x) {
          using V = std::decay_t<decltype(x)>;
          if constexpr (!std::is_pointer_v<V>) x = static_cast<V>(c.values.at(value++));
        };
        (set(a), ...);
      },
      args);
  const auto spec = OpSpec<op>::args(args);
  return std::apply(
      [&](auto&... a) {
        std::tuple<ReplayArg<M, std::decay_t<decltype(a)>>...> held;
        size_t index = 0, input = 0;
        std::apply(
            [&](auto&... h) {
              ((h.bind(m, c, spec[index], a, input, c.null_args >> index & 1), ++index), ...);
            },
            held);
        refresh_saved_state<op>(k, ctx, m, args);
        kernel(ctx, a...);
        std::vector<OutputOf<typename M::Values>> out;
        index = 0;
        std::apply([&](auto&... h) { ((h.take(m, spec[index], out), ++index), ...); }, held);
        return out;
      },
      args);
}

// Replays the call `c` of the op named `op` in the memory M, on the call's seed and `stream`.
template <class Capture, class U, class UA, class M>
std::vector<OutputOf<typename M::Values>> replay_named(const std::string& op, const Capture& c,
                                                       const KernelSet<U, UA>& k,
                                                       OpContextSource& contexts, void* stream,
                                                       const M& m) {
  OpContext ctx = contexts.next();
  ctx.seed = c.seed;
  ctx.stream = stream;
// Op names are pasted into strings and template arguments only.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_REPLAY_OP(name, Signature) \
  if constexpr (OpSpec<Op::name>::known)  \
    if (op == #name) return replay_op<Op::name>(c, k, ctx, m);
  DIVLAB_OPS(DIVLAB_REPLAY_OP)
#undef DIVLAB_REPLAY_OP
  // NOLINTEND(bugprone-macro-parentheses)
  throw std::logic_error("shadow: no replay for op " + op);
}
}  // namespace

template <class T, class A, class U, class UA>
std::vector<Output> replay(const std::string& op, const typename ShadowTap<T, A>::Capture& c,
                           const KernelSet<U, UA>& k, OpContextSource& contexts,
                           StagingPool* pool) {
  return replay_named(op, c, k, contexts, c.stream, ReplayMemory{*k.memory, pool, c.stream});
}

template <class T, class A, class U, class UA>
std::vector<DeviceOutput> replay_on_device(const std::string& op,
                                           const typename ShadowTap<T, A>::Capture& c,
                                           const KernelSet<U, UA>& k, OpContextSource& contexts,
                                           StagingPool* pool, void* stream,
                                           const DeviceComparison& dev) {
  return replay_named(op, c, k, contexts, stream, DeviceReplayMemory{*k.memory, pool, stream, dev});
}

namespace {
// The sums (ShadowSums) pooled over every output of every recorded call.
using Tally = std::array<double, ShadowSums::Count>;

// Per-row sums in parallel (rows are independent), folded in row order: the metrics do not
// depend on the thread count.
struct RowSums {
  double diff, ref, got, dot;
};

// Per storage type of the candidate's output (the reference's is double), so the inner loop
// reads plain arrays.
template <class V>
void tally_rows(std::vector<RowSums>& rows, const V* got, const double* ref, int64_t cols) {
  parallel_chunks(int64_t(rows.size()), 64, [&](int64_t row0, int64_t row1) {
    for (int64_t row = row0; row < row1; ++row) {
      RowSums s{0, 0, 0, 0};
      for (int64_t c = 0; c < cols; ++c) {
        const double a = to_double(got[row * cols + c]), b = ref[row * cols + c];
        s.diff += (a - b) * (a - b), s.ref += b * b, s.got += a * a, s.dot += a * b;
      }
      rows[row] = s;
    }
  });
}

void tally(Tally& t, const std::vector<Output>& got, const std::vector<Output>& ref,
           const std::vector<int64_t>& id_count, const TokenId* batch) {
  using S = ShadowSums;
  for (size_t o = 0; o < got.size(); ++o) {
    const Output& v = got[o];
    const Output& r = ref[o];
    std::vector<RowSums> rows(static_cast<size_t>(r.rows));
    const double* rv = r.values.data<double>();
    if (v.values.type == Storage::F32)
      tally_rows(rows, v.values.data<float>(), rv, r.cols);
    else if (v.values.type == Storage::F64)
      tally_rows(rows, v.values.data<double>(), rv, r.cols);
    else
      tally_rows(rows, v.values.data<bf16>(), rv, r.cols);
    for (int64_t row = 0; row < r.rows; ++row) {
      const RowSums& s = rows[row];
      t[S::Diff] += s.diff, t[S::Ref] += s.ref, t[S::Got] += s.got, t[S::Dot] += s.dot;
      if (std::isnan(s.diff))
        t[S::NanRows] += 1;
      else if (s.ref > 0 || s.diff > 0)
        t[S::MaxRow] = std::max(t[S::MaxRow], s.ref > 0 ? std::sqrt(s.diff / s.ref) : INFINITY);
      const int b = row_bucket(r.key, row, id_count.data(), batch);
      if (b >= 0) t[S::BucketDiff + b] += s.diff, t[S::BucketRef + b] += s.ref;
    }
  }
}

}  // namespace

ShadowMetrics compare_outputs(const std::vector<std::vector<Output>>& candidate,
                              const std::vector<std::vector<Output>>& reference,
                              const std::vector<int64_t>& id_count, const TokenId* batch) {
  Tally t{};
  for (size_t c = 0; c < candidate.size(); ++c)
    tally(t, candidate[c], reference[c], id_count, batch);
  return metrics_from_sums(t.data());
}

#define DIVLAB_REPLAY(T, A, U, UA)                                                  \
  template std::vector<Output> replay<T, A, U, UA>(                                 \
      const std::string&, const ShadowTap<T, A>::Capture&, const KernelSet<U, UA>&, \
      OpContextSource&, StagingPool*)
DIVLAB_REPLAY(float, float, float, float);
DIVLAB_REPLAY(float, float, double, double);
DIVLAB_REPLAY(double, double, double, double);
DIVLAB_REPLAY(float, bf16, float, bf16);
DIVLAB_REPLAY(float, bf16, double, double);
#undef DIVLAB_REPLAY

#define DIVLAB_REPLAY_ON_DEVICE(T, A, U, UA)                                        \
  template std::vector<DeviceOutput> replay_on_device<T, A, U, UA>(                 \
      const std::string&, const ShadowTap<T, A>::Capture&, const KernelSet<U, UA>&, \
      OpContextSource&, StagingPool*, void*, const DeviceComparison&)
DIVLAB_REPLAY_ON_DEVICE(float, float, float, float);
DIVLAB_REPLAY_ON_DEVICE(float, bf16, float, bf16);
DIVLAB_REPLAY_ON_DEVICE(float, bf16, float, float);
#undef DIVLAB_REPLAY_ON_DEVICE

}  // namespace divlab::shadow_detail

namespace divlab {

ShadowMetrics metrics_from_sums(const double* s) {
  using S = ShadowSums;
  static_assert(S::BucketRef - S::BucketDiff == 7 && S::Count - S::BucketRef == 7);
  ShadowMetrics m;
  m.rel_l2 = std::sqrt(s[S::Diff] / s[S::Ref]);
  // A row whose difference is NaN makes the largest row ratio NaN.
  m.max_row_rel = s[S::NanRows] > 0 ? std::numeric_limits<double>::quiet_NaN() : s[S::MaxRow];
  m.cosine = s[S::Dot] / std::sqrt(s[S::Got] * s[S::Ref]);
  for (size_t b = 0; b < frequency_bucket_labels().size(); ++b)
    m.bucket_rel_l2.push_back(s[S::BucketRef + b] > 0
                                  ? std::sqrt(s[S::BucketDiff + b] / s[S::BucketRef + b])
                                  : std::numeric_limits<double>::quiet_NaN());
  return m;
}

}  // namespace divlab
