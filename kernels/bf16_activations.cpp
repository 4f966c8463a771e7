// The CPU's bf16 mode: the fp32 catalogue with its activations stored in bf16.
//
// Every variant of every op runs its own fp32 kernel on widened copies of its bf16 inputs, and
// its activation outputs are rounded to nearest even bf16 on the way out: exactly what storing
// activations in bf16 does to fp32 arithmetic, which is what the GPU's bf16 mode stores (its
// GEMMs multiply the same bf16 values, accumulating in fp32). Slow (a conversion around every
// op), but it lets a laptop show what bf16 activation storage does and does not do to a run,
// and it runs the bf16 mode's model, shadow captures and NaN attribution where there is no GPU.
//
// An adapted entry is one adapter function per op bound (Kernel::state) to an Adapted record:
// the fp32 kernel it wraps and its backend's conversions. The same adapters bring the fp32
// plug-in ABI's variants into both bf16 modes (CPU and GPU, each with its own conversions).
#include "kernels/bf16_activations.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common/parallel.h"

namespace divlab {

namespace {
constexpr int64_t kChunk = 1 << 14;

using S32 = OpSignatures<float>;

// What an adapted entry is bound to.
template <class Fn32>
struct Adapted {
  Kernel<Fn32> inner;
  Bf16Conversions conv;
  std::shared_ptr<void> inner_owner;  // the inner kernel's own binding, if it has one
};
template <class Fn32>
const Adapted<Fn32>& adapted(const OpContext& ctx) {
  return *static_cast<const Adapted<Fn32>*>(ctx.state);
}

// Widened fp32 copy of n bf16 values in the backend's memory (empty for a null pointer).
Buffer<float> widened(const OpContext& ctx, const Bf16Conversions& c, const bf16* p, int64_t n) {
  if (!p) return Buffer<float>();
  Buffer<float> b(*c.memory, n);
  c.widen(ctx.stream, b.data(), p, n);
  return b;
}
// An activation output: its current contents widened (a kernel that leaves some of it alone
// leaves the old values, as it would in place), rounded back when the call is done.
struct Out {
  const OpContext& ctx;
  const Bf16Conversions& conv;
  bf16* p;
  int64_t n;
  Buffer<float> v;
  Out(const OpContext& context, const Bf16Conversions& c, bf16* out, int64_t count)
      : ctx(context), conv(c), p(out), n(count), v(widened(context, c, out, count)) {}
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  float* data() { return p ? v.data() : nullptr; }
  ~Out() {
    if (p) conv.round(ctx.stream, p, v.data(), n);
  }
};

void rmsnorm_forward(const OpContext& ctx, bf16* y, float* rstd, const float* x, const float* w,
                     int N, int C, float eps) {
  const auto& a = adapted<S32::RmsnormForward>(ctx);
  Out y32(ctx, a.conv, y, int64_t(N) * C);
  a.inner(ctx, y32.data(), rstd, x, w, N, C, eps);
}
void rmsnorm_backward(const OpContext& ctx, float* dresid, float* dw, const bf16* dy,
                      const float* x, const float* w, const float* rstd, int N, int C) {
  const auto& a = adapted<S32::RmsnormBackward>(ctx);
  const auto dy32 = widened(ctx, a.conv, dy, int64_t(N) * C);
  a.inner(ctx, dresid, dw, dy32.data(), x, w, rstd, N, C);
}
void linear_forward(const OpContext& ctx, bf16* y, const bf16* x, const bf16* W, int N, int in,
                    int out) {
  const auto& a = adapted<S32::LinearForward>(ctx);
  const auto x32 = widened(ctx, a.conv, x, int64_t(N) * in),
             W32 = widened(ctx, a.conv, W, int64_t(out) * in);
  Out y32(ctx, a.conv, y, int64_t(N) * out);
  a.inner(ctx, y32.data(), x32.data(), W32.data(), N, in, out);
}
void linear_backward(const OpContext& ctx, bf16* dx, float* dW, const bf16* dy, const bf16* x,
                     const bf16* W, int N, int in, int out) {
  const auto& a = adapted<S32::LinearBackward>(ctx);
  const auto dy32 = widened(ctx, a.conv, dy, int64_t(N) * out),
             x32 = widened(ctx, a.conv, x, int64_t(N) * in),
             W32 = widened(ctx, a.conv, W, int64_t(out) * in);
  Out dx32(ctx, a.conv, dx, int64_t(N) * in);
  a.inner(ctx, dx32.data(), dW, dy32.data(), x32.data(), W32.data(), N, in, out);
}
void attention_forward(const OpContext& ctx, bf16* out, bf16* att, const bf16* qkv, int B, int T_,
                       int C, int NH) {
  const auto& a = adapted<S32::AttentionForward>(ctx);
  const int64_t N = int64_t(B) * T_;
  const auto qkv32 = widened(ctx, a.conv, qkv, N * 3 * C);
  Out out32(ctx, a.conv, out, N * C), att32(ctx, a.conv, att, int64_t(B) * NH * T_ * T_);
  a.inner(ctx, out32.data(), att32.data(), qkv32.data(), B, T_, C, NH);
}
void attention_backward(const OpContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv,
                        const bf16* att, int B, int T_, int C, int NH) {
  const auto& a = adapted<S32::AttentionBackward>(ctx);
  const int64_t N = int64_t(B) * T_;
  const auto dout32 = widened(ctx, a.conv, dout, N * C),
             qkv32 = widened(ctx, a.conv, qkv, N * 3 * C),
             att32 = widened(ctx, a.conv, att, int64_t(B) * NH * T_ * T_);
  Out dqkv32(ctx, a.conv, dqkv, N * 3 * C);
  a.inner(ctx, dqkv32.data(), dout32.data(), qkv32.data(), att32.data(), B, T_, C, NH);
}
void gelu_forward(const OpContext& ctx, bf16* y, const bf16* x, int64_t n) {
  const auto& a = adapted<S32::GeluForward>(ctx);
  const auto x32 = widened(ctx, a.conv, x, n);
  Out y32(ctx, a.conv, y, n);
  a.inner(ctx, y32.data(), x32.data(), n);
}
void gelu_backward(const OpContext& ctx, bf16* dx, const bf16* dy, const bf16* x, int64_t n) {
  const auto& a = adapted<S32::GeluBackward>(ctx);
  const auto dy32 = widened(ctx, a.conv, dy, n), x32 = widened(ctx, a.conv, x, n);
  Out dx32(ctx, a.conv, dx, n);
  a.inner(ctx, dx32.data(), dy32.data(), x32.data(), n);
}
void add(const OpContext& ctx, float* y, const float* a_, const bf16* b, int64_t n) {
  const auto& a = adapted<S32::Add>(ctx);
  const auto b32 = widened(ctx, a.conv, b, n);
  a.inner(ctx, y, a_, b32.data(), n);
}
void cross_entropy(const OpContext& ctx, float* losses, bf16* dlogits, const bf16* logits,
                   const TokenId* targets, int N, int V, float dloss) {
  const auto& a = adapted<S32::CrossEntropy>(ctx);
  const auto logits32 = widened(ctx, a.conv, logits, int64_t(N) * V);
  Out dlogits32(ctx, a.conv, dlogits, int64_t(N) * V);
  a.inner(ctx, losses, dlogits32.data(), logits32.data(), targets, N, V, dloss);
}
void embed_rmsnorm_backward(const OpContext& ctx, float* dwte, float* dwpe, float* dw_norm,
                            const bf16* dy_norm, const float* dresid, const float* x0,
                            const float* w_norm, const float* rstd, const TokenId* tokens, int B,
                            int T_, int C, int V) {
  const auto& a = adapted<S32::EmbedRmsnormBackward>(ctx);
  const auto dy32 = widened(ctx, a.conv, dy_norm, int64_t(B) * T_ * C);
  a.inner(ctx, dwte, dwpe, dw_norm, dy32.data(), dresid, x0, w_norm, rstd, tokens, B, T_, C, V);
}

// The adapter of each op with activation arguments; the other ops' signatures are the same in
// both catalogues and their kernels are taken as they are. (By op, not by signature: gelu_backward
// and add, or gelu_forward and cast, have the same fp32 type.)
template <Op op>
constexpr auto adapter_of() {
  if constexpr (op == Op::rmsnorm_forward)
    return &rmsnorm_forward;
  else if constexpr (op == Op::rmsnorm_backward)
    return &rmsnorm_backward;
  else if constexpr (op == Op::linear_forward)
    return &linear_forward;
  else if constexpr (op == Op::linear_backward)
    return &linear_backward;
  else if constexpr (op == Op::attention_forward)
    return &attention_forward;
  else if constexpr (op == Op::attention_backward)
    return &attention_backward;
  else if constexpr (op == Op::gelu_forward)
    return &gelu_forward;
  else if constexpr (op == Op::gelu_backward)
    return &gelu_backward;
  else if constexpr (op == Op::add)
    return &add;
  else if constexpr (op == Op::cross_entropy)
    return &cross_entropy;
  else if constexpr (op == Op::embed_rmsnorm_backward)
    return &embed_rmsnorm_backward;
  else
    return nullptr;
}

template <Op op, class From, class To>
void adopt(const From& from, To& to, const std::string& name, const Bf16Conversions& conv) {
  if (to.find(name)) return;  // adopted already
  const auto* e = from.find(name);
  if (!e) throw std::logic_error("bf16 activations: no variant " + name + " of " + from.op);
  using Fn32 = typename From::Function;
  constexpr auto adapter = adapter_of<op>();
  if constexpr (op == Op::cast) {  // fp32 -> bf16 is the bf16 mode's own kernel
    throw std::logic_error("bf16 activations: op cast cannot be adopted");
  } else if constexpr (std::is_same_v<decltype(adapter), const std::nullptr_t>) {
    to.add(e->name, e->fn, e->doc, e->owner);
  } else {
    auto binding = std::make_shared<Adapted<Fn32>>(Adapted<Fn32>{e->fn, conv, e->owner});
    to.add(e->name, {adapter, binding.get()}, e->doc, binding);
  }
}

void host_widen(void* /*stream*/, float* out, const bf16* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = widen(in[i]);
  });
}
void host_round(void* /*stream*/, bf16* out, const float* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = to_bf16(in[i]);
  });
}
void host_cast(const OpContext& ctx, bf16* out, const float* in, int64_t n) {
  host_round(ctx.stream, out, in, n);
}

Catalogue<float, bf16> build_cpu() {
  const Catalogue<float>& f = cpu_catalogue<float>();
  Catalogue<float, bf16> c;
  c.memory = f.memory;
  f.for_each_op([&](const auto& ops, auto) {
    if (ops.op == "cast") return;
    for (const auto& e : ops.entries)
      adopt_fp32_variant(c, f, ops.op, e.name, host_bf16_conversions());
  });
  // The partner rules travel with the variants they pair (none on the CPU today).
  f.for_each_op([&](const auto& ops, auto) {
    c.for_each_op([&](auto& mine, auto) {
      if (mine.op == ops.op) mine.partners = ops.partners;
    });
  });
  c.cast.what = f.cast.what;
  c.cast.add("reference", host_cast, {"round to nearest even bf16", "", "", ""});
  return c;
}
}  // namespace

const Bf16Conversions& host_bf16_conversions() {
  static const Bf16Conversions c{&host_memory(), host_widen, host_round};
  return c;
}

void adopt_fp32_variant(Catalogue<float, bf16>& to, const Catalogue<float>& from,
                        const std::string& op, const std::string& name,
                        const Bf16Conversions& conv) {
// Op names are pasted into member names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_ADOPT_OP(op_name, Signature) \
  if (op == #op_name) return adopt<Op::op_name>(from.op_name, to.op_name, name, conv);
  DIVLAB_OPS(DIVLAB_ADOPT_OP)
#undef DIVLAB_ADOPT_OP
  // NOLINTEND(bugprone-macro-parentheses)
  throw std::logic_error("bf16 activations: op " + op + " cannot be adopted");
}

void drop_adopted_variant(Catalogue<float, bf16>& to, const std::string& op,
                          const std::string& name) {
  to.for_each_op([&](auto& ops, auto) {
    if (ops.op == op) ops.remove(name);
  });
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
