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
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/common/parallel.h"
#include "kernels/op_spec.h"

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

// One argument of an adapted call, by its bf16-mode type: passed through, or (a bf16 array)
// widened into an fp32 copy; a written bf16 array starts from its current contents (a kernel
// that leaves some of it alone leaves the old values, as it would in place) and is rounded back
// to nearest even bf16 once the fp32 kernel is done.
template <class V>
struct Bf16Arg {
  V convert(const OpContext&, const Bf16Conversions&, V v, const ArgSpec&) { return v; }
  void finish(const OpContext&, const Bf16Conversions&) {}
};
template <>
struct Bf16Arg<const bf16*> {
  Buffer<float> v;
  const float* convert(const OpContext& ctx, const Bf16Conversions& c, const bf16* p,
                       const ArgSpec& spec) {
    v = widened(ctx, c, p, spec.size());
    return p ? v.data() : nullptr;
  }
  void finish(const OpContext&, const Bf16Conversions&) {}
};
template <>
struct Bf16Arg<bf16*> {
  Buffer<float> v;
  bf16* p = nullptr;
  int64_t n = 0;
  float* convert(const OpContext& ctx, const Bf16Conversions& c, bf16* out, const ArgSpec& spec) {
    p = out, n = spec.size();
    v = widened(ctx, c, out, n);
    return p ? v.data() : nullptr;
  }
  void finish(const OpContext& ctx, const Bf16Conversions& c) {
    if (p) c.round(ctx.stream, p, v.data(), n);
  }
};

// The adapter of `op`: its bf16-mode signature Fn16 around the bound fp32 kernel (Fn32), every
// bf16 array converted as its spec (kernels/op_spec.h) says.
template <Op op, class Fn16, class Fn32>
struct Adapter;
template <Op op, class... Args16, class Fn32>
struct Adapter<op, void (*)(const OpContext&, Args16...), Fn32> {
  static void call(const OpContext& ctx, Args16... args) {
    const auto& a = *static_cast<const Adapted<Fn32>*>(ctx.state);
    const std::tuple<Args16...> in(args...);
    call_converted(ctx, a, in, OpSpec<op>::args(in), std::index_sequence_for<Args16...>());
  }

 private:
  template <class Spec, size_t... I>
  static void call_converted(const OpContext& ctx, const Adapted<Fn32>& a,
                             const std::tuple<Args16...>& in, const Spec& spec,
                             std::index_sequence<I...>) {
    std::tuple<Bf16Arg<Args16>...> held;
    a.inner(ctx, std::get<I>(held).convert(ctx, a.conv, std::get<I>(in), spec[I])...);
    (std::get<I>(held).finish(ctx, a.conv), ...);
  }
};

// Whether op's bf16-mode signature differs from its fp32 one (it has activation arguments).
template <Op op, class From, class To>
constexpr bool has_activations() {
  return !std::is_same_v<typename From::Function, typename To::Function>;
}

template <Op op, class From, class To>
void adopt(const From& from, To& to, const std::string& name, const Bf16Conversions& conv) {
  if (to.find(name)) return;  // adopted already
  const auto* e = from.find(name);
  if (!e) throw std::logic_error("bf16 activations: no variant " + name + " of " + from.op);
  using Fn32 = typename From::Function;
  using Fn16 = typename To::Function;
  if constexpr (op == Op::cast) {  // fp32 -> bf16 is the bf16 mode's own kernel
    throw std::logic_error("bf16 activations: op cast cannot be adopted");
  } else if constexpr (!has_activations<op, From, To>()) {
    to.add(e->name, e->fn, e->doc, e->owner);
  } else {
    static_assert(OpSpec<op>::known, "an op with activation arguments needs a spec to be adapted");
    auto binding = std::make_shared<Adapted<Fn32>>(Adapted<Fn32>{e->fn, conv, e->owner});
    to.add(e->name, {&Adapter<op, Fn16, Fn32>::call, binding.get()}, e->doc, binding);
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
  // The ops' descriptions, and the partner rules with the variants they pair.
  f.for_each_op([&](const auto& ops, auto) {
    c.for_each_op([&](auto& mine, auto) {
      if (mine.op == ops.op) mine.partners = ops.partners, mine.what = ops.what;
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
