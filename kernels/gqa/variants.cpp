// Candidate variants of the grouped-query key/value sharing.
#include "kernels/gqa/gqa.h"

namespace divlab {
namespace {

// Query head h's key/value gradient summed into head h % NKV: the interleaved grouping of
// repeat_interleave where the forward used the blocked one (or the reverse): the two agree only
// when every head is its own group or all share one.
template <class T>
void interleaved_groups(T* dx, const T* dqkv, int N, int NH, int NKV, int HD) {
  gqa_backward_with(dx, dqkv, N, NH, NKV, HD, [&](int h) { return h % NKV; });
}
}  // namespace

template <class T>
void register_gqa_variants(Catalogue<T>& cat) {
  cat.gqa_backward.add(
      "interleaved_groups", interleaved_groups<T>,
      {"key/value gradients summed over the interleaved group (query heads h with h % NKV = j) "
       "instead of the forward's blocked one (h / (NH / NKV) = j)",
       "each key/value head receives the gradients of query heads that never read it: the "
       "gradient of every k and v projection row is wrong",
       "1 < NKV < NH (grouped-query attention proper) with more than one query head per group",
       "multi-head (NKV = NH) and multi-query (NKV = 1) attention, where both groupings agree; "
       "verifiers that test only those"});
}

template void register_gqa_variants(Catalogue<float>&);
template void register_gqa_variants(Catalogue<double>&);
}  // namespace divlab
