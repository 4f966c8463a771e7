#include <Eigen/Core>
#include <sstream>

#include "kernels/add_rmsnorm/add_rmsnorm.h"
#include "kernels/attention/attention.h"
#include "kernels/common/lowp.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embed_rmsnorm_backward/embed_rmsnorm_backward.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fp64_controls.h"
#include "kernels/gqa/gqa.h"
#include "kernels/grad_reduce/grad_reduce.h"
#include "kernels/linear/linear.h"
#include "kernels/optimizer/optimizer.h"
#include "kernels/plugins.h"
#include "kernels/registry.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/softcap/softcap.h"
#include "kernels/swiglu/swiglu.h"

namespace divlab {

namespace {
template <class T>
Catalogue<T> build_cpu_catalogue() {
  // The CPU kernels split their work into chunks of a fixed size and run Eigen inside them
  // (kernels/common/parallel.h). A call of one chunk runs outside any parallel region, where
  // Eigen would thread a product by itself and size its blocks by the thread count: the
  // product's bits would follow OMP_NUM_THREADS. Set here, where every caller of these kernels
  // (the trainer, check, sample, the tests' harnesses) gets them.
  Eigen::setNbThreads(1);
  Catalogue<T> cat;
// Directory names are pasted into function names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_REGISTER_DIRECTORY(dir) register_##dir(cat);
  DIVLAB_OP_DIRECTORIES(DIVLAB_REGISTER_DIRECTORY)
#undef DIVLAB_REGISTER_DIRECTORY
  // NOLINTEND(bugprone-macro-parentheses)
  register_rmsnorm_variants(cat);
  register_linear_variants(cat);
  register_attention_variants(cat);
  register_cross_entropy_variants(cat);
  register_embed_rmsnorm_backward_variants(cat);
  register_rope_variants(cat);
  register_gqa_variants(cat);
  register_swiglu_variants(cat);
  register_softcap_variants(cat);
  register_add_rmsnorm_variants(cat);
  register_grad_reduce_variants(cat);
  register_fp64_controls(cat);
  return cat;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

template <class T>
Catalogue<T>& catalogue_instance() {
  static Catalogue<T> cat = build_cpu_catalogue<T>();
  return cat;
}

template <class T>
const Catalogue<T>& cpu_catalogue() {
  return catalogue_instance<T>();
}

Catalogue<float>& mutable_cpu_catalogue() {
  return catalogue_instance<float>();
}

template <class T, class A>
bool Catalogue<T, A>::graphable(const KernelSet<T, A>& k) const {
  bool all = true;
  for_each_op([&](const auto& ops, auto member) {
    for (const auto& e : ops.entries)
      if (e.fn == k.*member) {
        all = all && e.doc.graphable;
        return;
      }
  });
  return all;
}

template <class T, class A>
KernelSet<T, A> Catalogue<T, A>::select(const std::map<std::string, std::string>& choice) const {
  for (const auto& entry : choice) {
    const std::string& op = entry.first;  // (structured bindings cannot be captured before C++20)
    bool known = false;
    for_each_op([&](const auto& ops, auto) { known = known || ops.op == op; });
    if (!known)
      throw UnknownKernel("kernels." + op + ": unknown op; valid ops: " + join(op_names()));
  }
  // Variants that run only with a partner bring it along. A different explicit choice for the
  // partner's op is refused, unless that choice names this variant as its own partner (several
  // forwards that save probabilities share the one backward that reads them).
  const auto partner_of = [&](const std::string& op, const std::string& variant) {
    const Partner* p = nullptr;
    for_each_op([&](const auto& ops, auto) {
      if (ops.op == op) p = ops.partner(variant);
    });
    return p;
  };
  std::map<std::string, std::string> effective = choice;
  for (const auto& [op, variant] : choice) {
    const Partner* partner = partner_of(op, variant);
    if (!partner) continue;
    const auto named = choice.find(partner->op);
    if (named == choice.end()) {
      effective[partner->op] = partner->variant;
      continue;
    }
    const Partner* back = partner_of(named->first, named->second);
    if (named->second != partner->variant && !(back && back->op == op && back->variant == variant))
      throw UnknownKernel(
          "kernels." + op + " = '" + variant + "' runs only with kernels." + partner->op + " = '" +
          partner->variant +
          "' (the two are one implementation: saved state, or a forward and its backward); got '" +
          named->second + "'");
  }
  KernelSet<T, A> set;
  set.memory = memory;
  set.pairs = &pairs;
  for_each_op([&](const auto& ops, auto member) {
    const auto it = effective.find(ops.op);
    const std::string name = it == effective.end() ? "reference" : it->second;
    const auto* entry = ops.find(name);
    if (!entry) {
      if (const std::string note = plugin_mode_note(ops.op, name); !note.empty())
        throw UnknownKernel("kernels." + ops.op + " = '" + name + "': not in this mode: " + note);
      throw UnknownKernel("kernels." + ops.op + " = '" + name +
                          "': unknown variant; valid: " + join(ops.names()) +
                          " (a plug-in's variant appears once its library is loaded: plugins = "
                          "[\"path/lib.so\"], or --plugins)");
    }
    set.*member = entry->fn;
  });
  return set;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  cpu_catalogue<float>().for_each_op([&](const auto& ops, auto) { names.push_back(ops.op); });
  return names;
}

template <class T, class A>
bool Catalogue<T, A>::is_benign(const std::string& op, const std::string& variant) const {
  bool benign = false;
  for_each_op([&](const auto& ops, auto) {
    if (ops.op != op) return;
    if (const auto* e = ops.find(variant)) benign = e->doc.benign;
  });
  return benign;
}

bool cpu_variant_is_benign(const std::string& op, const std::string& variant) {
  return cpu_catalogue<float>().is_benign(op, variant);
}

template struct Catalogue<float>;
template struct Catalogue<double>;
template struct Catalogue<float, bf16>;
template const Catalogue<float>& cpu_catalogue<float>();
template const Catalogue<double>& cpu_catalogue<double>();
}  // namespace divlab
