#include "kernels/fp64_controls.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/memory.h"
#include "kernels/op_spec.h"

namespace divlab {

namespace {

// Where the call's arrays live: host memory the control reads in place, or device memory it
// copies through (on the call's stream, waiting for the work queued before it).
struct Place {
  const MemoryOps* memory;
  void* stream;
  template <class E>
  std::vector<E> fetch(const E* p, int64_t n) const {
    std::vector<E> v(static_cast<size_t>(n));
    if (memory->host_accessible)
      std::copy(p, p + n, v.begin());
    else
      memory->download(stream, v.data(), p, size_t(n) * sizeof(E));
    return v;
  }
  template <class E>
  void store(E* p, const std::vector<E>& v) const {
    if (memory->host_accessible)
      std::copy(v.begin(), v.end(), p);
    else
      memory->upload(stream, p, v.data(), v.size() * sizeof(E));
  }
};

// One argument of the call, as the fp64 kernel takes it: sizes, flags and ids pass through (ids
// copied to the host), scalars widen, arrays are copied into doubles (written ones from their
// current contents: an op that adds into its output adds to the same values) and written arrays
// are rounded back once (bf16 through fp32, as the CPU's bf16 adapters round the fp32 control).
template <class V>
struct Wide {
  V convert(V v, const ArgSpec&, const Place&) { return v; }
  void finish(const Place&) {}
};
template <>
struct Wide<float> {
  double convert(float v, const ArgSpec&, const Place&) { return v; }
  void finish(const Place&) {}
};
template <>
struct Wide<const TokenId*> {
  std::vector<TokenId> v;
  const TokenId* convert(const TokenId* p, const ArgSpec& spec, const Place& at) {
    if (!p) return nullptr;
    v = at.fetch(p, spec.size());
    return v.data();
  }
  void finish(const Place&) {}
};
template <class E>
struct Wide<const E*> {
  std::vector<double> v;
  const double* convert(const E* p, const ArgSpec& spec, const Place& at) {
    if (!p) return nullptr;
    const std::vector<E> e = at.fetch(p, spec.size());
    v.resize(e.size());
    std::transform(e.begin(), e.end(), v.begin(), [](E x) { return to_double(x); });
    return v.data();
  }
  void finish(const Place&) {}
};
template <class E>
struct Wide<E*> {
  std::vector<double> v;
  E* p = nullptr;
  double* convert(E* out, const ArgSpec& spec, const Place& at) {
    if (!out) return nullptr;
    p = out;
    const std::vector<E> e = at.fetch(static_cast<const E*>(out), spec.size());
    v.resize(e.size());
    std::transform(e.begin(), e.end(), v.begin(), [](E x) { return to_double(x); });
    return v.data();
  }
  void finish(const Place& at) {
    if (!p) return;
    std::vector<E> e(v.size());
    std::transform(v.begin(), v.end(), e.begin(), [](double x) { return stored_as<E>(x); });
    at.store(p, e);
  }
};

// Bound to its catalogue's memory (Kernel::state).
template <Op op, class Fn>
struct Fp64Control;
template <Op op, class... Args>
struct Fp64Control<op, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    const std::tuple<Args...> in(args...);
    const Place at{static_cast<const MemoryOps*>(ctx.state), ctx.stream};
    call_wide(ctx, at, in, OpSpec<op>::args(in), std::index_sequence_for<Args...>());
  }

 private:
  template <class Spec, size_t... I>
  static void call_wide(const OpContext& ctx, const Place& at, const std::tuple<Args...>& in,
                        const Spec& spec, std::index_sequence<I...>) {
    // Built on first use, after both catalogues exist.
    static const KernelSet<double> reference = cpu_catalogue<double>().select({});
    // The fp64 reference runs on the host: its context is a host one (same seed).
    OpContextSource host(host_memory());
    OpContext hctx = host.next();
    hctx.seed = ctx.seed;
    std::tuple<Wide<Args>...> held;
    (reference.*kernel_member<op, double>())(
        hctx, std::get<I>(held).convert(std::get<I>(in), spec[I], at)...);
    (std::get<I>(held).finish(at), ...);
  }
};

template <Op op, class T, class Variants>
void add_control(Variants& variants, const MemoryOps* memory) {
  if (variants.find("fp64_accum")) return;
  if constexpr (std::is_same_v<T, double>)
    variants.add("fp64_accum", variants.find("reference")->fn, fp64_control_doc());
  else
    variants.add(
        "fp64_accum",
        {&Fp64Control<op, typename Variants::Function>::call, const_cast<MemoryOps*>(memory)},
        fp64_control_doc());
}

// Ops whose every output is one rounding of exact inputs: fp64 gives the reference's own bits.
constexpr bool rounds_once(Op op) {
  return op == Op::add || op == Op::cast || op == Op::embedding_forward;
}

}  // namespace

const VariantDoc& fp64_control_doc() {
  static const VariantDoc doc{
      "CONTROL: the fp64 reference on widened inputs, every output rounded to fp32 once (more "
      "accurate than the reference)",
      "",
      "",
      "nothing to mask: differs from the reference only by fp32 rounding",
      true,
      /*graphable=*/false};  // on a device it waits for its copies to the host and back
  return doc;
}

template <class T, class A>
void register_fp64_controls(Catalogue<T, A>& cat) {
// Op names are pasted into member names and template arguments, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_ADD_CONTROL(name, Signature)                        \
  if constexpr (OpSpec<Op::name>::known && !rounds_once(Op::name)) \
    add_control<Op::name, T>(cat.name, cat.memory);
  DIVLAB_OPS(DIVLAB_ADD_CONTROL)
#undef DIVLAB_ADD_CONTROL
  // NOLINTEND(bugprone-macro-parentheses)
}

template void register_fp64_controls(Catalogue<float>&);
template void register_fp64_controls(Catalogue<double>&);
template void register_fp64_controls(Catalogue<float, bf16>&);

}  // namespace divlab
