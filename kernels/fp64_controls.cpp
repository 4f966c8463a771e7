#include "kernels/fp64_controls.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/op_spec.h"

namespace divlab {

namespace {

// One argument of the fp32 call, as the fp64 kernel takes it: sizes and ids pass through, scalars
// widen, arrays are copied into doubles (written ones from their current contents: an op that
// adds into its output adds to the same values) and written arrays are rounded back once.
template <class V>
struct Wide {
  V convert(V v, const ArgSpec&) { return v; }
  void finish() {}
};
template <>
struct Wide<float> {
  double convert(float v, const ArgSpec&) { return v; }
  void finish() {}
};
template <>
struct Wide<const float*> {
  std::vector<double> v;
  const double* convert(const float* p, const ArgSpec& spec) {
    if (!p) return nullptr;
    v.assign(p, p + spec.size());
    return v.data();
  }
  void finish() {}
};
template <>
struct Wide<float*> {
  std::vector<double> v;
  float* p = nullptr;
  double* convert(float* out, const ArgSpec& spec) {
    if (!out) return nullptr;
    p = out;
    v.assign(out, out + spec.size());
    return v.data();
  }
  void finish() {
    if (p) std::transform(v.begin(), v.end(), p, [](double x) { return float(x); });
  }
};

template <Op op, class Fn>
struct Fp64Control;
template <Op op, class... Args>
struct Fp64Control<op, void (*)(const OpContext&, Args...)> {
  static void call(const OpContext& ctx, Args... args) {
    const std::tuple<Args...> in(args...);
    call_wide(ctx, in, OpSpec<op>::args(in), std::index_sequence_for<Args...>());
  }

 private:
  template <class Spec, size_t... I>
  static void call_wide(const OpContext& ctx, const std::tuple<Args...>& in, const Spec& spec,
                        std::index_sequence<I...>) {
    // Built on first use, after both catalogues exist.
    static const KernelSet<double> reference = cpu_catalogue<double>().select({});
    std::tuple<Wide<Args>...> held;
    (reference.*kernel_member<op, double>())(
        ctx, std::get<I>(held).convert(std::get<I>(in), spec[I])...);
    (std::get<I>(held).finish(), ...);
  }
};

const VariantDoc kDoc{
    "CONTROL: the fp64 reference on widened inputs, every output rounded to fp32 once (more "
    "accurate than the reference)",
    "", "", "nothing to mask: differs from the reference only by fp32 rounding", true};

template <Op op, class T, class Variants>
void add_control(Variants& variants) {
  if (variants.find("fp64_accum")) return;
  if constexpr (std::is_same_v<T, double>)
    variants.add("fp64_accum", variants.find("reference")->fn, kDoc);
  else
    variants.add("fp64_accum", &Fp64Control<op, typename Variants::Function>::call, kDoc);
}

// Ops whose every output is one rounding of exact inputs: fp64 gives the reference's own bits.
constexpr bool rounds_once(Op op) {
  return op == Op::add || op == Op::cast;
}

}  // namespace

template <class T>
void register_fp64_controls(Catalogue<T>& cat) {
// Op names are pasted into member names and template arguments, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_ADD_CONTROL(name, Signature)                        \
  if constexpr (OpSpec<Op::name>::known && !rounds_once(Op::name)) \
    add_control<Op::name, T>(cat.name);
  DIVLAB_OPS(DIVLAB_ADD_CONTROL)
#undef DIVLAB_ADD_CONTROL
  // NOLINTEND(bugprone-macro-parentheses)
}

template void register_fp64_controls(Catalogue<float>&);
template void register_fp64_controls(Catalogue<double>&);

}  // namespace divlab
