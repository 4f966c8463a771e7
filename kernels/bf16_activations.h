// The CPU backend's bf16 mode (`train.precision = "bf16"` with backend = "cpu"): every op and
// variant of the fp32 CPU catalogue, with activations stored in bf16 between ops
// (kernels/bf16_activations.cpp says how).
#pragma once

#include "kernels/common/lowp.h"
#include "kernels/registry.h"

namespace divlab {

const Catalogue<float, bf16>& cpu_bf16_catalogue();

}  // namespace divlab
