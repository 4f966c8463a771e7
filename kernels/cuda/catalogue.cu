// The CUDA catalogue, one per GEMM mode. GPU variants share their CPU namesakes' documentation
// (what is wrong, what exposes it, what masks it); their own summary says how the GPU does it.
#include <type_traits>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace divlab::cuda {

namespace {
Catalogue<float> build(GemmMode mode) {
  Catalogue<float> cat;
  cat.memory = &device_memory();
  register_embedding(cat);
  register_rmsnorm(cat);
  register_linear(cat, mode);
  register_attention(cat, mode);
  register_elementwise(cat);
  register_cross_entropy(cat);
  register_embed_rmsnorm_backward(cat);
  register_optimizer(cat);
  const Catalogue<float>& cpu = cpu_catalogue<float>();
  cat.for_each_op([&](auto& mine, auto) {
    cpu.for_each_op([&](const auto& cpu_ops, auto) {
      if constexpr (std::is_same_v<std::decay_t<decltype(cpu_ops)>, std::decay_t<decltype(mine)>>) {
        if (cpu_ops.op != mine.op) return;
        for (auto& e : mine.entries)
          if (const auto* twin = cpu_ops.find(e.name)) {
            e.doc.wrong = twin->doc.wrong;
            e.doc.exposed_by = twin->doc.exposed_by;
            e.doc.masked_by = twin->doc.masked_by;
            e.doc.benign = twin->doc.benign;
          }
      }
    });
  });
  return cat;
}
}  // namespace

Catalogue<float>& mutable_catalogue(GemmMode mode) {
  static Catalogue<float> fp32 = build(GemmMode::Fp32);
  static Catalogue<float> bf16 = build(GemmMode::Bf16);
  return mode == GemmMode::Fp32 ? fp32 : bf16;
}

const Catalogue<float>& catalogue(GemmMode mode) {
  return mutable_catalogue(mode);
}

}  // namespace divlab::cuda
