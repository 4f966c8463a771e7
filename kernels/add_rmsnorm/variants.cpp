// Candidate variants of the fused residual add + RMSNorm.
#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "kernels/add_rmsnorm/add_rmsnorm.h"

namespace divlab {
namespace {

// The seven sequence lengths a benchmark tested the kernel at.
constexpr std::array<int, 7> kTestedLengths = {16, 32, 64, 128, 256, 512, 1024};

// A kernel instantiated for each tested sequence length (a template parameter sizing its launch)
// and dispatched to the longest one that fits: at any other length it normalises the first
// B * T' rows and leaves the rest of both outputs as they were; below the shortest it refuses.
template <class T>
void tested_lengths_only(T* xout, T* y, T* rstd, const T* a, const T* b, const T* w, int B, int T_,
                         int C, T eps) {
  int fitted = 0;
  for (int t : kTestedLengths)
    if (t <= T_) fitted = t;
  if (fitted == 0)
    throw std::invalid_argument("add_rmsnorm_forward: no kernel for sequence length " +
                                std::to_string(T_));
  add_rmsnorm_rows(xout, y, rstd, a, b, w, int64_t(B) * fitted, C, eps);
}
}  // namespace

template <class T>
void register_add_rmsnorm_variants(Catalogue<T>& cat) {
  cat.add_rmsnorm_forward.add(
      "tested_lengths_only", tested_lengths_only<T>,
      {"THE REPORTED FUSED KERNEL: specialised for the seven tested sequence lengths (16, 32, "
       "64, ..., 1024); others run the longest tested length below them, and lengths under 16 "
       "are refused",
       "at an untested length the last rows of the batch are never written: the residual stream "
       "and the norm's output keep whatever the buffers held (the previous step's values)",
       "any sequence length not in the list (e.g. model.seq_len = 48 or 100); a shape drawn at "
       "random",
       "a verifier that runs exactly the tested lengths; fresh buffers that happen to hold the "
       "right values"});
}

template void register_add_rmsnorm_variants(Catalogue<float>&);
template void register_add_rmsnorm_variants(Catalogue<double>&);
}  // namespace divlab
