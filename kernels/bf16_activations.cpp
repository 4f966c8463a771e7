// The CPU's bf16 mode: the fp32 catalogue with its activations stored in bf16.
//
// Every variant of every op runs its own fp32 kernel on widened copies of its bf16 inputs, and
// its activation outputs are rounded to nearest even bf16 on the way out: exactly what storing
// activations in bf16 does to fp32 arithmetic, which is what the GPU's bf16 mode stores (its
// GEMMs multiply the same bf16 values, accumulating in fp32). Slow (a conversion around every
// op), but it lets a laptop show what bf16 activation storage does and does not do to a run,
// and it runs the bf16 mode's model, shadow captures and NaN attribution where there is no GPU.
//
// Function pointers carry no state, so each catalogue entry gets its own trampoline: slot S of
// an op's table holds the fp32 kernel that trampoline S calls.
#include "kernels/bf16_activations.h"

#include <array>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/common/parallel.h"

namespace divlab {

namespace {
constexpr int kSlots = 32;  // variants per op (built-ins and plug-ins)
constexpr int64_t kChunk = 1 << 14;

using S32 = OpSignatures<float>;

// Widened copy of n bf16 values (nullptr stays nullptr).
std::vector<float> widened(const bf16* p, int64_t n) {
  std::vector<float> v(p ? size_t(n) : 0);
  if (p)
    parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) v[i] = widen(p[i]);
    });
  return v;
}
// An activation output: its current contents widened (a kernel that leaves some of it alone
// leaves the old values, as it would in place), then rounded back by store().
struct Out {
  bf16* p;
  std::vector<float> v;
  Out(bf16* out, int64_t n) : p(out), v(widened(out, n)) {}
  float* data() { return p ? v.data() : nullptr; }
  ~Out() {
    if (p)
      parallel_chunks(int64_t(v.size()), kChunk, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) p[i] = to_bf16(v[i]);
      });
  }
};

template <class Fn>
struct Table {
  std::array<Fn, kSlots> fn{};
};
// One table per op (tagged by the op's KernelSet member, since two ops may share a type).
template <auto Member, class Fn>
Table<Fn>& table() {
  static Table<Fn> t;
  return t;
}
template <int S>
void rmsnorm_forward(bf16* y, float* rstd, const float* x, const float* w, int N, int C,
                     float eps) {
  Out y32(y, int64_t(N) * C);
  table<&KernelSet<float>::rmsnorm_forward, S32::RmsnormForward>().fn[S](y32.data(), rstd, x, w, N,
                                                                         C, eps);
}
template <int S>
void rmsnorm_backward(float* dresid, float* dw, const bf16* dy, const float* x, const float* w,
                      const float* rstd, int N, int C) {
  const auto dy32 = widened(dy, int64_t(N) * C);
  table<&KernelSet<float>::rmsnorm_backward, S32::RmsnormBackward>().fn[S](dresid, dw, dy32.data(),
                                                                           x, w, rstd, N, C);
}
template <int S>
void linear_forward(bf16* y, const bf16* x, const bf16* W, int N, int in, int out) {
  const auto x32 = widened(x, int64_t(N) * in), W32 = widened(W, int64_t(out) * in);
  Out y32(y, int64_t(N) * out);
  table<&KernelSet<float>::linear_forward, S32::LinearForward>().fn[S](y32.data(), x32.data(),
                                                                       W32.data(), N, in, out);
}
template <int S>
void linear_backward(bf16* dx, float* dW, const bf16* dy, const bf16* x, const bf16* W, int N,
                     int in, int out) {
  const auto dy32 = widened(dy, int64_t(N) * out), x32 = widened(x, int64_t(N) * in),
             W32 = widened(W, int64_t(out) * in);
  Out dx32(dx, int64_t(N) * in);
  table<&KernelSet<float>::linear_backward, S32::LinearBackward>().fn[S](
      dx32.data(), dW, dy32.data(), x32.data(), W32.data(), N, in, out);
}
template <int S>
void attention_forward(bf16* out, bf16* att, const bf16* qkv, int B, int T_, int C, int NH) {
  const int64_t N = int64_t(B) * T_;
  const auto qkv32 = widened(qkv, N * 3 * C);
  Out out32(out, N * C), att32(att, int64_t(B) * NH * T_ * T_);
  table<&KernelSet<float>::attention_forward, S32::AttentionForward>().fn[S](
      out32.data(), att32.data(), qkv32.data(), B, T_, C, NH);
}
template <int S>
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att, int B,
                        int T_, int C, int NH) {
  const int64_t N = int64_t(B) * T_;
  const auto dout32 = widened(dout, N * C), qkv32 = widened(qkv, N * 3 * C),
             att32 = widened(att, int64_t(B) * NH * T_ * T_);
  Out dqkv32(dqkv, N * 3 * C);
  table<&KernelSet<float>::attention_backward, S32::AttentionBackward>().fn[S](
      dqkv32.data(), dout32.data(), qkv32.data(), att32.data(), B, T_, C, NH);
}
template <int S>
void gelu_forward(bf16* y, const bf16* x, int64_t n) {
  const auto x32 = widened(x, n);
  Out y32(y, n);
  table<&KernelSet<float>::gelu_forward, S32::GeluForward>().fn[S](y32.data(), x32.data(), n);
}
template <int S>
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n) {
  const auto dy32 = widened(dy, n), x32 = widened(x, n);
  Out dx32(dx, n);
  table<&KernelSet<float>::gelu_backward, S32::GeluBackward>().fn[S](dx32.data(), dy32.data(),
                                                                     x32.data(), n);
}
template <int S>
void add(float* y, const float* a, const bf16* b, int64_t n) {
  const auto b32 = widened(b, n);
  table<&KernelSet<float>::add, S32::Add>().fn[S](y, a, b32.data(), n);
}
template <int S>
void cross_entropy(float* losses, bf16* dlogits, const bf16* logits, const TokenId* targets, int N,
                   int V, float dloss) {
  const auto logits32 = widened(logits, int64_t(N) * V);
  Out dlogits32(dlogits, int64_t(N) * V);
  table<&KernelSet<float>::cross_entropy, S32::CrossEntropy>().fn[S](
      losses, dlogits32.data(), logits32.data(), targets, N, V, dloss);
}
template <int S>
void embed_rmsnorm_backward(float* dwte, float* dwpe, float* dw_norm, const bf16* dy_norm,
                            const float* dresid, const float* x0, const float* w_norm,
                            const float* rstd, const TokenId* tokens, int B, int T_, int C, int V) {
  const auto dy32 = widened(dy_norm, int64_t(B) * T_ * C);
  table<&KernelSet<float>::embed_rmsnorm_backward, S32::EmbedRmsnormBackward>().fn[S](
      dwte, dwpe, dw_norm, dy32.data(), dresid, x0, w_norm, rstd, tokens, B, T_, C, V);
}

void cast(bf16* y, const float* x, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) y[i] = to_bf16(x[i]);
  });
}

// Trampolines 0 .. kSlots-1 of one op.
template <template <int> class Op, int... S>
constexpr auto trampolines(std::integer_sequence<int, S...>) {
  return std::array{Op<S>::fn...};
}
#define DIVLAB_TRAMPOLINE(op)          \
  template <int S>                     \
  struct op##_at {                     \
    static constexpr auto fn = &op<S>; \
  };
DIVLAB_TRAMPOLINE(rmsnorm_forward)
DIVLAB_TRAMPOLINE(rmsnorm_backward)
DIVLAB_TRAMPOLINE(linear_forward)
DIVLAB_TRAMPOLINE(linear_backward)
DIVLAB_TRAMPOLINE(attention_forward)
DIVLAB_TRAMPOLINE(attention_backward)
DIVLAB_TRAMPOLINE(gelu_forward)
DIVLAB_TRAMPOLINE(gelu_backward)
DIVLAB_TRAMPOLINE(add)
DIVLAB_TRAMPOLINE(cross_entropy)
DIVLAB_TRAMPOLINE(embed_rmsnorm_backward)
#undef DIVLAB_TRAMPOLINE

// Every entry of `from` (fp32) into `to` (bf16 activations), through the op's trampolines.
template <auto Member, template <int> class At, class From, class To>
void adapt(const From& from, To& to) {
  static constexpr auto fns = trampolines<At>(std::make_integer_sequence<int, kSlots>());
  auto& t = table<Member, typename From::Function>();
  if (from.entries.size() > size_t(kSlots))
    throw std::logic_error("bf16 activations: more than 32 variants of " + from.op);
  to.what = from.what;
  for (size_t i = 0; i < from.entries.size(); ++i) {
    t.fn[i] = from.entries[i].fn;
    to.add(from.entries[i].name, fns[i], from.entries[i].doc);
  }
  to.partners = from.partners;
}
// Ops without activation arguments: the same functions.
template <class From, class To>
void same(const From& from, To& to) {
  to.what = from.what;
  for (const auto& e : from.entries) to.add(e.name, e.fn, e.doc);
  to.partners = from.partners;
}

Catalogue<float, bf16> build(const Catalogue<float>& f) {
  Catalogue<float, bf16> c;
  c.memory = f.memory;
  same(f.embedding_forward, c.embedding_forward);
  adapt<&KernelSet<float>::rmsnorm_forward, rmsnorm_forward_at>(f.rmsnorm_forward,
                                                                c.rmsnorm_forward);
  adapt<&KernelSet<float>::rmsnorm_backward, rmsnorm_backward_at>(f.rmsnorm_backward,
                                                                  c.rmsnorm_backward);
  adapt<&KernelSet<float>::linear_forward, linear_forward_at>(f.linear_forward, c.linear_forward);
  adapt<&KernelSet<float>::linear_backward, linear_backward_at>(f.linear_backward,
                                                                c.linear_backward);
  adapt<&KernelSet<float>::attention_forward, attention_forward_at>(f.attention_forward,
                                                                    c.attention_forward);
  adapt<&KernelSet<float>::attention_backward, attention_backward_at>(f.attention_backward,
                                                                      c.attention_backward);
  adapt<&KernelSet<float>::gelu_forward, gelu_forward_at>(f.gelu_forward, c.gelu_forward);
  adapt<&KernelSet<float>::gelu_backward, gelu_backward_at>(f.gelu_backward, c.gelu_backward);
  adapt<&KernelSet<float>::add, add_at>(f.add, c.add);
  adapt<&KernelSet<float>::cross_entropy, cross_entropy_at>(f.cross_entropy, c.cross_entropy);
  adapt<&KernelSet<float>::embed_rmsnorm_backward, embed_rmsnorm_backward_at>(
      f.embed_rmsnorm_backward, c.embed_rmsnorm_backward);
  c.cast.what = f.cast.what;
  c.cast.add("reference", cast, {"round to nearest even bf16", "", "", ""});
  same(f.sum_squares, c.sum_squares);
  same(f.sgd_step, c.sgd_step);
  same(f.adamw_step, c.adamw_step);
  return c;
}
}  // namespace

const Catalogue<float, bf16>& cpu_bf16_catalogue() {
  // Built on first use, from the fp32 catalogue as it is then (plug-ins load before any
  // catalogue is asked for: configuration reading does both, in that order).
  static const Catalogue<float, bf16> cat = build(cpu_catalogue<float>());
  return cat;
}

}  // namespace divlab
