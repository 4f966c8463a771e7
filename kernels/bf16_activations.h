// bf16 activation storage around fp32 kernels.
//
// The CPU backend's bf16 mode (`train.precision = "bf16"` with backend = "cpu") is every op and
// variant of the fp32 CPU catalogue, adapted: each runs on widened fp32 copies of its bf16
// inputs, and its activation outputs are rounded to nearest even bf16. The same adapters bring
// fp32 plug-in variants (the plug-in ABI is fp32) into the GPU's bf16 mode, whose own kernels
// read and write bf16 natively. Each adapted entry is the op's adapter bound to its fp32 kernel
// (Kernel::state), so adapters nest under taps and profilers like any kernel.
#pragma once

#include <string>

#include "kernels/common/lowp.h"
#include "kernels/memory.h"
#include "kernels/registry.h"
#include "kernels/storage_adapter.h"

namespace divlab {

const Catalogue<float, bf16>& cpu_bf16_catalogue();
Catalogue<float, bf16>& mutable_cpu_bf16_catalogue();  // for plug-in variants

// How a backend converts between fp32 scratch and bf16 activations, in its own memory, on the
// calling op's stream.
// The bf16 mode (arrays in bf16) running fp32 kernels: widen, then round to nearest even.
using Bf16Conversions = StorageConversions<bf16, float>;
const Bf16Conversions& host_bf16_conversions();

// Adds variant `name` of `op` from `from` to `to`, adapted with `conv` (ops without activation
// arguments take the kernel as is); nothing if `to` has it already. Each adapted entry owns its
// binding (the fp32 kernel and the conversions), so any number of variants can be adapted.
// Throws std::logic_error for an unknown op or variant.
void adopt_fp32_variant(Catalogue<float, bf16>& to, const Catalogue<float>& from,
                        const std::string& op, const std::string& name,
                        const Bf16Conversions& conv);
// Removes an adopted variant (its binding goes with it).
void drop_adopted_variant(Catalogue<float, bf16>& to, const std::string& op,
                          const std::string& name);

}  // namespace divlab
