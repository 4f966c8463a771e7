// The catalogue of kernels: for every op, its reference and its named variants, each with the
// documentation that `divlab kernels` prints (what is wrong, what exposes it, what masks it).
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/memory.h"
#include "kernels/op_list.h"
#include "kernels/ops.h"
#include "kernels/reference_pairs.h"

namespace divlab {

// What a variant is, in words. For a reference, `wrong` is empty.
struct VariantDoc {
  std::string summary;     // one line: what this implementation does
  std::string wrong;       // what is wrong with it ("" for references and benign controls)
  std::string exposed_by;  // which inputs or settings make the error visible
  std::string masked_by;   // which inputs or settings hide it
  bool benign = false;     // a control: same math up to rounding; must never be called divergent
  // Whether a CUDA graph may record the kernel and replay it (graph steps, docs/cuda.md): not a
  // kernel that draws random bits from its call's seed (a replay repeats the recorded draw) or
  // synchronises with the host, nor a plug-in's, which may do either.
  bool graphable = true;
};

// A variant that runs only with one implementation of another op: a forward whose saved state
// only its own backward reads (the fused attention forward saves no probabilities), or a forward
// written with its backward as one kernel pair (RoPE's variants). Choosing it chooses that one
// too, and a different explicit choice for that op is refused (Catalogue::select).
struct Partner {
  std::string op, variant;
};

template <class Fn>
struct OpVariants {
  struct Entry {
    std::string name;
    VariantDoc doc;
    Kernel<Fn> fn;
    // Keeps the kernel's bound state alive while the entry exists (an adapter's inner kernel).
    std::shared_ptr<void> owner;
  };
  using Function = Fn;
  explicit OpVariants(std::string op_name) : op(std::move(op_name)) {}
  std::string op;
  std::string what;  // one line on what the op computes
  std::vector<Entry> entries;
  std::map<std::string, Partner> partners;  // variant name -> the partner it runs with

  void add(std::string name, Kernel<Fn> fn, VariantDoc doc, std::shared_ptr<void> owner = {}) {
    entries.push_back({std::move(name), std::move(doc), fn, std::move(owner)});
  }
  // A kernel without the context argument (Kernel::context_free).
  void add(std::string name, typename Kernel<Fn>::ContextFree fn, VariantDoc doc) {
    add(std::move(name), Kernel<Fn>::context_free(fn), std::move(doc));
  }
  // `name` runs only with `variant` of `other_op` (see Partner).
  void pair(const std::string& name, std::string other_op, std::string variant) {
    partners[name] = Partner{std::move(other_op), std::move(variant)};
  }
  const Partner* partner(const std::string& name) const {
    const auto it = partners.find(name);
    return it == partners.end() ? nullptr : &it->second;
  }
  void remove(const std::string& name) {
    partners.erase(name);
    for (auto it = entries.begin(); it != entries.end(); ++it)
      if (it->name == name) {
        entries.erase(it);
        return;
      }
  }
  const Entry* find(const std::string& name) const {
    for (const auto& e : entries)
      if (e.name == name) return &e;
    return nullptr;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries) out.push_back(e.name);
    return out;
  }
};

// One function pointer per op: what the model calls. Built by Catalogue::select. T and A are
// the storage types of kernels/ops.h (parameters and stream; activations).
template <class T, class A = T>
struct KernelSet {
  using Value = T;
  using S = OpSignatures<T, A>;
// Op names and signatures are pasted into declarations, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_KERNEL_MEMBER(name, Signature) Kernel<typename S::Signature> name;
  DIVLAB_OPS(DIVLAB_KERNEL_MEMBER)
#undef DIVLAB_KERNEL_MEMBER
  // NOLINTEND(bugprone-macro-parentheses)
  // Where the tensors these kernels take must live.
  const MemoryOps* memory = &host_memory();
  // The backend's reference pairs (the catalogue's; null: none).
  const ReferencePairs<T, A>* pairs = nullptr;

  // Whether these kernels run each of the backend's reference pairs (ReferencePairs).
  bool attention_pair() const {
    return pairs && pairs->attention.saving_forward &&
           attention_forward == pairs->attention.forward &&
           attention_backward == pairs->attention.backward;
  }
  bool add_norm_pair() const {
    return pairs && pairs->add_norm.fused && add == pairs->add_norm.add &&
           rmsnorm_forward == pairs->add_norm.norm;
  }
  bool norm_backward_cast_pair() const {
    return pairs && pairs->norm_backward_cast.fused &&
           rmsnorm_backward == pairs->norm_backward_cast.norm_backward &&
           cast == pairs->norm_backward_cast.cast;
  }
  bool sgd_cast_pair() const {
    return pairs && pairs->sgd_cast.fused && sgd_step == pairs->sgd_cast.sgd_step &&
           cast == pairs->sgd_cast.cast;
  }
  bool sum_squares_spans_path() const {
    return pairs && pairs->sum_squares_spans.fused &&
           sum_squares == pairs->sum_squares_spans.sum_squares;
  }
};

// Nothing but the listed ops (a function and its state each), the memory pointer and the
// reference pairs: a member added by hand fails here.
static_assert(sizeof(KernelSet<float>) == (2 * kOpCount + 2) * sizeof(void*));

// KernelSet's member for `op` (a pointer to member): generic code over ops (shadow mode's taps
// and replays) reaches a kernel by its Op.
template <Op op, class T, class A = T>
constexpr auto kernel_member() {
// Op names are pasted into member names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_MEMBER_OF(name, Signature) \
  if constexpr (op == Op::name) return &KernelSet<T, A>::name;
  DIVLAB_OPS(DIVLAB_MEMBER_OF)
#undef DIVLAB_MEMBER_OF
  // NOLINTEND(bugprone-macro-parentheses)
}

// A kernel selection that names an op or variant that does not exist.
struct UnknownKernel : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T, class A = T>
struct Catalogue {
  using Value = T;
  using S = OpSignatures<T, A>;
// Op names and signatures are pasted into declarations, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_OP_VARIANTS(name, Signature) OpVariants<typename S::Signature> name{#name};
  DIVLAB_OPS(DIVLAB_OP_VARIANTS)
#undef DIVLAB_OP_VARIANTS
  // NOLINTEND(bugprone-macro-parentheses)
  const MemoryOps* memory = &host_memory();  // the backend's memory
  ReferencePairs<T, A> pairs;                // what its references do together (if anything)

  // Calls f(OpVariants&, KernelSet member pointer) for every op, in a fixed order.
  template <class F>
  void for_each_op(F&& f) const {
    visit(*this, f);
  }
  template <class F>
  void for_each_op(F&& f) {
    visit(*this, f);
  }

  // `choice` maps op name -> variant name; ops not named get "reference".
  // Throws UnknownKernel naming the valid ops or variants.
  KernelSet<T, A> select(const std::map<std::string, std::string>& choice) const;
  // Whether `variant` of `op` is documented as a benign control (false if there is none).
  bool is_benign(const std::string& op, const std::string& variant) const;
  // Whether a CUDA graph may replay every kernel of `k`, a set selected from this catalogue
  // (VariantDoc::graphable; each kernel judged by the first entry with its function and state).
  bool graphable(const KernelSet<T, A>& k) const;

 private:
  template <class Self, class F>
  static void visit(Self& self, F& f) {
// Op names and signatures are pasted into declarations, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_VISIT_OP(name, Signature) f(self.name, &KernelSet<T, A>::name);
    DIVLAB_OPS(DIVLAB_VISIT_OP)
#undef DIVLAB_VISIT_OP
    // NOLINTEND(bugprone-macro-parentheses)
  }
};

// The CPU backend's catalogue (every op's Eigen reference and its CPU variants).
template <class T>
const Catalogue<T>& cpu_catalogue();
// The same, for adding plug-in variants (kernels/plugins.h).
Catalogue<float>& mutable_cpu_catalogue();

// Names of every op, in catalogue order.
std::vector<std::string> op_names();

// Whether the CPU catalogue documents `variant` of `op` as a benign control (false if it has no
// such variant): the answer for traces that do not record their kernels' roles.
bool cpu_variant_is_benign(const std::string& op, const std::string& variant);

}  // namespace divlab
