#include "kernels/fp16_activations.h"

#include <memory>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/common/parallel.h"
#include "kernels/op_spec.h"
#include "kernels/plugin_calls.h"

namespace divlab {

namespace {
constexpr int64_t kChunk = 1 << 14;

// One argument of an adapted call, by its fp32-mode type and the fp16 kernel's: passed through
// where the two agree, else an fp16 copy (a written array is widened back by finish()).
template <class Outer, class Inner>
struct Fp16Arg {
  Inner convert(const OpContext&, const Fp16Conversions&, Outer v, const ArgSpec&) { return v; }
  void finish(const OpContext&, const Fp16Conversions&) {}
};
template <>
struct Fp16Arg<const float*, const fp16*> {
  Buffer<fp16> v;
  const fp16* convert(const OpContext& ctx, const Fp16Conversions& c, const float* p,
                      const ArgSpec& spec) {
    if (!p) return nullptr;
    v = Buffer<fp16>(*c.memory, spec.size());
    c.narrow(ctx.stream, v.data(), p, spec.size());
    return v.data();
  }
  void finish(const OpContext&, const Fp16Conversions&) {}
};
template <>
struct Fp16Arg<float*, fp16*> {
  Buffer<fp16> v;
  float* p = nullptr;
  fp16* convert(const OpContext& ctx, const Fp16Conversions& c, float* out, const ArgSpec& spec) {
    p = out;
    if (!p) return nullptr;
    v = Buffer<fp16>(*c.memory, spec.size());
    c.narrow(ctx.stream, v.data(), p, spec.size());
    return v.data();
  }
  void finish(const OpContext& ctx, const Fp16Conversions& c) {
    if (p) c.widen(ctx.stream, p, v.data(), v.size());
  }
};

template <class Fn16>
struct Bound {
  Kernel<Fn16> inner;
  Fp16Conversions conv;
};

template <Op op, class Fn32, class Fn16>
struct Adapter;
template <Op op, class... Args32, class... Args16>
struct Adapter<op, void (*)(const OpContext&, Args32...), void (*)(const OpContext&, Args16...)> {
  using Fn16 = void (*)(const OpContext&, Args16...);
  static void call(const OpContext& ctx, Args32... args) {
    const auto& b = *static_cast<const Bound<Fn16>*>(ctx.state);
    const std::tuple<Args32...> in(args...);
    call_converted(ctx, b, in, OpSpec<op>::args(in), std::index_sequence_for<Args32...>());
  }

 private:
  template <class Spec, size_t... I>
  static void call_converted(const OpContext& ctx, const Bound<Fn16>& b,
                             const std::tuple<Args32...>& in, const Spec& spec,
                             std::index_sequence<I...>) {
    std::tuple<Fp16Arg<Args32, Args16>...> held;
    b.inner(ctx, std::get<I>(held).convert(ctx, b.conv, std::get<I>(in), spec[I])...);
    (std::get<I>(held).finish(ctx, b.conv), ...);
  }
};

// Adds the fp16 kernel fn (of type Fn16 in the ABI) to `to`.
template <Op op, class Fn16, class Ops>
void add(Ops& to, const std::string& name, void (*fn)(void), VariantDoc doc,
         const Fp16Conversions& conv) {
  using Fn32 = typename Ops::Function;
  const Kernel<Fn16> inner(&Abi2<Fn16>::call, reinterpret_cast<void*>(fn));
  if constexpr (std::is_same_v<Fn32, Fn16>) {
    to.add(name, inner, std::move(doc));  // no activation argument (embedding_forward)
  } else {
    static_assert(OpSpec<op>::known, "an op with activation arguments needs a spec to adapt");
    auto bound = std::make_shared<Bound<Fn16>>(Bound<Fn16>{inner, conv});
    to.add(name, {&Adapter<op, Fn32, Fn16>::call, bound.get()}, std::move(doc), bound);
  }
}

void host_narrow(void* /*stream*/, fp16* out, const float* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = to_fp16(in[i]);
  });
}
void host_widen(void* /*stream*/, float* out, const fp16* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = widen(in[i]);
  });
}
}  // namespace

const Fp16Conversions& host_fp16_conversions() {
  static const Fp16Conversions c{&host_memory(), host_narrow, host_widen};
  return c;
}

void add_fp16_plugin_variant(Catalogue<float>& to, const std::string& op, const std::string& name,
                             void (*fn)(void), VariantDoc doc, const Fp16Conversions& conv) {
// Op names are pasted into member names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_ADD_FP16(op_name, Signature)                                             \
  if (op == #op_name)                                                                   \
    return add<Op::op_name, OpSignatures<float, fp16>::Signature>(to.op_name, name, fn, \
                                                                  std::move(doc), conv);
  DIVLAB_MODEL_OPS(DIVLAB_ADD_FP16)
#undef DIVLAB_ADD_FP16
  // NOLINTEND(bugprone-macro-parentheses)
  throw std::logic_error("fp16 activations: op " + op + " is not in the plug-in ABI");
}

}  // namespace divlab
