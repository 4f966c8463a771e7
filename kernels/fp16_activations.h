// fp16 kernels in the fp32 mode.
//
// divlab has no fp16 mode. A plug-in kernel written for IEEE half activations (ABI 2, dtype
// fp16: kernels/plugin_abi.h) runs in the fp32 mode through an adapter: every activation array
// it reads is handed over as an fp16 copy (rounded to nearest even), every activation array it
// writes starts as the fp16 copy of its current contents and is widened back once the kernel
// is done. That is what storing those activations in fp16 would do around the op; parameters,
// the residual stream, rstd and the losses stay fp32 on both sides (the op's float arguments).
// The mirror image of kernels/bf16_activations.h, which runs fp32 kernels in a bf16 mode.
#pragma once

#include <string>

#include "kernels/common/lowp.h"
#include "kernels/memory.h"
#include "kernels/registry.h"
#include "kernels/storage_adapter.h"

namespace divlab {

// How a backend converts between fp32 activations and fp16 copies, in its own memory, on the
// calling op's stream.
// The fp32 mode running fp16 kernels: narrow (to nearest even), then widen.
using Fp16Conversions = StorageConversions<float, fp16>;
const Fp16Conversions& host_fp16_conversions();

// Adds variant `name` of `op` to `to`: `fn`, an ABI 2 kernel of the op's fp16 function type
// (divlab2_<op>_fp16), behind the adapter. Throws std::logic_error for an op the ABI lacks.
void add_fp16_plugin_variant(Catalogue<float>& to, const std::string& op, const std::string& name,
                             void (*fn)(void), VariantDoc doc, const Fp16Conversions& conv);

}  // namespace divlab
