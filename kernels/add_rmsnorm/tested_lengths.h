// The report's fused residual add + RMSNorm kernel (variant tested_lengths_only, on the CPU and
// the GPU): instantiated for the seven sequence lengths a benchmark tested it at and dispatched
// to the longest one that fits, so at any other length it covers only some of the batch's rows.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace divlab {

constexpr std::array<int, 7> kTestedLengths = {16, 32, 64, 128, 256, 512, 1024};

// The rows such a kernel normalises for B sequences of length T: B times the longest tested
// length not above T. Below the shortest it has no kernel: throws std::invalid_argument.
inline int64_t tested_length_rows(int B, int T) {
  int fitted = 0;
  for (int t : kTestedLengths)
    if (t <= T) fitted = t;
  if (fitted == 0)
    throw std::invalid_argument("add_rmsnorm_forward: no kernel for sequence length " +
                                std::to_string(T));
  return int64_t(B) * fitted;
}

}  // namespace divlab
