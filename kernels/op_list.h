// Every op, declared once: X(name, Signature), Signature an alias in OpSignatures (ops.h).
// KernelSet's members, the catalogue's variant lists, their visitor and the profiler's wrappers
// are generated from this list, so they cannot disagree; adding an op means its signature in
// ops.h, its directory, and one line here.
#pragma once

#include <string_view>

#define DIVLAB_OPS(X)     \
  DIVLAB_PLUGGABLE_OPS(X) \
  X(cast, Cast)           \
  X(sum_squares, SumSquares)
// The ops plug-ins may replace (each has its function types in kernels/plugin_abi.h): the model's
// ops, the data-parallel gradient reduction (train.ranks > 1) and the optimizer's updates, listed
// first; the two after them are the bf16 weight copy and the gradient norm's reduction.
#define DIVLAB_PLUGGABLE_OPS(X) \
  DIVLAB_MODEL_OPS(X)           \
  X(grad_reduce, GradReduce)    \
  X(sgd_step, SgdStep)          \
  X(adamw_step, AdamwStep)
// The model's ops: those a forward and backward call, which shadow mode can tap.
#define DIVLAB_MODEL_OPS(X)                       \
  X(embedding_forward, EmbeddingForward)          \
  X(rmsnorm_forward, RmsnormForward)              \
  X(rmsnorm_backward, RmsnormBackward)            \
  X(linear_forward, LinearForward)                \
  X(linear_backward, LinearBackward)              \
  X(attention_forward, AttentionForward)          \
  X(attention_backward, AttentionBackward)        \
  X(gelu_forward, GeluForward)                    \
  X(gelu_backward, GeluBackward)                  \
  X(add, Add)                                     \
  X(cross_entropy, CrossEntropy)                  \
  X(embed_rmsnorm_backward, EmbedRmsnormBackward) \
  X(rope_forward, RopeForward)                    \
  X(rope_backward, RopeBackward)                  \
  X(gqa_forward, GqaForward)                      \
  X(gqa_backward, GqaBackward)                    \
  X(swiglu_forward, SwigluForward)                \
  X(swiglu_backward, SwigluBackward)              \
  X(softcap_forward, SoftcapForward)              \
  X(softcap_backward, SoftcapBackward)            \
  X(add_rmsnorm_forward, AddRmsnormForward)

// The op directories (kernels/<dir>/), each registering its ops' references with
// register_<dir>(catalogue): both devices' catalogues expand this list, so a new directory is
// registered on the CPU and the GPU alike (embedding_forward's is embedding, the two rmsnorm ops'
// rmsnorm, the optimizer's three ops' optimizer, ...).
#define DIVLAB_OP_DIRECTORIES(X) \
  X(embedding)                   \
  X(rmsnorm)                     \
  X(linear)                      \
  X(attention)                   \
  X(elementwise)                 \
  X(cross_entropy)               \
  X(embed_rmsnorm_backward)      \
  X(optimizer)                   \
  X(rope)                        \
  X(gqa)                         \
  X(swiglu)                      \
  X(softcap)                     \
  X(add_rmsnorm)                 \
  X(grad_reduce)

namespace divlab {

// One enumerator per op, in list order.
enum class Op : int {
#define DIVLAB_OP_ENUMERATOR(name, Signature) name,
  DIVLAB_OPS(DIVLAB_OP_ENUMERATOR)
#undef DIVLAB_OP_ENUMERATOR
      count
};
constexpr int kOpCount = static_cast<int>(Op::count);
// Each op's name, as configs and catalogues spell it.
constexpr const char* op_name(Op op) {
  constexpr const char* names[] = {
#define DIVLAB_OP_NAME(name, Signature) #name,
      DIVLAB_OPS(DIVLAB_OP_NAME)
#undef DIVLAB_OP_NAME
  };
  return names[static_cast<int>(op)];
}
// The op spelled `name`, if there is one.
constexpr bool parse_op(std::string_view name, Op* op) {
  for (int i = 0; i < kOpCount; ++i)
    if (name == op_name(static_cast<Op>(i))) return *op = static_cast<Op>(i), true;
  return false;
}
// How many ops each group has; the groups are prefixes of the op list.
#define DIVLAB_COUNT_OP(name, Signature) ++n;
constexpr int kModelOpCount = [] {
  int n = 0;
  DIVLAB_MODEL_OPS(DIVLAB_COUNT_OP)
  return n;
}();
constexpr int kPluggableOpCount = [] {
  int n = 0;
  DIVLAB_PLUGGABLE_OPS(DIVLAB_COUNT_OP)
  return n;
}();
#undef DIVLAB_COUNT_OP
// Whether the model's forward or backward calls the op (DIVLAB_MODEL_OPS).
constexpr bool model_op(Op op) {
  return static_cast<int>(op) < kModelOpCount;
}
// Whether a plug-in may replace the op (DIVLAB_PLUGGABLE_OPS).
constexpr bool pluggable(Op op) {
  return static_cast<int>(op) < kPluggableOpCount;
}
// Beyond what is generated from this list, each op has: its directory (kernels/<op>/: reference,
// variants, CUDA kernels, registered by register_<dir>, the directory named once in
// DIVLAB_OP_DIRECTORIES above), an OpSpec (kernels/op_spec.h), a case in
// kernels/op_cases.cpp (its inputs and call: a switch, so a missing case is a -Wswitch error),
// and, where plug-ins may replace it, its ABI function types (kernels/plugin_abi.h, tied to its
// signature by static_asserts generated in kernels/plugin_calls.h).
static_assert(kOpCount == 26, "an op was added: give it what the comment above lists");
static_assert(kModelOpCount == 21 && kPluggableOpCount == 24 && !pluggable(Op::cast) &&
              !pluggable(Op::sum_squares) && pluggable(Op::grad_reduce) &&
              pluggable(Op::adamw_step) && !model_op(Op::grad_reduce));

}  // namespace divlab
