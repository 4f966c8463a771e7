#include "kernels/shadow.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/common/parallel.h"

namespace divlab {

namespace {

// The tap currently installed (one per precision; the trainer owns at most one).
template <class T>
ShadowTap<T>* g_tap = nullptr;

// Element-wise conversion on every core (captures run to tens of millions of values per step).
constexpr int64_t kConvertChunk = 1 << 16;
template <class To, class From>
std::vector<To> convert(const From* p, int64_t n) {
  std::vector<To> out(static_cast<size_t>(n));
  parallel_chunks(n, kConvertChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = To(p[i]);
  });
  return out;
}

// Copies n values the run's kernels just read (host or device memory) to host doubles.
template <class T>
std::vector<double> copy(const T* p, int64_t n) {
  const MemoryOps& mem = *g_tap<T>->run_kernels().memory;
  if (mem.host_accessible) return convert<double>(p, n);
  std::vector<T> host(static_cast<size_t>(n));
  mem.download(host.data(), p, sizeof(T) * size_t(n));
  return convert<double>(host.data(), n);
}
template <class T>
std::vector<TokenId> copy_ids(const TokenId* p, int64_t n) {
  std::vector<TokenId> ids(static_cast<size_t>(n));
  g_tap<T>->run_kernels().memory->download(ids.data(), p, sizeof(TokenId) * size_t(n));
  return ids;
}

// --- Taps: call the run's own kernel, then record its inputs if asked. ----------------------
template <class T>
void tap_embed_rmsnorm_backward(T* dwte, T* dwpe, T* dw_norm, const T* dy_norm, const T* dresid,
                                const T* x0, const T* w_norm, const T* rstd, const TokenId* tokens,
                                int B, int T_, int C, int V) {
  ShadowTap<T>& t = *g_tap<T>;
  t.run_kernels().embed_rmsnorm_backward(dwte, dwpe, dw_norm, dy_norm, dresid, x0, w_norm, rstd,
                                         tokens, B, T_, C, V);
  if (!t.wants("embed_rmsnorm_backward")) return;
  const int64_t N = int64_t(B) * T_;
  t.store("embed_rmsnorm_backward", {{copy(dy_norm, N * C), copy(dresid, N * C), copy(x0, N * C),
                                      copy(w_norm, C), copy(rstd, N)},
                                     copy_ids<T>(tokens, N),
                                     {B, T_, C, V},
                                     0.0});
}

template <class T>
void tap_rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int N, int C, T eps) {
  ShadowTap<T>& t = *g_tap<T>;
  t.run_kernels().rmsnorm_forward(y, rstd, x, w, N, C, eps);
  if (t.wants("rmsnorm_forward"))
    t.store("rmsnorm_forward", {{copy(x, int64_t(N) * C), copy(w, C)}, {}, {N, C}, double(eps)});
}

template <class T>
void tap_rmsnorm_backward(T* dresid, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                          int N, int C) {
  ShadowTap<T>& t = *g_tap<T>;
  // Record before the call: the run's kernel adds into dresid, which is not an input here.
  const bool want = t.wants("rmsnorm_backward");
  if (want)
    t.store("rmsnorm_backward",
            {{copy(dy, int64_t(N) * C), copy(x, int64_t(N) * C), copy(w, C), copy(rstd, N)},
             {},
             {N, C},
             0.0});
  t.run_kernels().rmsnorm_backward(dresid, dw, dy, x, w, rstd, N, C);
}

template <class T>
void tap_linear_forward(T* y, const T* x, const T* W, int N, int in, int out) {
  ShadowTap<T>& t = *g_tap<T>;
  t.run_kernels().linear_forward(y, x, W, N, in, out);
  if (t.wants("linear_forward"))
    t.store("linear_forward",
            {{copy(x, int64_t(N) * in), copy(W, int64_t(out) * in)}, {}, {N, in, out}, 0.0});
}

template <class T>
void tap_attention_forward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH) {
  ShadowTap<T>& t = *g_tap<T>;
  t.run_kernels().attention_forward(out, att, qkv, B, T_, C, NH);
  if (t.wants("attention_forward"))
    t.store("attention_forward", {{copy(qkv, int64_t(B) * T_ * 3 * C)}, {}, {B, T_, C, NH}, 0.0});
}

template <class T>
void tap_cross_entropy(T* losses, T* dlogits, const T* logits, const TokenId* targets, int N, int V,
                       T dloss) {
  ShadowTap<T>& t = *g_tap<T>;
  t.run_kernels().cross_entropy(losses, dlogits, logits, targets, N, V, dloss);
  if (t.wants("cross_entropy"))
    t.store("cross_entropy",
            {{copy(logits, int64_t(N) * V)}, copy_ids<T>(targets, N), {N, V}, double(dloss)});
}

// --- Replaying a capture with some kernel set, in precision U. ------------------------------
enum class RowKey { Position, TokenId, None };
struct Output {
  std::vector<double> values;
  int64_t rows, cols;
  RowKey key;
};

// Inputs and outputs of one replay, in the memory of the kernels that run it.
template <class U>
struct ReplayMemory {
  const MemoryOps& mem;
  Buffer<U> in(const std::vector<double>& v) const {
    Buffer<U> b(mem, int64_t(v.size()));
    const std::vector<U> u = convert<U>(v.data(), int64_t(v.size()));
    b.upload(u.data(), int64_t(u.size()));
    return b;
  }
  Buffer<TokenId> ids(const std::vector<TokenId>& v) const {
    Buffer<TokenId> b(mem, int64_t(v.size()));
    b.upload(v.data(), int64_t(v.size()));
    return b;
  }
  Buffer<U> out(int64_t n) const { return Buffer<U>(mem, n); }
};
template <class U>
std::vector<double> widen(const Buffer<U>& b) {
  const std::vector<U> v = b.to_vector();
  return convert<double>(v.data(), int64_t(v.size()));
}

template <class T, class U>
std::vector<Output> replay(const std::string& op, const typename ShadowTap<T>::Capture& c,
                           const KernelSet<U>& k) {
  const auto& in = c.inputs;
  const auto& d = c.dims;
  const ReplayMemory<U> m{*k.memory};
  if (op == "embed_rmsnorm_backward") {
    const int B = d[0], T_ = d[1], C = d[2], V = d[3];
    auto dwte = m.out(int64_t(V) * C), dwpe = m.out(int64_t(T_) * C), dw = m.out(C);
    auto dy = m.in(in[0]), dres = m.in(in[1]), x0 = m.in(in[2]), w = m.in(in[3]),
         rstd = m.in(in[4]);
    auto ids = m.ids(c.ids);
    k.embed_rmsnorm_backward(dwte.data(), dwpe.data(), dw.data(), dy.data(), dres.data(), x0.data(),
                             w.data(), rstd.data(), ids.data(), B, T_, C, V);
    return {{widen(dwte), V, C, RowKey::TokenId},
            {widen(dwpe), T_, C, RowKey::None},
            {widen(dw), 1, C, RowKey::None}};
  }
  if (op == "rmsnorm_forward") {
    const int N = d[0], C = d[1];
    auto x = m.in(in[0]), w = m.in(in[1]);
    auto y = m.out(int64_t(N) * C), rstd = m.out(N);
    k.rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, U(c.scalar));
    return {{widen(y), N, C, RowKey::Position}};
  }
  if (op == "rmsnorm_backward") {
    const int N = d[0], C = d[1];
    auto dy = m.in(in[0]), x = m.in(in[1]), w = m.in(in[2]), rstd = m.in(in[3]);
    auto dx = m.out(int64_t(N) * C), dw = m.out(C);
    k.rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    return {{widen(dx), N, C, RowKey::Position}, {widen(dw), 1, C, RowKey::None}};
  }
  if (op == "linear_forward") {
    const int N = d[0], i = d[1], o = d[2];
    auto x = m.in(in[0]), W = m.in(in[1]);
    auto y = m.out(int64_t(N) * o);
    k.linear_forward(y.data(), x.data(), W.data(), N, i, o);
    return {{widen(y), N, o, RowKey::Position}};
  }
  if (op == "attention_forward") {
    const int B = d[0], T_ = d[1], C = d[2], NH = d[3];
    auto qkv = m.in(in[0]);
    auto out = m.out(int64_t(B) * T_ * C), att = m.out(int64_t(B) * NH * T_ * T_);
    k.attention_forward(out.data(), att.data(), qkv.data(), B, T_, C, NH);
    return {{widen(out), int64_t(B) * T_, C, RowKey::Position}};
  }
  if (op == "cross_entropy") {
    const int N = d[0], V = d[1];
    auto logits = m.in(in[0]);
    auto losses = m.out(N), dlogits = m.out(int64_t(N) * V);
    auto targets = m.ids(c.ids);
    k.cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V,
                    U(c.scalar));
    return {{widen(losses), N, 1, RowKey::Position}, {widen(dlogits), N, V, RowKey::Position}};
  }
  throw std::logic_error("shadow: no replay for op " + op);
}

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
void tally(Tally& t, const std::vector<Output>& got, const std::vector<Output>& ref,
           const std::vector<int64_t>& id_count, const TokenId* batch) {
  struct RowSums {
    double diff, ref, got, dot;
  };
  for (size_t o = 0; o < got.size(); ++o) {
    const Output &v = got[o], &r = ref[o];
    std::vector<RowSums> rows(static_cast<size_t>(r.rows));
    parallel_chunks(r.rows, 64, [&](int64_t row0, int64_t row1) {
      for (int64_t row = row0; row < row1; ++row) {
        RowSums s{0, 0, 0, 0};
        for (int64_t c = 0; c < r.cols; ++c) {
          const double a = v.values[row * r.cols + c], b = r.values[row * r.cols + c];
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

std::vector<std::string> shadowable_ops() {
  return {"embed_rmsnorm_backward", "rmsnorm_forward",   "rmsnorm_backward",
          "linear_forward",         "attention_forward", "cross_entropy"};
}

std::vector<ShadowSpec> parse_shadow_specs(const std::vector<std::string>& entries,
                                           const Catalogue<float>& catalogue) {
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

template <class T>
ShadowTap<T>::ShadowTap(const KernelSet<T>& run_kernels, const std::vector<ShadowSpec>& specs,
                        const Catalogue<T>& variants)
    : run_(run_kernels), tapped_(run_kernels), variants_(variants), specs_(specs) {
  if (g_tap<T>) throw std::logic_error("shadow: only one tap may be active");
  g_tap<T> = this;
  for (const auto& s : specs) {
    ++wanted_[s.op];
    if (s.op == "embed_rmsnorm_backward")
      tapped_.embed_rmsnorm_backward = tap_embed_rmsnorm_backward<T>;
    if (s.op == "rmsnorm_forward") tapped_.rmsnorm_forward = tap_rmsnorm_forward<T>;
    if (s.op == "rmsnorm_backward") tapped_.rmsnorm_backward = tap_rmsnorm_backward<T>;
    if (s.op == "linear_forward") tapped_.linear_forward = tap_linear_forward<T>;
    if (s.op == "attention_forward") tapped_.attention_forward = tap_attention_forward<T>;
    if (s.op == "cross_entropy") tapped_.cross_entropy = tap_cross_entropy<T>;
  }
}

template <class T>
ShadowTap<T>::~ShadowTap() {
  g_tap<T> = nullptr;
}

template <class T>
void ShadowTap<T>::arm() {
  captured_.clear();
  armed_ = true;
}

template <class T>
std::vector<ShadowMetrics> ShadowTap<T>::evaluate(const TokenId* batch, int64_t n, int vocab) {
  armed_ = false;
  std::vector<int64_t> id_count(vocab, 0);
  for (int64_t i = 0; i < n; ++i) ++id_count[batch[i]];
  const KernelSet<double> reference = cpu_catalogue<double>().select({});
  // One fp64 replay per recorded call, shared by every variant of that op.
  std::map<std::string, std::vector<std::vector<Output>>> ref_outputs;
  std::vector<ShadowMetrics> out;
  for (const auto& s : specs_) {
    const auto it = captured_.find(s.op);
    if (it == captured_.end())
      throw std::logic_error("shadow: op " + s.op + " was not called during the step");
    auto& refs = ref_outputs[s.op];
    if (refs.empty())
      for (const auto& call : it->second) refs.push_back(replay<T, double>(s.op, call, reference));
    const KernelSet<T> variant = variants_.select({{s.op, s.variant}});
    Tally t;
    for (size_t c = 0; c < it->second.size(); ++c)
      tally(t, replay<T, T>(s.op, it->second[c], variant), refs[c], id_count, batch);
    out.push_back(t.metrics());
  }
  captured_.clear();
  return out;
}

template class ShadowTap<float>;
template class ShadowTap<double>;
}  // namespace divlab
