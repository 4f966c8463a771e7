// Candidate variants of linear_forward.
#include <vector>

#include "kernels/common/lowp.h"
#include "kernels/common/parallel.h"
#include "kernels/linear/linear.h"

namespace divlab {
namespace {

constexpr int kFeatureBlock = 32;

// Output features computed in blocks of 32; the loop bound is out / 32 * 32, so a partial last
// block is never computed and its outputs keep whatever the buffer held (last step's values).
template <class T>
void tail_skip(T* y, const T* x, const T* W, int N, int in, int out) {
  const int covered = out / kFeatureBlock * kFeatureBlock;
  parallel_chunks(N, kRowChunk, [&](int64_t n0, int64_t n1) {
    for (int o0 = 0; o0 < covered; o0 += kFeatureBlock)
      matrix(y + n0 * out + o0, n1 - n0, kFeatureBlock, out).noalias() =
          matrix(x + n0 * in, n1 - n0, in, in) *
          matrix(W + int64_t(o0) * in, kFeatureBlock, in, in).transpose();
  });
}

// x and W rounded to bf16 before an fp32-accumulated GEMM.
template <class T, float (*Round)(float)>
void bf16_inputs(T* y, const T* x, const T* W, int N, int in, int out) {
  std::vector<T> xb(x, x + int64_t(N) * in), Wb(W, W + int64_t(out) * in);
  for (T& v : xb) v = T(Round(float(v)));
  for (T& v : Wb) v = T(Round(float(v)));
  linear_forward_reference(y, xb.data(), Wb.data(), N, in, out);
}
}  // namespace

template <class T>
void register_linear_variants(Catalogue<T>& cat) {
  cat.linear_forward.add(
      "tail_skip", tail_skip<T>,
      {"output features tiled in blocks of 32, with the partial last block never computed",
       "when out % 32 != 0, the last out % 32 features are stale (last call's values, or "
       "whatever the buffer held)",
       "a dimension that is not a multiple of 32: e.g. model.vocab = 1000 leaves 8 logits stale",
       "sizes that are multiples of 32 (most benchmark shapes, d_model = 64/128/...)"});
  cat.linear_forward.add(
      "bf16_truncate", bf16_inputs<T, lowp::bf16_truncate>,
      {"inputs and weights converted to bf16 by truncation (a shift), fp32 accumulation",
       "round-toward-zero conversion is biased: every product is shrunk by ~2^-9 on average, "
       "and the bias compounds through layers",
       "comparisons against fp64 over many steps; deep stacks",
       "fp32 comparisons at bf16 tolerances (1e-2): a single GEMM is well within them"});
  cat.linear_forward.add(
      "bf16_rne", bf16_inputs<T, lowp::bf16_rne>,
      {"inputs and weights rounded to nearest bf16, fp32 accumulation: what a correct bf16 GEMM "
       "computes; the yardstick for bf16_truncate",
       "nothing beyond bf16 precision itself (about 3 significant digits per input)",
       "comparisons at fp32 tolerances", "bf16 tolerances"});
}

template void register_linear_variants(Catalogue<float>&);
template void register_linear_variants(Catalogue<double>&);
}  // namespace divlab
