// The CPU's bf16 mode: the fp32 catalogue with its activations stored in bf16.
//
// Every variant of every op runs its own fp32 kernel on widened copies of its bf16 inputs, and
// its activation outputs are rounded to nearest even bf16 on the way out: exactly what storing
// activations in bf16 does to fp32 arithmetic, which is what the GPU's bf16 mode stores (its
// GEMMs multiply the same bf16 values, accumulating in fp32). Slow (a conversion around every
// op), but it lets a laptop show what bf16 activation storage does and does not do to a run,
// and it runs the bf16 mode's model, shadow captures and NaN attribution where there is no GPU.
//
// Function pointers carry no state, so each adapted entry gets its own trampoline: slot S of an
// op's table holds the fp32 kernel that trampoline S calls. The same adapters bring the fp32
// plug-in ABI's variants into both bf16 modes (CPU and GPU: two sets of trampolines, each with
// its backend's conversions).
#include "kernels/bf16_activations.h"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/parallel.h"

namespace divlab {

namespace {
constexpr int kSlots = 32;  // adapted variants per op and set (built-ins and plug-ins)
constexpr int kSets = 2;    // Bf16Set::Cpu, Bf16Set::Cuda
constexpr int64_t kChunk = 1 << 14;

using S32 = OpSignatures<float>;

Bf16Conversions& conversions(int set) {
  static Bf16Conversions c[kSets];
  return c[set];
}

// Widened fp32 copy of n bf16 values in the set's memory (empty for a null pointer).
Buffer<float> widened(int set, const bf16* p, int64_t n) {
  const Bf16Conversions& c = conversions(set);
  if (!p) return Buffer<float>();
  Buffer<float> b(*c.memory, n);
  c.widen(b.data(), p, n);
  return b;
}
// An activation output: its current contents widened (a kernel that leaves some of it alone
// leaves the old values, as it would in place), rounded back when the call is done.
struct Out {
  int set;
  bf16* p;
  int64_t n;
  Buffer<float> v;
  Out(int s, bf16* out, int64_t count) : set(s), p(out), n(count), v(widened(s, out, count)) {}
  float* data() { return p ? v.data() : nullptr; }
  ~Out() {
    if (p) conversions(set).round(p, v.data(), n);
  }
};

// Slot S of set X of an op's table: the fp32 kernel that trampoline (X, S) calls.
template <class Fn>
struct Table {
  std::array<Fn, kSlots> fn{};
};
template <int X, auto Member, class Fn>
Table<Fn>& table() {
  static Table<Fn> t;
  return t;
}
#define DIVLAB_INNER(op, Fn) table<X, &KernelSet<float>::op, S32::Fn>().fn[S]

template <int X, int S>
void rmsnorm_forward(bf16* y, float* rstd, const float* x, const float* w, int N, int C,
                     float eps) {
  Out y32(X, y, int64_t(N) * C);
  DIVLAB_INNER(rmsnorm_forward, RmsnormForward)(y32.data(), rstd, x, w, N, C, eps);
}
template <int X, int S>
void rmsnorm_backward(float* dresid, float* dw, const bf16* dy, const float* x, const float* w,
                      const float* rstd, int N, int C) {
  const auto dy32 = widened(X, dy, int64_t(N) * C);
  DIVLAB_INNER(rmsnorm_backward, RmsnormBackward)(dresid, dw, dy32.data(), x, w, rstd, N, C);
}
template <int X, int S>
void linear_forward(bf16* y, const bf16* x, const bf16* W, int N, int in, int out) {
  const auto x32 = widened(X, x, int64_t(N) * in), W32 = widened(X, W, int64_t(out) * in);
  Out y32(X, y, int64_t(N) * out);
  DIVLAB_INNER(linear_forward, LinearForward)(y32.data(), x32.data(), W32.data(), N, in, out);
}
template <int X, int S>
void linear_backward(bf16* dx, float* dW, const bf16* dy, const bf16* x, const bf16* W, int N,
                     int in, int out) {
  const auto dy32 = widened(X, dy, int64_t(N) * out), x32 = widened(X, x, int64_t(N) * in),
             W32 = widened(X, W, int64_t(out) * in);
  Out dx32(X, dx, int64_t(N) * in);
  DIVLAB_INNER(linear_backward, LinearBackward)
  (dx32.data(), dW, dy32.data(), x32.data(), W32.data(), N, in, out);
}
template <int X, int S>
void attention_forward(bf16* out, bf16* att, const bf16* qkv, int B, int T_, int C, int NH) {
  const int64_t N = int64_t(B) * T_;
  const auto qkv32 = widened(X, qkv, N * 3 * C);
  Out out32(X, out, N * C), att32(X, att, int64_t(B) * NH * T_ * T_);
  DIVLAB_INNER(attention_forward, AttentionForward)
  (out32.data(), att32.data(), qkv32.data(), B, T_, C, NH);
}
template <int X, int S>
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* att, int B,
                        int T_, int C, int NH) {
  const int64_t N = int64_t(B) * T_;
  const auto dout32 = widened(X, dout, N * C), qkv32 = widened(X, qkv, N * 3 * C),
             att32 = widened(X, att, int64_t(B) * NH * T_ * T_);
  Out dqkv32(X, dqkv, N * 3 * C);
  DIVLAB_INNER(attention_backward, AttentionBackward)
  (dqkv32.data(), dout32.data(), qkv32.data(), att32.data(), B, T_, C, NH);
}
template <int X, int S>
void gelu_forward(bf16* y, const bf16* x, int64_t n) {
  const auto x32 = widened(X, x, n);
  Out y32(X, y, n);
  DIVLAB_INNER(gelu_forward, GeluForward)(y32.data(), x32.data(), n);
}
template <int X, int S>
void gelu_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t n) {
  const auto dy32 = widened(X, dy, n), x32 = widened(X, x, n);
  Out dx32(X, dx, n);
  DIVLAB_INNER(gelu_backward, GeluBackward)(dx32.data(), dy32.data(), x32.data(), n);
}
template <int X, int S>
void add(float* y, const float* a, const bf16* b, int64_t n) {
  const auto b32 = widened(X, b, n);
  DIVLAB_INNER(add, Add)(y, a, b32.data(), n);
}
template <int X, int S>
void cross_entropy(float* losses, bf16* dlogits, const bf16* logits, const TokenId* targets, int N,
                   int V, float dloss) {
  const auto logits32 = widened(X, logits, int64_t(N) * V);
  Out dlogits32(X, dlogits, int64_t(N) * V);
  DIVLAB_INNER(cross_entropy, CrossEntropy)
  (losses, dlogits32.data(), logits32.data(), targets, N, V, dloss);
}
template <int X, int S>
void embed_rmsnorm_backward(float* dwte, float* dwpe, float* dw_norm, const bf16* dy_norm,
                            const float* dresid, const float* x0, const float* w_norm,
                            const float* rstd, const TokenId* tokens, int B, int T_, int C, int V) {
  const auto dy32 = widened(X, dy_norm, int64_t(B) * T_ * C);
  DIVLAB_INNER(embed_rmsnorm_backward, EmbedRmsnormBackward)
  (dwte, dwpe, dw_norm, dy32.data(), dresid, x0, w_norm, rstd, tokens, B, T_, C, V);
}
#undef DIVLAB_INNER

// Trampolines (X, 0 .. kSlots-1) of one op.
template <template <int, int> class Op, int X, int... S>
constexpr auto trampolines(std::integer_sequence<int, S...>) {
  return std::array{Op<X, S>::fn...};
}
// `op` is pasted into names, never an expression: no parentheses.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_TRAMPOLINE(op)             \
  template <int X, int S>                 \
  struct op##_at {                        \
    static constexpr auto fn = &op<X, S>; \
  };
// NOLINTEND(bugprone-macro-parentheses)
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

// Adds `e` (fp32) to `to` through a free trampoline of set X, or frees the slot of `name`.
template <int X, auto Member, template <int, int> class At, class Entry, class To>
void adapt(const Entry* e, To& to, const std::string& name) {
  static constexpr auto fns = trampolines<At, X>(std::make_integer_sequence<int, kSlots>());
  using Fn32 = std::remove_reference_t<decltype(std::declval<KernelSet<float>>().*Member)>;
  auto& t = table<X, Member, Fn32>();
  if (e && to.find(e->name)) return;  // adopted already
  if (!e) {                           // drop
    if (const auto* mine = to.find(name))
      for (int s = 0; s < kSlots; ++s)
        if (fns[s] == mine->fn) t.fn[s] = nullptr;
    to.remove(name);
    return;
  }
  for (int s = 0; s < kSlots; ++s)
    if (!t.fn[s]) {
      t.fn[s] = e->fn;
      to.add(e->name, fns[s], e->doc);
      return;
    }
  throw std::logic_error("bf16 mode adapts at most " + std::to_string(kSlots) + " variants of " +
                         to.op + " (all taken)");
}

// Ops with activation arguments go through trampolines; the others take the function as is.
template <int X>
void adopt_or_drop(Catalogue<float, bf16>& to, const Catalogue<float>& from, const std::string& op,
                   const std::string& name, bool adopt) {
  bool known = false;
#define DIVLAB_ADAPT(o)                                                                      \
  if (op == #o) {                                                                            \
    known = true;                                                                            \
    adapt<X, &KernelSet<float>::o, o##_at>(adopt ? from.o.find(name) : nullptr, to.o, name); \
    if (adopt && !from.o.find(name))                                                         \
      throw std::logic_error("bf16 activations: no variant " + name + " of " + op);          \
  }
  DIVLAB_ADAPT(rmsnorm_forward)
  DIVLAB_ADAPT(rmsnorm_backward)
  DIVLAB_ADAPT(linear_forward)
  DIVLAB_ADAPT(linear_backward)
  DIVLAB_ADAPT(attention_forward)
  DIVLAB_ADAPT(attention_backward)
  DIVLAB_ADAPT(gelu_forward)
  DIVLAB_ADAPT(gelu_backward)
  DIVLAB_ADAPT(add)
  DIVLAB_ADAPT(cross_entropy)
  DIVLAB_ADAPT(embed_rmsnorm_backward)
#undef DIVLAB_ADAPT
#define DIVLAB_SAME(o)                                                              \
  if (op == #o) {                                                                   \
    known = true;                                                                   \
    if (!adopt) {                                                                   \
      to.o.remove(name);                                                            \
    } else if (to.o.find(name)) {                                                   \
    } else if (const auto* e = from.o.find(name)) {                                 \
      to.o.add(e->name, e->fn, e->doc);                                             \
    } else {                                                                        \
      throw std::logic_error("bf16 activations: no variant " + name + " of " + op); \
    }                                                                               \
  }
  DIVLAB_SAME(embedding_forward)
  DIVLAB_SAME(sum_squares)
  DIVLAB_SAME(sgd_step)
  DIVLAB_SAME(adamw_step)
#undef DIVLAB_SAME
  if (!known) throw std::logic_error("bf16 activations: op " + op + " cannot be adopted");
}

void host_widen(float* out, const bf16* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = widen(in[i]);
  });
}
void host_round(bf16* out, const float* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = to_bf16(in[i]);
  });
}

Catalogue<float, bf16> build_cpu() {
  const Catalogue<float>& f = cpu_catalogue<float>();
  set_bf16_conversions(Bf16Set::Cpu, {&host_memory(), host_widen, host_round});
  Catalogue<float, bf16> c;
  c.memory = f.memory;
  f.for_each_op([&](const auto& ops, auto) {
    if (ops.op == "cast") return;
    for (const auto& e : ops.entries) adopt_fp32_variant(c, f, ops.op, e.name, Bf16Set::Cpu);
  });
  // The partner rules travel with the variants they pair (none on the CPU today).
  f.for_each_op([&](const auto& ops, auto) {
    c.for_each_op([&](auto& mine, auto) {
      if (mine.op == ops.op) mine.partners = ops.partners;
    });
  });
  c.cast.what = f.cast.what;
  c.cast.add("reference", host_round, {"round to nearest even bf16", "", "", ""});
  return c;
}
}  // namespace

void set_bf16_conversions(Bf16Set set, const Bf16Conversions& c) {
  conversions(int(set)) = c;
}

void adopt_fp32_variant(Catalogue<float, bf16>& to, const Catalogue<float>& from,
                        const std::string& op, const std::string& name, Bf16Set set) {
  if (set == Bf16Set::Cpu)
    adopt_or_drop<0>(to, from, op, name, true);
  else
    adopt_or_drop<1>(to, from, op, name, true);
}

void drop_adopted_variant(Catalogue<float, bf16>& to, const std::string& op,
                          const std::string& name, Bf16Set set) {
  static const Catalogue<float> none;
  if (set == Bf16Set::Cpu)
    adopt_or_drop<0>(to, none, op, name, false);
  else
    adopt_or_drop<1>(to, none, op, name, false);
}

Catalogue<float, bf16>& mutable_cpu_bf16_catalogue() {
  // Built on first use from the fp32 catalogue's built-ins; plug-ins come and go through
  // adopt_fp32_variant / drop_adopted_variant (kernels/plugins.cpp).
  static Catalogue<float, bf16> cat = build_cpu();
  return cat;
}

const Catalogue<float, bf16>& cpu_bf16_catalogue() {
  return mutable_cpu_bf16_catalogue();
}

}  // namespace divlab
