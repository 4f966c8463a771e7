// A benign control for every op: `fp64_accum`, the op's fp64 reference run on widened copies of
// its inputs, every output rounded to fp32 once. The same math as the reference, more accurately
// rounded, so its gap from the reference is the noise floor of fp32 rounding alone: with it in a
// grid, every op's candidates are judged against a control instead of against zero.
#pragma once

#include "kernels/registry.h"

namespace divlab {

// Adds `fp64_accum` to every op of the op list that has an op spec and none yet, except add, cast
// and embedding_forward (one rounding per value, so fp64 gives the reference's own bits). In the
// fp64 catalogue the variant is the reference itself, so fp64 runs name the same variants as fp32
// ones. On a device (the GPU catalogues, both modes) the control copies its arrays to the host,
// runs the CPU's fp64 reference there and copies the outputs back: exact, and slow (a control for
// grids at small sizes, not for speed).
template <class T, class A>
void register_fp64_controls(Catalogue<T, A>& cat);

// The documentation these controls carry (an op's own hand-written `fp64_accum`, registered first,
// keeps its own).
const VariantDoc& fp64_control_doc();

}  // namespace divlab
