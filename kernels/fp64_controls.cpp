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

}  // namespace

template <class T>
void register_fp64_controls(Catalogue<T>& cat) {
  add_control<Op::rmsnorm_forward, T>(cat.rmsnorm_forward);
  add_control<Op::rmsnorm_backward, T>(cat.rmsnorm_backward);
  add_control<Op::linear_forward, T>(cat.linear_forward);
  add_control<Op::linear_backward, T>(cat.linear_backward);
  add_control<Op::attention_forward, T>(cat.attention_forward);
  add_control<Op::attention_backward, T>(cat.attention_backward);
  add_control<Op::gelu_forward, T>(cat.gelu_forward);
  add_control<Op::gelu_backward, T>(cat.gelu_backward);
  add_control<Op::cross_entropy, T>(cat.cross_entropy);
}

template void register_fp64_controls(Catalogue<float>&);
template void register_fp64_controls(Catalogue<double>&);

}  // namespace divlab
