// bf16 activation storage around fp32 kernels.
//
// The CPU backend's bf16 mode (`train.precision = "bf16"` with backend = "cpu") is every op and
// variant of the fp32 CPU catalogue, adapted: each runs on widened fp32 copies of its bf16
// inputs, and its activation outputs are rounded to nearest even bf16. The same adapters bring
// fp32 plug-in variants (the plug-in ABI is fp32) into the GPU's bf16 mode, whose own kernels
// read and write bf16 natively (kernels/bf16_activations.cpp says how).
#pragma once

#include <string>

#include "kernels/common/lowp.h"
#include "kernels/memory.h"
#include "kernels/registry.h"

namespace divlab {

const Catalogue<float, bf16>& cpu_bf16_catalogue();
Catalogue<float, bf16>& mutable_cpu_bf16_catalogue();  // for plug-in variants

// Which backend's adapters (each has its own trampolines and conversions).
enum class Bf16Set { Cpu = 0, Cuda = 1 };
// How a backend converts between fp32 scratch and bf16 activations, in its own memory.
struct Bf16Conversions {
  const MemoryOps* memory = nullptr;
  void (*widen)(float* out, const bf16* in, int64_t n) = nullptr;
  void (*round)(bf16* out, const float* in, int64_t n) = nullptr;  // to nearest even
};
void set_bf16_conversions(Bf16Set set, const Bf16Conversions& c);

// Adds variant `name` of `op` from `from` to `to`, adapted with `set`'s conversions (ops without
// activation arguments take the function as is); nothing if `to` has it already. Throws
// std::logic_error for an unknown variant or when an op's 32 trampolines are taken.
void adopt_fp32_variant(Catalogue<float, bf16>& to, const Catalogue<float>& from,
                        const std::string& op, const std::string& name, Bf16Set set);
// Removes an adopted variant and frees its trampoline.
void drop_adopted_variant(Catalogue<float, bf16>& to, const std::string& op,
                          const std::string& name, Bf16Set set);

}  // namespace divlab
