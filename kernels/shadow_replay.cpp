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
template <class U>
struct ReplayArray {
  Buffer<U> device;
  Staged<U> host;
  bool on_host;
  U* data() { return on_host ? host.data() : device.data(); }
};

template <class U>
struct ReplayMemory {
  const MemoryOps& mem;
  StagingPool* pool;
  Staged<U> staged(int64_t n) const {
    return Staged<U>(static_cast<size_t>(n), StagingAllocator<U>(pool));
  }
  // A zeroed output.
  ReplayArray<U> out(int64_t n) const {
    if (!mem.host_accessible)
      return {Buffer<U>(mem, n), Staged<U>(StagingAllocator<U>(pool)), false};
    Staged<U> h = staged(n);
    U* p = h.data();
    parallel_chunks(n, kConvertChunk,
                    [&](int64_t i0, int64_t i1) { std::fill(p + i0, p + i1, U(0)); });
    return {Buffer<U>(), std::move(h), true};
  }
  // An input: the recorded values, converted to U.
  template <class Vec>
  ReplayArray<U> in(const Vec& v) const {
    using T = typename Vec::value_type;
    const int64_t n = int64_t(v.size());
    if (mem.host_accessible) {
      Staged<U> h = staged(n);
      U* p = h.data();
      parallel_chunks(n, kConvertChunk, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) p[i] = U(v[i]);
      });
      return {Buffer<U>(), std::move(h), true};
    }
    // On a device only candidates replay, in the run's own precision: the capture goes up as it
    // is, queued after its own download (stream order makes the values arrive first). A
    // converting replay would have to read the capture here, before the fence.
    if constexpr (!std::is_same_v<T, U>)
      throw std::logic_error("shadow: a device replay must use the run's precision");
    Buffer<U> b(mem, n);
    mem.upload_async(b.data(), v.data(), sizeof(U) * size_t(n));
    return {std::move(b), Staged<U>(StagingAllocator<U>(pool)), false};
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
  Staged<U> take(ReplayArray<U>& a) const {
    if (a.on_host) return std::move(a.host);
    Staged<U> v = staged(a.device.size());
    mem.download_async(v.data(), a.device.data(), sizeof(U) * size_t(a.device.size()));
    return v;
  }
};

}  // namespace

template <class T, class U>
std::vector<Output<U>> replay(const std::string& op, const typename ShadowTap<T>::Capture& c,
                              const KernelSet<U>& k, StagingPool* pool) {
  const auto& in = c.inputs;
  const auto& d = c.dims;
  const ReplayMemory<U> m{*k.memory, pool};
  if (op == "embed_rmsnorm_backward") {
    const int B = d[0], T_ = d[1], C = d[2], V = d[3];
    auto dwte = m.out(int64_t(V) * C), dwpe = m.out(int64_t(T_) * C), dw = m.out(C);
    auto dy = m.in(in[0]), dres = m.in(in[1]), x0 = m.in(in[2]), w = m.in(in[3]),
         rstd = m.in(in[4]);
    auto ids = m.ids(c.ids);
    k.embed_rmsnorm_backward(dwte.data(), dwpe.data(), dw.data(), dy.data(), dres.data(), x0.data(),
                             w.data(), rstd.data(), ReplayMemory<U>::ids_ptr(ids, c.ids), B, T_, C,
                             V);
    return moved_list<Output<U>>(Output<U>{m.take(dwte), V, C, RowKey::TokenId},
                                 Output<U>{m.take(dwpe), T_, C, RowKey::None},
                                 Output<U>{m.take(dw), 1, C, RowKey::None});
  }
  if (op == "rmsnorm_forward") {
    const int N = d[0], C = d[1];
    auto x = m.in(in[0]), w = m.in(in[1]);
    auto y = m.out(int64_t(N) * C), rstd = m.out(N);
    k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, U(c.scalar));
    return moved_list<Output<U>>(Output<U>{m.take(y), N, C, RowKey::Position});
  }
  if (op == "rmsnorm_backward") {
    const int N = d[0], C = d[1];
    auto dy = m.in(in[0]), x = m.in(in[1]), w = m.in(in[2]), rstd = m.in(in[3]);
    auto dx = m.out(int64_t(N) * C), dw = m.out(C);
    k.rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    return moved_list<Output<U>>(Output<U>{m.take(dx), N, C, RowKey::Position},
                                 Output<U>{m.take(dw), 1, C, RowKey::None});
  }
  if (op == "linear_forward") {
    const int N = d[0], i = d[1], o = d[2];
    auto x = m.in(in[0]), W = m.in(in[1]);
    auto y = m.out(int64_t(N) * o);
    k.linear_forward(y.data(), x.data(), W.data(), N, i, o);
    return moved_list<Output<U>>(Output<U>{m.take(y), N, o, RowKey::Position});
  }
  if (op == "attention_forward") {
    const int B = d[0], T_ = d[1], C = d[2], NH = d[3];
    auto qkv = m.in(in[0]);
    auto out = m.out(int64_t(B) * T_ * C), att = m.out(int64_t(B) * NH * T_ * T_);
    k.attention_forward(out.data(), att.data(), qkv.data(), B, T_, C, NH);
    return moved_list<Output<U>>(Output<U>{m.take(out), int64_t(B) * T_, C, RowKey::Position});
  }
  if (op == "cross_entropy") {
    const int N = d[0], V = d[1];
    auto logits = m.in(in[0]);
    auto losses = m.out(N), dlogits = m.out(int64_t(N) * V);
    auto targets = m.ids(c.ids);
    k.cross_entropy(losses.data(), dlogits.data(), logits.data(),
                    ReplayMemory<U>::ids_ptr(targets, c.ids), N, V, U(c.scalar));
    return moved_list<Output<U>>(Output<U>{m.take(losses), N, 1, RowKey::Position},
                                 Output<U>{m.take(dlogits), N, V, RowKey::Position});
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
template <class U>
void tally(Tally& t, const std::vector<Output<U>>& got, const std::vector<Output<double>>& ref,
           const std::vector<int64_t>& id_count, const TokenId* batch) {
  struct RowSums {
    double diff, ref, got, dot;
  };
  for (size_t o = 0; o < got.size(); ++o) {
    const Output<U>& v = got[o];
    const Output<double>& r = ref[o];
    std::vector<RowSums> rows(static_cast<size_t>(r.rows));
    parallel_chunks(r.rows, 64, [&](int64_t row0, int64_t row1) {
      for (int64_t row = row0; row < row1; ++row) {
        RowSums s{0, 0, 0, 0};
        for (int64_t c = 0; c < r.cols; ++c) {
          const double a = double(v.values[row * r.cols + c]), b = r.values[row * r.cols + c];
          s.diff += (a - b) * (a - b), s.ref += b * b, s.got += a * a, s.dot += a * b;
        }
        rows[row] = s;
      }
    });
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

template <class U>
ShadowMetrics compare_outputs(const std::vector<std::vector<Output<U>>>& candidate,
                              const std::vector<std::vector<Output<double>>>& reference,
                              const std::vector<int64_t>& id_count, const TokenId* batch) {
  Tally t;
  for (size_t c = 0; c < candidate.size(); ++c)
    tally(t, candidate[c], reference[c], id_count, batch);
  return t.metrics();
}

template std::vector<Output<float>> replay<float, float>(const std::string&,
                                                         const ShadowTap<float>::Capture&,
                                                         const KernelSet<float>&, StagingPool*);
template std::vector<Output<double>> replay<float, double>(const std::string&,
                                                           const ShadowTap<float>::Capture&,
                                                           const KernelSet<double>&, StagingPool*);
template std::vector<Output<double>> replay<double, double>(const std::string&,
                                                            const ShadowTap<double>::Capture&,
                                                            const KernelSet<double>&, StagingPool*);
template ShadowMetrics compare_outputs(const std::vector<std::vector<Output<float>>>&,
                                       const std::vector<std::vector<Output<double>>>&,
                                       const std::vector<int64_t>&, const TokenId*);
template ShadowMetrics compare_outputs(const std::vector<std::vector<Output<double>>>&,
                                       const std::vector<std::vector<Output<double>>>&,
                                       const std::vector<int64_t>&, const TokenId*);

}  // namespace divlab::shadow_detail
