// How one RoPE implementation pairs and rotates: the reference's choices, or a variant's
// mistakes. Shared by the CPU kernels (rope.h) and the GPU's (cuda.cu).
#pragma once

namespace divlab {

struct RopeScheme {
  bool interleaved = false;  // pairs (2i, 2i + 1) (GPT-J, Meta's complex form) instead of halves
  int position_offset = 0;   // the position t + offset is used
  double fixed_base = 0;     // nonzero: this base, whatever the call passes
};

// The reference's scheme and the variants' (their names and docs: kernels/rope/variants.cpp);
// kernels take a pointer to one as a template argument.
inline constexpr RopeScheme kRopeReference{};
inline constexpr RopeScheme kRopeBase10000{false, 0, 10000.0};
inline constexpr RopeScheme kRopeInterleaved{true, 0, 0.0};
inline constexpr RopeScheme kRopePositionPlusOne{false, 1, 0.0};

}  // namespace divlab
