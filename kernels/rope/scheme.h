// How one RoPE implementation pairs and rotates: the reference's choices, or a variant's
// mistakes. Shared by the CPU kernels (rope.h) and the GPU's (cuda.cu).
#pragma once

namespace divlab {

struct RopeScheme {
  bool interleaved = false;  // pairs (2i, 2i + 1) (GPT-J, Meta's complex form) instead of halves
  int position_offset = 0;   // the position t + offset is used
  double fixed_base = 0;     // nonzero: this base, whatever the call passes
};

}  // namespace divlab
