#include "kernels/shadow_replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
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
  // An input: the recorded values, converted to V.
  template <class V>
  ReplayArray<V> in(const StagedArray& v) const {
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
    mem.upload_async(b.data(), v.bytes.data(), sizeof(V) * size_t(n));
    return {std::move(b), StagedArray{}, false};
  }
  Buffer<TokenId> ids(const Staged<TokenId>& v) const {
    if (mem.host_accessible) return Buffer<TokenId>();  // host kernels read the capture itself
    Buffer<TokenId> b(mem, int64_t(v.size()));
    mem.upload_async(b.data(), v.data(), sizeof(TokenId) * v.size());
    return b;
  }
  static const TokenId* ids_ptr(const Buffer<TokenId>& b, const Staged<TokenId>& v) {
    return b.empty() ? v.data() : b.data();
  }
  // The output's values on the host (moved, when they are there already). From a device the
  // download is queued: the values are there once the evaluation's fence has passed.
  template <class V>
  StagedArray take(ReplayArray<V>& a) const {
    if (a.on_host) return std::move(a.host);
    StagedArray v = StagedArray::make<V>(a.device.size(), pool);
    mem.download_async(v.bytes.data(), a.device.data(), sizeof(V) * size_t(a.device.size()));
    return v;
  }
};

}  // namespace

template <class T, class A, class U, class UA>
std::vector<Output> replay(const std::string& op, const typename ShadowTap<T, A>::Capture& c,
                           const KernelSet<U, UA>& k, OpContextSource& contexts,
                           StagingPool* pool) {
  OpContext ctx = contexts.next();
  ctx.seed = c.seed;
  ctx.stream = c.stream;
  const auto& in = c.inputs;
  const auto& d = c.dims;
  const ReplayMemory m{*k.memory, pool};
  if (op == "embed_rmsnorm_backward") {
    const int B = d[0], T_ = d[1], C = d[2], V = d[3];
    auto dwte = m.out<U>(int64_t(V) * C), dwpe = m.out<U>(int64_t(T_) * C), dw = m.out<U>(C);
    auto dy = m.in<UA>(in[0]);
    auto dres = m.in<U>(in[1]), x0 = m.in<U>(in[2]), w = m.in<U>(in[3]), rstd = m.in<U>(in[4]);
    auto ids = m.ids(c.ids);
    k.embed_rmsnorm_backward(ctx, dwte.data(), dwpe.data(), dw.data(), dy.data(), dres.data(),
                             x0.data(), w.data(), rstd.data(), ReplayMemory::ids_ptr(ids, c.ids), B,
                             T_, C, V);
    return moved_list<Output>(Output{m.take(dwte), V, C, RowKey::TokenId},
                              Output{m.take(dwpe), T_, C, RowKey::None},
                              Output{m.take(dw), 1, C, RowKey::None});
  }
  if (op == "rmsnorm_forward") {
    const int N = d[0], C = d[1];
    auto x = m.in<U>(in[0]), w = m.in<U>(in[1]);
    auto y = m.out<UA>(int64_t(N) * C);
    auto rstd = m.out<U>(N);
    k.rmsnorm_forward(ctx, y.data(), rstd.data(), x.data(), w.data(), N, C, U(c.scalar));
    return moved_list<Output>(Output{m.take(y), N, C, RowKey::Position});
  }
  if (op == "rmsnorm_backward") {
    const int N = d[0], C = d[1];
    auto dy = m.in<UA>(in[0]);
    auto x = m.in<U>(in[1]), w = m.in<U>(in[2]), rstd = m.in<U>(in[3]);
    auto dx = m.out<U>(int64_t(N) * C), dw = m.out<U>(C);
    k.rmsnorm_backward(ctx, dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    return moved_list<Output>(Output{m.take(dx), N, C, RowKey::Position},
                              Output{m.take(dw), 1, C, RowKey::None});
  }
  if (op == "linear_forward") {
    const int N = d[0], i = d[1], o = d[2];
    auto x = m.in<UA>(in[0]), W = m.in<UA>(in[1]);
    auto y = m.out<UA>(int64_t(N) * o);
    k.linear_forward(ctx, y.data(), x.data(), W.data(), N, i, o);
    return moved_list<Output>(Output{m.take(y), N, o, RowKey::Position});
  }
  if (op == "attention_forward") {
    const int B = d[0], T_ = d[1], C = d[2], NH = d[3];
    auto qkv = m.in<UA>(in[0]);
    auto out = m.out<UA>(int64_t(B) * T_ * C), att = m.out<UA>(int64_t(B) * NH * T_ * T_);
    k.attention_forward(ctx, out.data(), att.data(), qkv.data(), B, T_, C, NH);
    return moved_list<Output>(Output{m.take(out), int64_t(B) * T_, C, RowKey::Position});
  }
  if (op == "cross_entropy") {
    const int N = d[0], V = d[1];
    auto logits = m.in<UA>(in[0]);
    auto losses = m.out<U>(N);
    auto dlogits = m.out<UA>(int64_t(N) * V);
    auto targets = m.ids(c.ids);
    k.cross_entropy(ctx, losses.data(), dlogits.data(), logits.data(),
                    ReplayMemory::ids_ptr(targets, c.ids), N, V, U(c.scalar));
    return moved_list<Output>(Output{m.take(losses), N, 1, RowKey::Position},
                              Output{m.take(dlogits), N, V, RowKey::Position});
  }
  throw std::logic_error("shadow: no replay for op " + op);
}

namespace {
// Sums of squares pooled over every output of every recorded call.
struct Tally {
  std::vector<double> bucket_diff = std::vector<double>(frequency_bucket_labels().size(), 0.0);
  std::vector<double> bucket_ref = bucket_diff;
  double diff = 0, norm_r = 0, norm_v = 0, dot = 0, max_row = 0;

  ShadowMetrics metrics() const {
    ShadowMetrics m;
    m.rel_l2 = std::sqrt(diff / norm_r);
    m.max_row_rel = max_row;
    m.cosine = dot / std::sqrt(norm_v * norm_r);
    for (size_t b = 0; b < bucket_ref.size(); ++b)
      m.bucket_rel_l2.push_back(bucket_ref[b] > 0 ? std::sqrt(bucket_diff[b] / bucket_ref[b])
                                                  : std::numeric_limits<double>::quiet_NaN());
    return m;
  }
};

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
      t.diff += s.diff, t.norm_r += s.ref, t.norm_v += s.got, t.dot += s.dot;
      if (s.ref > 0 || s.diff > 0)
        t.max_row = std::max(t.max_row, s.ref > 0 ? std::sqrt(s.diff / s.ref) : INFINITY);
      if (std::isnan(s.diff)) t.max_row = NAN;
      const int64_t count = r.key == RowKey::TokenId    ? id_count[row]
                            : r.key == RowKey::Position ? id_count[batch[row]]
                                                        : 0;
      const int b = frequency_bucket(count);
      if (b >= 0) t.bucket_diff[b] += s.diff, t.bucket_ref[b] += s.ref;
    }
  }
}

}  // namespace

ShadowMetrics compare_outputs(const std::vector<std::vector<Output>>& candidate,
                              const std::vector<std::vector<Output>>& reference,
                              const std::vector<int64_t>& id_count, const TokenId* batch) {
  Tally t;
  for (size_t c = 0; c < candidate.size(); ++c)
    tally(t, candidate[c], reference[c], id_count, batch);
  return t.metrics();
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

}  // namespace divlab::shadow_detail
