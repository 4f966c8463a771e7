// The CPU's bf16 mode: the fp32 catalogue with its activations stored in bf16.
//
// Every variant of every op runs its own fp32 kernel on widened copies of its bf16 inputs, and
// its activation outputs are rounded to nearest even bf16 on the way out: exactly what storing
// activations in bf16 does to fp32 arithmetic, which is what the GPU's bf16 mode stores (its
// GEMMs multiply the same bf16 values, accumulating in fp32). Slow (a conversion around every
// op), but it lets a laptop show what bf16 activation storage does and does not do to a run,
// and it runs the bf16 mode's model, shadow captures and NaN attribution where there is no GPU.
//
// An adopted entry is the storage adapter (kernels/storage_adapter.h) bound to the fp32 kernel it
// wraps and its backend's conversions. The same adapters bring the fp32 plug-in ABI's variants
// into both bf16 modes (CPU and GPU, each with its own conversions).
#include "kernels/bf16_activations.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/common/parallel.h"
#include "kernels/op_spec.h"
#include "kernels/storage_adapter.h"

namespace divlab {

namespace {
constexpr int64_t kChunk = 1 << 14;

template <Op op, class From, class To>
void adopt(const From& from, To& to, const std::string& name, const Bf16Conversions& conv) {
  if (to.find(name)) return;  // adopted already
  const auto* e = from.find(name);
  if (!e) throw std::logic_error("bf16 activations: no variant " + name + " of " + from.op);
  if constexpr (op == Op::cast) {  // fp32 -> bf16 is the bf16 mode's own kernel
    throw std::logic_error("bf16 activations: op cast cannot be adopted");
  } else {
    auto [kernel, owner] =
        adapt_storage<op, typename To::Function, typename From::Function>(e->fn, conv, e->owner);
    to.add(e->name, kernel, e->doc, std::move(owner));
  }
}

void host_widen(void* /*stream*/, float* out, const bf16* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = widen(in[i]);
  });
}
void host_round(void* /*stream*/, bf16* out, const float* in, int64_t n) {
  parallel_chunks(n, kChunk, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = to_bf16(in[i]);
  });
}
void host_cast(const OpContext& ctx, bf16* out, const float* in, int64_t n) {
  host_round(ctx.stream, out, in, n);
}

Catalogue<float, bf16> build_cpu() {
  const Catalogue<float>& f = cpu_catalogue<float>();
  Catalogue<float, bf16> c;
  c.memory = f.memory;
  f.for_each_op([&](const auto& ops, auto) {
    if (ops.op == "cast") return;
    for (const auto& e : ops.entries)
      adopt_fp32_variant(c, f, ops.op, e.name, host_bf16_conversions());
  });
  // The ops' descriptions, and the partner rules with the variants they pair.
  f.for_each_op([&](const auto& ops, auto) {
    c.for_each_op([&](auto& mine, auto) {
      if (mine.op == ops.op) mine.partners = ops.partners, mine.what = ops.what;
    });
  });
  c.cast.what = f.cast.what;
  c.cast.add("reference", host_cast, {"round to nearest even bf16", "", "", ""});
  return c;
}
}  // namespace

const Bf16Conversions& host_bf16_conversions() {
  static const Bf16Conversions c{&host_memory(), host_widen, host_round};
  return c;
}

void adopt_fp32_variant(Catalogue<float, bf16>& to, const Catalogue<float>& from,
                        const std::string& op, const std::string& name,
                        const Bf16Conversions& conv) {
// Op names are pasted into member names, never expressions.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define DIVLAB_ADOPT_OP(op_name, Signature) \
  if (op == #op_name) return adopt<Op::op_name>(from.op_name, to.op_name, name, conv);
  DIVLAB_OPS(DIVLAB_ADOPT_OP)
#undef DIVLAB_ADOPT_OP
  // NOLINTEND(bugprone-macro-parentheses)
  throw std::logic_error("bf16 activations: op " + op + " cannot be adopted");
}

void drop_adopted_variant(Catalogue<float, bf16>& to, const std::string& op,
                          const std::string& name) {
  to.for_each_op([&](auto& ops, auto) {
    if (ops.op == op) ops.remove(name);
  });
}

Catalogue<float, bf16>& mutable_cpu_bf16_catalogue() {
  // Built on first use from the fp32 catalogue's built-ins; plug-ins come and go through
  // adopt_fp32_variant / drop_adopted_variant (kernels/plugins.cpp).
  static Catalogue<float, bf16> cat = build_cpu();
  return cat;
}

const Catalogue<float, bf16>& cpu_bf16_catalogue() {
  return mutable_cpu_bf16_catalogue();
}

}  // namespace divlab
