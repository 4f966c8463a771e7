// The catalogue of kernels: for every op, its reference and its named variants, each with the
// documentation that `divlab kernels` prints (what is wrong, what exposes it, what masks it).
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/memory.h"
#include "kernels/ops.h"

namespace divlab {

// What a variant is, in words. For a reference, `wrong` is empty.
struct VariantDoc {
  std::string summary;     // one line: what this implementation does
  std::string wrong;       // what is wrong with it ("" for references and benign controls)
  std::string exposed_by;  // which inputs or settings make the error visible
  std::string masked_by;   // which inputs or settings hide it
  bool benign = false;     // a control: same math up to rounding; must never be called divergent
};

// A variant whose saved state only one implementation of another op can read (the fused
// attention forward saves no probabilities): choosing it chooses that one too, and a different
// explicit choice for that op is refused (Catalogue::select).
struct Partner {
  std::string op, variant;
};

template <class Fn>
struct OpVariants {
  struct Entry {
    std::string name;
    VariantDoc doc;
    Fn fn;
  };
  using Function = Fn;
  explicit OpVariants(std::string op_name) : op(std::move(op_name)) {}
  std::string op;
  std::string what;  // one line on what the op computes
  std::vector<Entry> entries;
  std::map<std::string, Partner> partners;  // variant name -> the partner it runs with

  void add(std::string name, Fn fn, VariantDoc doc) {
    entries.push_back({std::move(name), std::move(doc), fn});
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
  typename S::EmbeddingForward embedding_forward = nullptr;
  typename S::RmsnormForward rmsnorm_forward = nullptr;
  typename S::RmsnormBackward rmsnorm_backward = nullptr;
  typename S::LinearForward linear_forward = nullptr;
  typename S::LinearBackward linear_backward = nullptr;
  typename S::AttentionForward attention_forward = nullptr;
  typename S::AttentionBackward attention_backward = nullptr;
  typename S::GeluForward gelu_forward = nullptr;
  typename S::GeluBackward gelu_backward = nullptr;
  typename S::Add add = nullptr;
  typename S::CrossEntropy cross_entropy = nullptr;
  typename S::EmbedRmsnormBackward embed_rmsnorm_backward = nullptr;
  typename S::Cast cast = nullptr;
  typename S::SumSquares sum_squares = nullptr;
  typename S::SgdStep sgd_step = nullptr;
  typename S::AdamwStep adamw_step = nullptr;
  // Where the tensors these kernels take must live.
  const MemoryOps* memory = &host_memory();
};

// A kernel selection that names an op or variant that does not exist.
struct UnknownKernel : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T, class A = T>
struct Catalogue {
  using Value = T;
  using S = OpSignatures<T, A>;
  OpVariants<typename S::EmbeddingForward> embedding_forward{"embedding_forward"};
  OpVariants<typename S::RmsnormForward> rmsnorm_forward{"rmsnorm_forward"};
  OpVariants<typename S::RmsnormBackward> rmsnorm_backward{"rmsnorm_backward"};
  OpVariants<typename S::LinearForward> linear_forward{"linear_forward"};
  OpVariants<typename S::LinearBackward> linear_backward{"linear_backward"};
  OpVariants<typename S::AttentionForward> attention_forward{"attention_forward"};
  OpVariants<typename S::AttentionBackward> attention_backward{"attention_backward"};
  OpVariants<typename S::GeluForward> gelu_forward{"gelu_forward"};
  OpVariants<typename S::GeluBackward> gelu_backward{"gelu_backward"};
  OpVariants<typename S::Add> add{"add"};
  OpVariants<typename S::CrossEntropy> cross_entropy{"cross_entropy"};
  OpVariants<typename S::EmbedRmsnormBackward> embed_rmsnorm_backward{"embed_rmsnorm_backward"};
  OpVariants<typename S::Cast> cast{"cast"};
  OpVariants<typename S::SumSquares> sum_squares{"sum_squares"};
  OpVariants<typename S::SgdStep> sgd_step{"sgd_step"};
  OpVariants<typename S::AdamwStep> adamw_step{"adamw_step"};
  const MemoryOps* memory = &host_memory();  // the backend's memory

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

 private:
  template <class Self, class F>
  static void visit(Self& self, F& f) {
    f(self.embedding_forward, &KernelSet<T, A>::embedding_forward);
    f(self.rmsnorm_forward, &KernelSet<T, A>::rmsnorm_forward);
    f(self.rmsnorm_backward, &KernelSet<T, A>::rmsnorm_backward);
    f(self.linear_forward, &KernelSet<T, A>::linear_forward);
    f(self.linear_backward, &KernelSet<T, A>::linear_backward);
    f(self.attention_forward, &KernelSet<T, A>::attention_forward);
    f(self.attention_backward, &KernelSet<T, A>::attention_backward);
    f(self.gelu_forward, &KernelSet<T, A>::gelu_forward);
    f(self.gelu_backward, &KernelSet<T, A>::gelu_backward);
    f(self.add, &KernelSet<T, A>::add);
    f(self.cross_entropy, &KernelSet<T, A>::cross_entropy);
    f(self.embed_rmsnorm_backward, &KernelSet<T, A>::embed_rmsnorm_backward);
    f(self.cast, &KernelSet<T, A>::cast);
    f(self.sum_squares, &KernelSet<T, A>::sum_squares);
    f(self.sgd_step, &KernelSet<T, A>::sgd_step);
    f(self.adamw_step, &KernelSet<T, A>::adamw_step);
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
