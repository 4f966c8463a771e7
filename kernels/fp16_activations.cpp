#include "kernels/fp16_activations.h"

#include <memory>
#include <stdexcept>
#include <utility>

#include "kernels/common/parallel.h"
#include "kernels/op_spec.h"
#include "kernels/plugin_calls.h"
#include "kernels/storage_adapter.h"

namespace divlab {

namespace {
constexpr int64_t kNarrowChunk = 1 << 14;  // values per conversion task

// Adds the fp16 kernel fn (of type Fn16 in the ABI) to `to`.
template <Op op, class Fn16, class Ops>
void add(Ops& to, const std::string& name, void (*fn)(void), VariantDoc doc,
         const Fp16Conversions& conv) {
  const Kernel<Fn16> inner =
      plugin_kernel<Abi2<Fn16>, Fn16>(std::string(conv.memory->device) == "cuda", fn);
  auto [kernel, owner] = adapt_storage<op, typename Ops::Function, Fn16>(inner, conv, nullptr);
  to.add(name, kernel, std::move(doc), std::move(owner));
}

void host_narrow(void* /*stream*/, fp16* out, const float* in, int64_t n) {
  parallel_chunks(n, kNarrowChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = to_fp16(in[i]);
  });
}
void host_widen(void* /*stream*/, float* out, const fp16* in, int64_t n) {
  parallel_chunks(n, kNarrowChunk, [&](int64_t i0, int64_t i1) {
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
  DIVLAB_PLUGGABLE_OPS(DIVLAB_ADD_FP16)
#undef DIVLAB_ADD_FP16
  // NOLINTEND(bugprone-macro-parentheses)
  throw std::logic_error("fp16 activations: op " + op + " is not in the plug-in ABI");
}

}  // namespace divlab
