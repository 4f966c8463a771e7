// A kernel written for one storage of the activations, run in a mode that stores another: the
// bf16 mode's adapters (an fp32 kernel on widened copies of the bf16 arrays, its outputs rounded
// back to bf16) and the fp32 mode's fp16 adapters (an fp16 plug-in kernel on narrowed copies of
// the fp32 arrays, its outputs widened back) are this one shape. Every array whose type differs
// between the two signatures is copied into the kernel's storage before the call (a written one
// from its current contents, so whatever the kernel leaves alone keeps its value, as it would in
// place) and, if written, copied back once the kernel is done. Array extents come from the op's
// spec (kernels/op_spec.h).
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/memory.h"
#include "kernels/op_spec.h"

namespace divlab {

// How a backend converts arrays between the mode's storage (Outer) and the kernel's (Inner), on
// the call's stream. A conversion that narrows rounds to nearest even.
template <class Outer, class Inner>
struct StorageConversions {
  using OuterType = Outer;
  using InnerType = Inner;
  const MemoryOps* memory = nullptr;
  void (*to_inner)(void* stream, Inner* out, const Outer* in, int64_t n) = nullptr;
  void (*to_outer)(void* stream, Outer* out, const Inner* in, int64_t n) = nullptr;
};

namespace storage_detail {

// One argument of an adapted call: passed through where the two signatures agree, else a copy in
// the kernel's storage (written back by finish()).
template <class Conv, class OuterArg, class InnerArg>
struct Arg {
  InnerArg convert(const OpContext&, const Conv&, OuterArg v, const ArgSpec&) { return v; }
  void finish(const OpContext&, const Conv&) {}
};
template <class O, class I>
struct Arg<StorageConversions<O, I>, const O*, const I*> {
  Buffer<I> v;
  const I* convert(const OpContext& ctx, const StorageConversions<O, I>& c, const O* p,
                   const ArgSpec& spec) {
    if (!p) return nullptr;
    v = Buffer<I>(*c.memory, spec.size());
    c.to_inner(ctx.stream, v.data(), p, spec.size());
    return v.data();
  }
  void finish(const OpContext&, const StorageConversions<O, I>&) {}
};
template <class O, class I>
struct Arg<StorageConversions<O, I>, O*, I*> {
  Buffer<I> v;
  O* p = nullptr;
  I* convert(const OpContext& ctx, const StorageConversions<O, I>& c, O* out, const ArgSpec& spec) {
    p = out;
    if (!p) return nullptr;
    v = Buffer<I>(*c.memory, spec.size());
    c.to_inner(ctx.stream, v.data(), p, spec.size());
    return v.data();
  }
  void finish(const OpContext& ctx, const StorageConversions<O, I>& c) {
    if (p) c.to_outer(ctx.stream, p, v.data(), v.size());
  }
};

// What an adapter is bound to (Kernel::state): the kernel it wraps, the conversions, and the
// wrapped kernel's own binding, if it has one.
template <class FnInner, class Conv>
struct Bound {
  Kernel<FnInner> inner;
  Conv conv;
  std::shared_ptr<void> inner_owner;
};

template <Op op, class FnOuter, class FnInner, class Conv>
struct Adapter;
template <Op op, class... Outer, class... Inner, class Conv>
struct Adapter<op, void (*)(const OpContext&, Outer...), void (*)(const OpContext&, Inner...),
               Conv> {
  using FnInner = void (*)(const OpContext&, Inner...);
  static void call(const OpContext& ctx, Outer... args) {
    const auto& b = *static_cast<const Bound<FnInner, Conv>*>(ctx.state);
    const std::tuple<Outer...> in(args...);
    call_converted(ctx, b, in, OpSpec<op>::args(in), std::index_sequence_for<Outer...>());
  }

 private:
  template <class Spec, size_t... I>
  static void call_converted(const OpContext& ctx, const Bound<FnInner, Conv>& b,
                             const std::tuple<Outer...>& in, const Spec& spec,
                             std::index_sequence<I...>) {
    std::tuple<Arg<Conv, Outer, Inner>...> held;
    b.inner(ctx, std::get<I>(held).convert(ctx, b.conv, std::get<I>(in), spec[I])...);
    (std::get<I>(held).finish(ctx, b.conv), ...);
  }
};

}  // namespace storage_detail

// `inner` (an op's kernel of signature FnInner) as an entry of the mode's signature FnOuter: the
// kernel itself where the two agree (an op without activation arrays), else an adapter bound to
// it; the second member owns that binding (a catalogue entry keeps it alive).
template <Op op, class FnOuter, class FnInner, class Conv>
std::pair<Kernel<FnOuter>, std::shared_ptr<void>> adapt_storage(const Kernel<FnInner>& inner,
                                                                const Conv& conv,
                                                                std::shared_ptr<void> inner_owner) {
  if constexpr (std::is_same_v<FnOuter, FnInner>) {
    return {inner, std::move(inner_owner)};
  } else {
    static_assert(OpSpec<op>::known, "an op with activation arguments needs a spec to adapt");
    using Binding = storage_detail::Bound<FnInner, Conv>;
    auto bound = std::make_shared<Binding>(Binding{inner, conv, std::move(inner_owner)});
    const Kernel<FnOuter> k(&storage_detail::Adapter<op, FnOuter, FnInner, Conv>::call,
                            bound.get());
    return {k, std::move(bound)};
  }
}

}  // namespace divlab
